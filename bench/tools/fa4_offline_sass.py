#!/usr/bin/env python3
"""FlashAttention-4's Hopper kernels compiled on a machine without a GPU, for their SASS (a measuring aid only:
nothing of FA4 goes into this project).

FA4's interface compiles its CuTe-DSL kernels just in time; under torch's FakeTensorMode with device='cuda'
tensors it builds and compiles them without launching anything, and the DSL keeps the PTX and cubin when told to
(CUTE_DSL_KEEP=ptx,cubin, CUTE_DSL_DUMP_DIR=<an existing directory>). Setup, once (Python 3.12, FA4's parts from
../shared/tools/fa4-anchor/prepare.sh in .fa4a / .fa4b):

  python3.12 -m venv /tmp/fa4x/venv && /tmp/fa4x/venv/bin/pip install torch numpy einops
  xz -dc .fa4a/ir.so.xz > /tmp/fa4stage.so    # then .fa4b/install.sh's steps with S=/tmp/fa4x/site

Then, per configuration:

  mkdir -p /tmp/fa4x/dump/bwd64 && CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR=/tmp/fa4x/dump/bwd64 \\
      /tmp/fa4x/venv/bin/python bench/tools/fa4_offline_sass.py bwd 64 --site /tmp/fa4x/site
  python3 bench/tools/sass_loops.py /tmp/fa4x/dump/bwd64/<kernel>.cubin

It prints the tile configuration FA4's heuristics chose (its kernel class's constructor arguments).
"""

from __future__ import annotations

import argparse
import inspect
import os
import site
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", choices=["fwd", "bwd"])
    ap.add_argument("head_dim", type=int)
    ap.add_argument("--site", default="/tmp/fa4x/site", help="FA4's assembled site directory")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    args = ap.parse_args()
    site.addsitedir(args.site)
    os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from flash_attn.cute import interface

    # Report the configuration each kernel class is built with.
    for cls_name in ("FlashAttentionForwardSm90", "FlashAttentionBackwardSm90"):
        cls = getattr(interface, cls_name, None)
        if cls is None:
            continue
        original = cls.__init__

        def init(self, *a, _original=original, _name=cls_name, **kw):
            bound = inspect.signature(_original).bind(self, *a, **kw)
            bound.apply_defaults()
            print(_name, {k: v for k, v in bound.arguments.items() if k != "self"})
            return _original(self, *a, **kw)

        cls.__init__ = init

    start = time.time()
    b, s, h, d = 1, args.seqlen, args.heads, args.head_dim
    with FakeTensorMode():
        dev = torch.device("cuda")
        q, k, v = (torch.empty(b, s, h, d, dtype=torch.bfloat16, device=dev) for _ in range(3))
        if args.which == "fwd":
            interface._flash_attn_fwd(q, k, v, causal=args.causal, return_lse=True)
        else:
            out, dout = (torch.empty(b, s, h, d, dtype=torch.bfloat16, device=dev) for _ in range(2))
            lse = torch.empty(b, h, s, dtype=torch.float32, device=dev)
            interface._flash_attn_bwd(q, k, v, out, dout, lse, causal=args.causal)
    print(f"compiled {args.which} hd {d} in {time.time() - start:.1f} s; cubin / PTX in "
          f"{os.environ.get('CUTE_DSL_DUMP_DIR', '(CUTE_DSL_DUMP_DIR not set)')}")


if __name__ == "__main__":
    main()
