"""flashattn as a transformers attention backend (flashattn.integrations.transformers, attn_implementation="fattn").

Tiny randomly initialised models built from their configs (no downloads): Llama (GQA), Mistral (sliding window),
Gemma 2 (sliding window, softcap, its own scale) and a BERT encoder (bidirectional). Each is checked against the
same weights on transformers' "sdpa" backend: logits and parameter gradients with and without padding, greedy
generate() through transformers' caches, a packed batch, and save / from_pretrained with our name (Gemma 2's
reference is transformers' "eager" backend: its sdpa path has no softcap). What the
backend cannot do raises NotImplementedError naming it. On a GPU the same runs in float16.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0")

import flashattn  # noqa: E402
from flashattn.integrations import transformers as fa_transformers  # noqa: E402

NAME = fa_transformers.NAME
VOCAB = 96


def _configs():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128)
    return {
        "llama": lambda: transformers.LlamaConfig(num_key_value_heads=2, **common),
        "mistral": lambda: transformers.MistralConfig(num_key_value_heads=2, sliding_window=7, **common),
        "gemma2": lambda: transformers.Gemma2Config(num_key_value_heads=1, head_dim=16, sliding_window=6,
                                                    attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                                                    query_pre_attn_scalar=20, **common),
        "bert": lambda: transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                                num_hidden_layers=2, num_attention_heads=4,
                                                max_position_embeddings=128, hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0),
    }


DECODERS = ["llama", "mistral", "gemma2"]
REFERENCE = {"gemma2": "eager"}  # the backend each model is compared with (default: sdpa)
MODELS = DECODERS + ["bert"]

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _device_dtype(device):
    if device == "cuda":
        if not (torch.cuda.is_available() and flashattn.built_with_cuda):
            pytest.skip("needs a CUDA device and a build with the CUDA kernels")
        return torch.float16
    return torch.float32


def _model(name, device, dtype, impl=None, **overrides):
    impl = impl or REFERENCE.get(name, "sdpa")
    torch.manual_seed(1234)
    config = _configs()[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    cls = transformers.AutoModel if name == "bert" else transformers.AutoModelForCausalLM
    model = cls.from_config(config, attn_implementation=impl)
    # Queries and keys scaled up from the initialiser's 0.02: scores of a few units, so that the softmax is far
    # from uniform and the masks, the window and softcap change the result.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("q_proj.weight", "k_proj.weight", "query.weight", "key.weight")):
                p.mul_(8.0)
    return model.to(device=device, dtype=dtype).eval()


def _inputs(name, device, padded, batch=3, length=19):
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:
        # Decoders pad on the left (generation), the encoder on the right; rows of different lengths.
        for row, pad in enumerate((0, 5, 11)[:batch]):
            if pad:
                if name == "bert":
                    mask[row, length - pad:] = 0
                else:
                    mask[row, :pad] = 0
    return ids.to(device), mask.to(device)


def _output(model, name, ids, mask):
    out = model(input_ids=ids, attention_mask=mask)
    return out.last_hidden_state if name == "bert" else out.logits


def _tolerance(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("name", MODELS)
def test_outputs_and_gradients_match_sdpa(name, padded, device):
    dtype = _device_dtype(device)
    ids, mask = _inputs(name, device, padded)
    keep = mask.bool()
    results = {}
    reference = REFERENCE.get(name, "sdpa")
    for impl in (reference, NAME):
        model = _model(name, device, dtype, impl)
        assert model.config._attn_implementation == impl
        out = _output(model, name, ids, mask)
        # A loss over the real positions only (padded rows are not defined the same way by every backend), through
        # a fixed random projection: a norm of a LayerNorm's output (BERT's) would be constant, its gradient noise.
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(device)
        (out.float() * weights)[keep].sum().backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        results[impl] = (out[keep].float().detach(), grads)
    (ref, ref_grads), (ours, our_grads) = results[reference], results[NAME]
    torch.testing.assert_close(ours, ref, **_tolerance(dtype))
    assert ref_grads.keys() == our_grads.keys()
    # Relative to each gradient, with a floor of 1e-3 of them all: some vanish in exact arithmetic (a key bias
    # shifts every score of a row alike), and their rounding noise is no one's error.
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    floor = 1e-3 * torch.stack([g.norm() for g in ref_grads.values()]).norm()
    for n, g in ref_grads.items():
        err = (our_grads[n] - g).norm() / (g.norm() + floor)
        assert err < tol, f"{n}: gradient error {err:.2e} of |g| = {g.norm():.2e}"


def _first_divergence_is_a_tie(ref, ours, scores, prompt_len, dtype):
    """Greedy tokens equal, or the first differing step one where the reference's top two scores are a tie
    within the dtype's rounding (then the continuations legitimately differ)."""
    for row in range(ref.shape[0]):
        diff = (ref[row] != ours[row]).nonzero()
        if diff.numel() == 0:
            continue
        step = int(diff[0]) - prompt_len
        top = scores[step][row].float()
        gap = top[ref[row, prompt_len + step]] - top[ours[row, prompt_len + step]]
        if dtype == torch.float32 or gap > 5e-2 * top.abs().max():
            return False
    return True


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generate_matches_sdpa(name, device):
    dtype = _device_dtype(device)
    ids, mask = _inputs(name, device, padded=True, length=12)
    runs = {}
    reference = REFERENCE.get(name, "sdpa")
    for impl in (reference, NAME):
        model = _model(name, device, dtype, impl)
        runs[impl] = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                    pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    ref, ours = runs[reference].sequences, runs[NAME].sequences
    assert ref.shape == ours.shape
    assert torch.equal(ref, ours) or _first_divergence_is_a_tie(ref, ours, runs[reference].scores, ids.shape[1], dtype)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_set_attn_implementation_and_packed_batch(name):
    """One row packing three sequences (position_ids restarting, or transformers' cu_seq_lens_* keywords): varlen,
    each sequence's logits those of the sequence run alone on the reference backend."""
    model = _model(name, "cpu", torch.float32)
    lengths = [7, 9, 5]
    ids = torch.randint(0, VOCAB, (1, sum(lengths)), generator=torch.Generator().manual_seed(3))
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    starts = [0, 7, 16]
    alone = [model(input_ids=ids[:, a:a + n]).logits for a, n in zip(starts, lengths)]
    model.set_attn_implementation(NAME)
    cu = torch.tensor([0, 7, 16, 21], dtype=torch.int32)
    for kwargs in (dict(), dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9, max_length_k=9)):
        ours = model(input_ids=ids, position_ids=position_ids, **kwargs).logits
        for a, n, want in zip(starts, lengths, alone):
            torch.testing.assert_close(ours[:, a:a + n], want, atol=1e-4, rtol=1e-4)


def test_decoder_switched_to_bidirectional():
    """config.is_causal = False (transformers' switch of a decoder to bidirectional masks) is followed too."""
    ids, mask = _inputs("llama", "cpu", padded=True)
    keep = mask.bool()
    outs = []
    for impl in ("sdpa", NAME):
        model = _model("llama", "cpu", torch.float32, impl, is_causal=False)
        outs.append(_output(model, "llama", ids, mask)[keep])
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)


def test_from_pretrained_with_our_name(tmp_path):
    model = _model("llama", "cpu", torch.float32)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=NAME)
    assert loaded.config._attn_implementation == NAME
    ids, mask = _inputs("llama", "cpu", padded=True)
    keep = mask.bool()
    torch.testing.assert_close(_output(loaded.eval(), "llama", ids, mask)[keep],
                               _output(model, "llama", ids, mask)[keep], atol=1e-4, rtol=1e-4)


def test_what_it_cannot_do_raises():
    model = _model("llama", "cpu", torch.float32, NAME)
    ids = torch.randint(0, VOCAB, (1, 8))
    custom = torch.zeros(1, 1, 8, 8)  # an additive 4-D mask: arbitrary, not a padding pattern
    with pytest.raises(NotImplementedError, match="4 dims"):
        model(input_ids=ids, attention_mask=custom)
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 8, 16)
    with pytest.raises(NotImplementedError, match="s_aux"):
        fa_transformers.attention_forward(attn, q, q, q, None, s_aux=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="position_bias"):
        fa_transformers.attention_forward(attn, q, q, q, None, position_bias=torch.zeros(1, 4, 8, 8))
    from transformers import masking_utils

    chunked = masking_utils.chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long))
    with pytest.raises(NotImplementedError, match="chunked"):
        fa_transformers.attention_mask(1, 8, 8, mask_function=chunked)
    union = masking_utils.or_masks(masking_utils.causal_mask_function, masking_utils.bidirectional_mask_function)
    with pytest.raises(NotImplementedError, match="union"):
        fa_transformers.attention_mask(1, 8, 8, mask_function=union)
    # The patterns it does run pass, and give flash_attn's 2-D padding mask (None when nothing is padded).
    window = masking_utils.sliding_window_causal_mask_function(4)
    assert fa_transformers.attention_mask(1, 8, 8, mask_function=window, attention_mask=torch.ones(1, 8)) is None
    padding = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(fa_transformers.attention_mask(1, 8, 8, mask_function=window, attention_mask=padding), padding)
