"""Randomised calls of every public entry point (flash_attn_func and its packed / varlen forms, attention,
choose_backend, scaled_dot_product_attention): random shapes (empty ones included), dtypes, strides, options,
None and wrong types, by position or by keyword, defaults given or left out; on the CPU here, on CUDA from
test_cuda.py.

Each trial builds a valid call, then with some probability breaks it in one way that is invalid whatever the rest
of the call is. A valid call must succeed and match the float64 pure-torch reference (fa_reference.py, or torch's
own math SDPA) in out, lse and the gradients of every input; a broken one must raise ValueError, TypeError or
NotImplementedError whose message starts with the name of an argument the break involves. Anything else (another
exception, a silent acceptance, a wrong answer) fails with the trial's description. Fixed seed, bounded trials.
"""

from __future__ import annotations

import inspect
import random
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F

import flashattn
from fa_reference import assert_close, attention_ref, f32, varlen_ref

SEED = 20261130
CPU_TRIALS = 240
ERRORS = (ValueError, TypeError, NotImplementedError)

FLASH_FUNCS = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
               "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"]
PUBLIC = FLASH_FUNCS + ["attention", "choose_backend", "scaled_dot_product_attention"]
# The packed forms split their tensors into q, k, v (and pass one cu_seqlens / max_seqlen as both): errors about
# the parts name the parts.
ALIASES = {"qkv": {"q", "k", "v"}, "kv": {"k", "v"}, "cu_seqlens": {"cu_seqlens_q", "cu_seqlens_k"},
           "max_seqlen": {"max_seqlen_q", "max_seqlen_k"}, "query": {"q"}, "key": {"k"}, "value": {"v"}}
BACKEND_NAMES = {"cpu_reference", "cpu_flash", "cuda_sm80", "cuda_sm90"}


# ---- tensors with random layouts -----------------------------------------------------------------------------------


@dataclass
class Input:
    """A tensor argument: `base` is the leaf (gets the gradient), `view(base)` is what the call receives."""
    base: torch.Tensor
    view: Callable[[torch.Tensor], torch.Tensor]
    layout: str

    def value(self, base=None):
        return self.view(self.base if base is None else base)


def make_input(rng: random.Random, shape: Sequence[int], dtype, device, layouts) -> Input:
    shape = list(shape)
    layout = rng.choice(layouts)
    if layout == "permuted" and len(shape) > 2:  # the leading dims in another storage order; last stride 1
        perm = list(range(len(shape) - 1))
        rng.shuffle(perm)
        inv = [perm.index(i) for i in range(len(perm))] + [len(shape) - 1]
        base = torch.randn([shape[p] for p in perm] + shape[-1:], dtype=dtype, device=device)
        return Input(base, lambda b: b.permute(inv), layout)
    if layout == "sliced":  # a window into a larger tensor: every stride and the offset differ
        pads = [rng.randint(0, 2) for _ in shape]
        offs = [rng.randint(0, p) for p in pads]
        base = torch.randn([s + p for s, p in zip(shape, pads)], dtype=dtype, device=device)
        idx = tuple(slice(o, o + s) for o, s in zip(offs, shape))
        return Input(base, lambda b: b[idx], layout)
    if layout == "strided_last":  # a head dim with stride 2 (the entry points copy it)
        base = torch.randn(shape[:-1] + [2 * shape[-1]], dtype=dtype, device=device)
        return Input(base, lambda b: b[..., ::2], layout)
    return Input(torch.randn(shape, dtype=dtype, device=device), lambda b: b, "contiguous")


def cu(lengths, device):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


# ---- one trial -----------------------------------------------------------------------------------------------------


@dataclass
class Trial:
    fn: str
    call: Dict[str, object]                       # every argument by name
    inputs: Dict[str, Input]                      # the tensor arguments with gradients
    reference: Optional[Callable] = None          # reference(values by name, dtype) -> (out, lse or None)
    returns_lse: bool = False
    grad: bool = False
    dtype: torch.dtype = torch.float32
    broken: Optional[str] = None                  # what was broken, None: a valid call
    positional: bool = False                      # pass every argument that can be positional by position
    omit_defaults: bool = False                   # leave out the arguments whose value is the default
    blame: set = field(default_factory=set)       # names an error may start with
    notes: List[str] = field(default_factory=list)

    def describe(self):
        def show(v):
            if isinstance(v, torch.Tensor):
                return f"Tensor{list(v.shape)}:{str(v.dtype).replace('torch.', '')}:{v.device.type}:stride{v.stride()}"
            return repr(v)
        args = ", ".join(f"{k}={show(v)}" for k, v in self.call.items())
        how = ("positional" if self.positional else "keywords") + (", defaults left out" if self.omit_defaults else "")
        return f"{self.fn}({args}) broken={self.broken} ({how}) {' '.join(self.notes)}"

    def invoke(self):
        fn = getattr(flashattn, self.fn)
        params = inspect.signature(fn).parameters
        call = dict(self.call)
        if self.omit_defaults:
            for name, value in self.call.items():
                default = params[name].default
                if default is not inspect.Parameter.empty and not isinstance(value, torch.Tensor) and \
                        type(value) is type(default) and value == default:
                    del call[name]
        if not self.positional:
            return fn(**call)
        bound = inspect.signature(fn).bind(**call)
        return fn(*bound.args, **bound.kwargs)


class Gen:
    def __init__(self, rng: random.Random, device: str, gpu_like: Optional[bool] = None):
        """gpu_like: the choices of a CUDA run (float16 / bfloat16, automatic dispatch) whatever the device."""
        self.rng, self.device = rng, device
        self.on_cuda = torch.device(device).type == "cuda"
        self.cuda = self.on_cuda if gpu_like is None else gpu_like
        self.dtypes = [torch.float16, torch.bfloat16] if self.cuda else \
            [torch.float16, torch.bfloat16, torch.float32, torch.float64]
        self.layouts = ["contiguous", "contiguous", "permuted", "sliced", "strided_last"]

    def pick(self, *xs):
        return self.rng.choice(xs)

    def dims(self):
        r = self.rng
        heads_kv = r.choice([1, 2])
        d = r.choice([1, 3, 8, 16, 16, 32, 64, 128, 256])
        return dict(heads_q=heads_kv * r.choice([1, 1, 2, 3]), heads_kv=heads_kv, d=d,
                    d_v=r.choice([d, d, 8, 5]))

    def seq(self):
        return self.rng.choice([0, 1, 2, 5, 9, 17, 40, 70])

    def scale(self, d):
        # moderate logits (see test_arguments.py): a factor of 1/sqrt(d) in [0.3, 1.7]
        return self.pick(None, None, round(self.pick(0.3, 0.8, 1.7) * d ** -0.5, 4))

    def backend(self):
        return "auto" if self.cuda else self.pick("auto", "auto", "cpu_reference", "cpu_flash")

    def tensor(self, shape, dtype):
        return make_input(self.rng, shape, dtype, self.device, self.layouts)

    # -- valid calls, one builder per public function --

    def trial(self, fn: str) -> Trial:
        dtype = self.pick(*self.dtypes)
        if fn == "scaled_dot_product_attention":
            t = self.sdpa(dtype)
        elif fn in ("attention", "choose_backend"):
            t = self.library(fn, dtype)
        else:
            t = self.flash(fn, dtype)
        t.dtype = dtype
        return t

    def flash(self, fn: str, dtype) -> Trial:
        varlen = "varlen" in fn
        dm = self.dims()
        hq, hkv, d, dv = dm["heads_q"], dm["heads_kv"], dm["d"], dm["d_v"]
        if "qkvpacked" in fn:
            hkv, dv = hq, d
        elif "kvpacked" in fn:
            dv = d
        causal = self.pick(False, True)
        window = (self.pick(-1, -1, -1, -7, 0, 2, 9, 2**40), self.pick(-1, -1, -1, -3, 0, 1, 4, 2**40))
        softcap = self.pick(0.0, 0.0, 0.0, -2.0, 1.5, 6.0)
        scale = self.scale(d)
        options = dict(dropout_p=self.pick(0.0, 0), softmax_scale=scale, causal=causal, window_size=window,
                       softcap=softcap, alibi_slopes=None, deterministic=self.pick(False, True),
                       return_attn_probs=self.pick(False, True), backend=self.backend(),
                       num_threads=self.pick(0, 0, 1, 2, 3))
        ref_kw = dict(causal=causal, window=window, softcap=softcap, scale=scale)
        if varlen:
            batch = self.pick(0, 1, 1, 2, 3)
            lq = [self.seq() for _ in range(batch)]
            lk = list(lq) if "qkvpacked" in fn else [self.seq() for _ in range(batch)]
            tq, tk = sum(lq), sum(lk)
            cq, ck = cu(lq, self.device), cu(lk, self.device)
            mq = max(lq, default=0) + self.pick(0, 0, 3)
            mk = max(lk, default=0) + self.pick(0, 0, 2)
            if self.rng.random() < 0.15:
                mq = mk = 0  # 0: derived from cu_seqlens
            if "qkvpacked" in fn:
                mk = mq
            cql, ckl = cq.tolist(), ck.tolist()
            ref = lambda q, k, v, dtype: varlen_ref(q, k, v, cql, ckl, dtype=dtype, **ref_kw)  # noqa: E731
            shapes = dict(q=(tq, hq, d), k=(tk, hkv, d), v=(tk, hkv, dv))
            layout = "varlen"
        else:
            b, sq = self.pick(0, 1, 1, 2, 3), self.seq()
            sk = sq if "qkvpacked" in fn else self.seq()
            ref = lambda q, k, v, dtype: attention_ref(q, k, v, dtype=dtype, **ref_kw)  # noqa: E731
            shapes = dict(q=(b, sq, hq, d), k=(b, sk, hkv, d), v=(b, sk, hkv, dv))
            layout = "padded"
        # ALiBi slopes in a quarter of the calls each per head and per sequence; the reference adds the same bias.
        kind = self.pick(None, None, "head", "batch")
        if kind is not None:
            rows = batch if varlen else b
            slopes = (torch.rand(rows, hq) if kind == "batch" else torch.rand(hq)) * 0.5
            options["alibi_slopes"] = ref_kw["alibi"] = slopes.to(self.device)
        call: Dict[str, object] = {}
        inputs: Dict[str, Input] = {}
        if "qkvpacked" in fn:
            s = shapes["q"]
            inputs["qkv"] = self.tensor(s[:-2] + (3,) + s[-2:], dtype)
            split = 1 if varlen else 2
            reference = lambda vals, dt: ref(*vals["qkv"].unbind(split), dt)  # noqa: E731
        elif "kvpacked" in fn:
            s = shapes["k"]
            inputs["q"] = self.tensor(shapes["q"], dtype)
            inputs["kv"] = self.tensor(s[:-2] + (2,) + s[-2:], dtype)
            split = 1 if varlen else 2
            reference = lambda vals, dt: ref(vals["q"], *vals["kv"].unbind(split), dt)  # noqa: E731
        else:
            for name in "qkv":
                inputs[name] = self.tensor(shapes[name], dtype)
            reference = lambda vals, dt: ref(vals["q"], vals["k"], vals["v"], dt)  # noqa: E731
        call.update({n: i.value() for n, i in inputs.items()})
        if varlen:
            if "qkvpacked" in fn:
                call.update(cu_seqlens=cq, max_seqlen=mq)
            else:
                call.update(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk)
        call.update(options)
        if fn == "flash_attn_varlen_func":
            call["block_table"] = None
        t = Trial(fn, call, inputs, reference, returns_lse=options["return_attn_probs"], grad=self.rng.random() < 0.6,
                  notes=[layout])
        return t

    def library(self, fn: str, dtype) -> Trial:
        varlen = self.rng.random() < 0.4
        dm = self.dims()
        hq, hkv, d, dv = dm["heads_q"], dm["heads_kv"], dm["d"], dm["d_v"]
        causal = self.pick(False, True)
        wl, wr = self.pick(-1, -1, 0, 2, 9, 2**40), self.pick(-1, -1, 0, 1, 4)
        softcap = self.pick(0.0, 0.0, 1.5, 6.0)
        scale = self.scale(d)
        call: Dict[str, object] = {}
        ref_kw = dict(causal=causal, window=(wl, wr), softcap=softcap, scale=scale)
        if varlen:
            batch = self.pick(0, 1, 2, 3)
            lq, lk = [self.seq() for _ in range(batch)], [self.seq() for _ in range(batch)]
            cq, ck = cu(lq, self.device), cu(lk, self.device)
            cql, ckl = cq.tolist(), ck.tolist()
            shapes = dict(q=(sum(lq), hq, d), k=(sum(lk), hkv, d), v=(sum(lk), hkv, dv))
            call.update(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=self.pick(0, max(lq, default=0)),
                        max_seqlen_k=self.pick(0, max(lk, default=0) + 1))
            ref = lambda q, k, v, dtype: varlen_ref(q, k, v, cql, ckl, dtype=dtype, **ref_kw)  # noqa: E731
        else:
            b = self.pick(0, 1, 2)
            sq, sk = self.seq(), self.seq()
            shapes = dict(q=(b, sq, hq, d), k=(b, sk, hkv, d), v=(b, sk, hkv, dv))
            ref = lambda q, k, v, dtype: attention_ref(q, k, v, dtype=dtype, **ref_kw)  # noqa: E731
        inputs = {n: self.tensor(shapes[n], dtype) for n in "qkv"}
        call = {**{n: i.value() for n, i in inputs.items()}, **call}
        call.update(softmax_scale=scale, causal=causal, window_left=wl, window_right=wr, softcap=softcap,
                    deterministic=self.pick(False, True), backend=self.backend())
        if fn == "attention":
            call["num_threads"] = self.pick(0, 1, 2)
            return Trial(fn, call, inputs, lambda vals, dt: ref(vals["q"], vals["k"], vals["v"], dt),
                         returns_lse=True, grad=self.rng.random() < 0.5, notes=["varlen" if varlen else "padded"])
        call["backward"] = self.pick(False, True)
        return Trial(fn, call, inputs, None, notes=["varlen" if varlen else "padded"])

    def sdpa(self, dtype) -> Trial:
        rank = self.pick(3, 4, 4, 4, 5)
        dm = self.dims()
        hq, h, e, ev = dm["heads_q"], dm["heads_kv"], dm["d"], dm["d_v"]
        gqa = hq != h or self.rng.random() < 0.3
        if rank == 3:
            hq = h = 1
        lead = {3: (self.pick(0, 1, 2),), 4: (self.pick(0, 1, 2),), 5: (2, self.pick(1, 2))}[rank]
        heads = lambda n: () if rank == 3 else (n,)  # noqa: E731
        L, S = self.seq(), self.seq()
        inputs = dict(query=self.tensor(lead + heads(hq) + (L, e), dtype),
                      key=self.tensor(lead + heads(h) + (S, e), dtype),
                      value=self.tensor(lead + heads(h) + (S, ev), dtype))
        is_causal, scale = self.pick(False, True), self.scale(e)
        call = {n: i.value() for n, i in inputs.items()}
        call.update(attn_mask=None, dropout_p=0.0, is_causal=is_causal, scale=scale, enable_gqa=gqa,
                    backend=self.backend(), num_threads=self.pick(0, 1))

        def reference(vals, dt):
            q, k, v = (vals[n].to(dt) if dt else vals[n] for n in ("query", "key", "value"))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa and rank > 3,
                                                     scale=f32(e ** -0.5 if scale is None else scale))
            return out, None
        return Trial("scaled_dot_product_attention", call, inputs, reference, grad=self.rng.random() < 0.6)

    # -- breaking a valid call --

    def breaks(self, t: Trial) -> List[Callable[[], Optional[set]]]:
        """Ways to break t, each a function that changes t.call and returns the blame set (None: does not apply)."""
        c, fn = t.call, t.fn
        tensors = [n for n in ("q", "k", "v", "qkv", "kv", "query", "key", "value") if n in c]
        sdpa = fn == "scaled_dot_product_attention"
        all_tensors = set(tensors) | {"q", "k", "v"}
        out = []

        def set_(name, value, blame, label=None):
            def f():
                if name not in c:
                    return None
                c[name] = value() if callable(value) else value
                return blame
            f.label = f"{name}: {label or repr(value)}"
            return f

        def labelled(label, f):
            f.label = label
            return f

        def grow(x, dim):  # one more entry along dim (zeros)
            shape = list(x.shape)
            shape[dim] = 1
            return torch.cat([x, torch.zeros(shape, dtype=x.dtype, device=x.device)], dim)

        for n in tensors:
            x = c[n]
            other = torch.float32 if x.dtype != torch.float32 else torch.float16
            out += [set_(n, None, {n}), set_(n, lambda x=x: x.tolist(), {n}, "a list"),
                    set_(n, lambda x=x: x.to(torch.int32), {n}, "int32"),
                    set_(n, lambda x=x: x.to(torch.complex64), {n}, "complex64"),
                    set_(n, lambda x=x: x.unsqueeze(0), all_tensors, "one dim more")]
            if len(tensors) > 1:  # a dtype unlike the others' (a lone packed qkv may have any float dtype)
                out.append(set_(n, lambda x=x: x.to(other), all_tensors, f"{other} unlike the others"))
            if x.dim() > 3 or (x.dim() == 3 and not sdpa and n not in ("qkv", "kv")):
                out.append(set_(n, lambda x=x: x[0] if x.shape[0] else x.sum(0), all_tensors, "one dim less"))
            if self.on_cuda and len(tensors) > 1:  # (a lone qkv moved to the CPU is a valid CPU call)
                out.append(set_(n, lambda x=x: x.cpu(), all_tensors | BACKEND_NAMES | set(ALIASES["cu_seqlens"]),
                                "on the CPU"))
        if sdpa:
            qname, kname = "query", "key"
        else:
            qname, kname = ("qkv", "qkv") if "qkv" in c else ("q", "kv" if "kv" in c else "k")

        def head_dim(size):  # q's and k's head dim (and v's where packed with them) set to `size`
            def f():
                c[qname] = torch.zeros(*c[qname].shape[:-1], size, dtype=c[qname].dtype, device=c[qname].device)
                if kname != qname:
                    c[kname] = torch.zeros(*c[kname].shape[:-1], size, dtype=c[kname].dtype, device=c[kname].device)
                return all_tensors
            return labelled(f"head dim {size} in {qname} and {kname}", f)
        out += [head_dim(0), head_dim(0), head_dim(300)]
        vname = "value" if sdpa else "v"
        if vname in c:
            out.append(set_(vname, lambda: c[vname][..., :0], {vname, "v"}, "head dim 0"))
        if not sdpa and "qkv" not in c:  # key heads that do not divide the query heads
            hq = c["q"].shape[-2]

            def bad_heads():
                for n in ("k", "v", "kv"):
                    if n in c:
                        x = c[n]
                        c[n] = torch.zeros(*x.shape[:-2], hq + 1, x.shape[-1], dtype=x.dtype, device=x.device)
                return all_tensors
            out.append(labelled(f"{hq + 1} key heads for {hq} query heads", bad_heads))
        if "v" in c and "k" in c and not sdpa:  # k and v disagree on the row count
            out.append(set_("v", lambda: grow(c["v"], -3), all_tensors, "one row more than k"))
        if sdpa:
            out.append(set_("value", lambda: c["value"].narrow(-2, 0, 0) if c["value"].shape[-2] else
                            grow(c["value"], -2), {"value", "key", "v", "k"}, "a sequence length unlike key's"))
            out.append(set_("attn_mask", lambda: torch.ones(c["query"].shape[-2], c["key"].shape[-2], dtype=torch.bool,
                                                            device=c["query"].device), {"attn_mask"}, "a mask"))
            if c["query"].dim() > 3:
                hq = c["query"].shape[-3]

                def sdpa_heads():
                    for n in ("key", "value"):
                        x = c[n]
                        c[n] = torch.zeros(*x.shape[:-3], hq + 1, *x.shape[-2:], dtype=x.dtype, device=x.device)
                    return {"key", "value", "query", "k", "q", "enable_gqa"}
                out.append(labelled(f"{hq + 1} key heads for {hq} query heads", sdpa_heads))
        if "qkv" in c:
            out.append(set_("qkv", lambda: c["qkv"].narrow(-3, 0, 2), {"qkv"}, "2 parts, not 3"))
        if "kv" in c:
            out.append(set_("kv", lambda: grow(c["kv"], -3), {"kv"}, "3 parts, not 2"))
        if "q" in c and c["q"].dim() == 4 and "k" in c:  # batch sizes disagree
            out.append(set_("k", lambda: grow(c["k"], 0), all_tensors, "one batch entry more"))

        scale_name = "scale" if sdpa else "softmax_scale"
        for v in ("0.5", float("nan"), float("inf"), -0.5, 0.0, 1e39, [0.5], torch.ones(2)):
            out.append(set_(scale_name, v, {scale_name}))
        for v in (None, "1", float("nan"), float("inf"), 1e39, [1.0]):
            out.append(set_("softcap", v, {"softcap"}))
        if fn in ("attention", "choose_backend"):
            out += [set_("softcap", -1.0, {"softcap"})]
            for n in ("window_left", "window_right"):
                out += [set_(n, v, {n}) for v in (-2, None, 1.5, "3")]
        for v in (3, (1,), (1, 2, 3), None, (None, 0), (0.5, 1), "ab", (0, float("nan"))):
            out.append(set_("window_size", v, {"window_size"}))
        for v in (1.0, -0.1, None, float("nan"), "0", [0.0]):
            out.append(set_("dropout_p", v, {"dropout_p"}))
        out.append(set_("alibi_slopes", lambda: torch.ones(3, 5, 7), {"alibi_slopes"}, "a rank-3 tensor"))
        out.append(set_("alibi_slopes", [0.5], {"alibi_slopes"}, "a list"))
        # (with a block table, k and v must be paged caches [num_pages, page_size, heads, dim]: these are not)
        out.append(set_("block_table", lambda: torch.zeros(1, 1, dtype=torch.int32), {"block_table", "k", "v"},
                        "a tensor"))
        for n in ("causal", "deterministic", "return_attn_probs", "backward", "is_causal", "enable_gqa"):
            out += [set_(n, v, {n}) for v in (None, "yes", 2, [True])]
        out += [set_("num_threads", v, {"num_threads"}) for v in (-1, None, 1.5, 2**40, "2")]
        # (choose_backend answers "unsupported" for a backend of the other device: not an error)
        wrong_device = () if fn == "choose_backend" else \
            ("cpu_flash", "cpu_reference") if self.on_cuda else ("cuda_sm80", "cuda_sm90")
        for v in ("fastest", None, "CPU_FLASH", 3) + wrong_device:
            out.append(set_("backend", v, {"backend"} | BACKEND_NAMES))
        for n in ("max_seqlen", "max_seqlen_q", "max_seqlen_k"):
            if n in c:
                blame = {n} | ALIASES.get(n, set())
                out += [set_(n, v, blame) for v in (None, 1.5, -1, "4")]
                cu_name = n.replace("max_seqlen", "cu_seqlens")
                lengths = torch.diff(c[cu_name]).tolist() if c[cu_name].numel() > 1 else []
                if max(lengths, default=0) >= 2:
                    out.append(set_(n, max(lengths) - 1, blame))
        for n in ("cu_seqlens", "cu_seqlens_q", "cu_seqlens_k"):
            if n in c:
                x = c[n]
                blame = {n} | ALIASES.get(n, set())
                both = {"cu_seqlens_q", "cu_seqlens_k"}
                out += [set_(n, lambda x=x: x.long(), blame, "int64"), set_(n, lambda x=x: x.float(), blame, "float"),
                        set_(n, lambda x=x: x.tolist(), blame, "a list"),
                        set_(n, lambda x=x: x.unsqueeze(0), blame, "rank 2"),
                        set_(n, lambda x=x: x[:0], blame, "empty"),
                        set_(n, lambda x=x: torch.cat([x[:-1], x[-1:] + 1]), blame, "last entry + 1"),
                        set_(n, lambda x=x: torch.cat([x[:1] + 1, x[1:]]), blame, "first entry 1")]
                if n != "cu_seqlens":
                    out.append(set_(n, None, both))
                if self.on_cuda:
                    out.append(set_(n, lambda x=x: x.cpu(), blame, "on the CPU"))
                if n == "cu_seqlens_k":
                    out.append(set_(n, lambda x=x: torch.cat([x, x[-1:]]), blame, "one entry more than cu_seqlens_q"))
                if x.numel() >= 3:
                    out.append(set_(n, lambda x=x: torch.cat([x[:1], x[-1:] + 1, x[2:]]), blame, "decreasing"))
        return out


def leading_name(message: str) -> Optional[str]:
    m = re.match(r"\s*([A-Za-z_][A-Za-z_0-9]*)", message)
    return m.group(1) if m else None


def check_trial(t: Trial, device: str):
    if t.grad and t.reference is not None and t.broken is None:
        for i in t.inputs.values():
            i.base.requires_grad_()
        t.call.update({n: i.value() for n, i in t.inputs.items()})
    try:
        result = t.invoke()
    except ERRORS as e:
        if t.broken is None:
            pytest.fail(f"a valid call raised {type(e).__name__}: {e}\n  {t.describe()}")
        name = leading_name(str(e))
        names = set(t.blame)
        for n in list(names):
            names |= ALIASES.get(n, set())
        assert name in names, (f"{type(e).__name__} '{e}' does not start with the argument broken "
                               f"(one of {sorted(names)})\n  {t.describe()}")
        return
    except Exception as e:  # noqa: BLE001 - any other exception type is a failure
        pytest.fail(f"{type(e).__name__} (not ValueError/TypeError/NotImplementedError): {e}\n  {t.describe()}")
    if t.broken is not None:
        pytest.fail(f"an invalid call ({t.broken}) was accepted\n  {t.describe()}")

    if t.fn == "choose_backend":
        assert isinstance(result, flashattn.BackendChoice) and result.supported and result.reason, t.describe()
        requested = t.call["backend"]
        if requested == "auto":
            assert result.backend == ("cpu_flash" if device == "cpu" else result.backend) and \
                result.backend.startswith("cpu_" if device == "cpu" else "cuda_"), (result, t.describe())
        else:
            assert result == (requested, True, "requested explicitly"), (result, t.describe())
        return

    if t.fn == "attention":
        out, lse = result
    elif t.returns_lse:
        out, lse, probs = result
        assert probs is None, t.describe()
    else:
        out, lse = result, None
    assert isinstance(out, torch.Tensor) and out.dtype == t.dtype and out.device.type == torch.device(device).type, \
        t.describe()
    dout = torch.randn_like(out) if t.grad else None
    if t.grad:
        assert out.requires_grad, f"out does not require grad\n  {t.describe()}"
        out.backward(dout)
    refs = {}
    for ref_dtype in (torch.float64, None):
        bases = {n: i.base.detach().to(ref_dtype or t.dtype).requires_grad_(t.grad) for n, i in t.inputs.items()}
        r_out, r_lse = t.reference({n: t.inputs[n].value(b) for n, b in bases.items()}, ref_dtype)
        grads = ()
        if t.grad:
            r_out.backward(dout.to(r_out.dtype))
            grads = tuple(bases[n].grad for n in t.inputs)
        refs[ref_dtype] = (r_out, r_lse) + grads
    names = ["out", "lse"] + [f"d{n}" for n in t.inputs] * t.grad
    ours = [out, lse] + [i.base.grad for i in t.inputs.values()] * t.grad
    for name, o, r64, low in zip(names, ours, refs[torch.float64], refs[None]):
        if name == "lse" and lse is None:
            continue
        if o is None or r64 is None:  # no gradient reached an input: the other one's must be zero too
            other = r64 if o is None else o
            assert other is None or not other.abs().max().item() if other is not None and other.numel() else True, \
                f"{name}: a gradient on one side only\n  {t.describe()}"
            continue
        # float64: the same-dtype math is the oracle itself, so the bound is ulps alone; sums over up to 256 head
        # dims and 70 keys in another order take more than the default 8. float32: the flash backward's
        # D = rowsum(dO * O) from the stored O is about 2x less accurate than autograd's softmax backward (the same
        # formula in plain float32 math is too), at times past the 2x rule at large head dims. A wrong argument or
        # layout shows as an O(1) error; the tight bounds are test_attention's.
        ulps = {torch.float64: 64, torch.float32: 32}.get(t.dtype, 8)
        try:
            assert_close(name, o, r64, low, torch.float32 if name == "lse" and t.dtype == torch.float64 else t.dtype,
                         ulps=ulps)
        except AssertionError as e:
            raise AssertionError(f"{e}\n  {t.describe()}") from None


def run_trials(device: str, trials: int, seed: int = SEED, functions=PUBLIC, p_break: float = 0.55,
               gpu_like: Optional[bool] = None):
    rng = random.Random(seed)
    gen = Gen(rng, device, gpu_like)
    counts = {"valid": 0, "broken": 0}
    for i in range(trials):
        fn = functions[i % len(functions)]
        t = gen.trial(fn)
        if rng.random() < p_break:
            ways = gen.breaks(t)
            rng.shuffle(ways)
            for way in ways:
                blame = way()
                if blame is not None:
                    t.blame, t.broken = blame, way.label
                    break
        t.positional, t.omit_defaults = rng.random() < 0.5, rng.random() < 0.5
        t.notes.append(f"trial {i}")
        check_trial(t, device)
        counts["broken" if t.broken else "valid"] += 1
    return counts


def test_random_calls_of_every_entry_point():
    counts = run_trials("cpu", CPU_TRIALS)
    assert counts["valid"] > CPU_TRIALS // 3 and counts["broken"] > CPU_TRIALS // 3, counts
