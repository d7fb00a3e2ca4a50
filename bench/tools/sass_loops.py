#!/usr/bin/env python3
"""Loops of compiled kernels and what each issues: an offline stand-in for a profile's instruction counts.

Reads the SASS of a relocatable object or cubin (through cuobjdump -xelf and nvdisasm, which keeps the branch
labels) or an already disassembled text (`nvdisasm -c` output), picks the kernels whose mangled names contain every
--match string, and for each loop (a label that a later branch jumps back to) with at least --min-hgmma warpgroup
matrix products (HGMMA, or QGMMA for e4m3)
prints its instruction count and the opcode families in it, most frequent first. A loop body that holds two copies
of an iteration (a masked and an unmasked one, chosen by a branch) shows up as one loop: --split prints the
stretches between the loop's groups of products too, so the copies can be told apart. --stalls adds the cycles that the
compiler's control codes hold each warp after each instruction (the 4-bit stall count of the encoding), summed over
the loop and each stretch: the fixed-latency waits that Nsight Compute samples as "Stall Wait".

  python3 bench/tools/sass_loops.py build/CMakeFiles/flashattn_sm90a.dir/src/cuda/sm90/backward_sm90.cu.o \\
      --match backward_kernel --match 13__nv_bfloat16 --match ILi64ELb0ELb0ELb0E

Used for bench/results/hopper-backward.md (our loops beside FlashAttention-4's, whose cubins the CuTe DSL writes
with CUTE_DSL_KEEP=cubin: bench/tools/fa4_offline_sass.py).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
ENCODING = re.compile(r"/\*\s*0x([0-9a-f]{16})\s*\*/")
LABEL = re.compile(r"^(\.L_x_\d+):")
SECTION = re.compile(r"^\.text\.(\S+):")
GUARD = re.compile(r"^@!?U?P\w+\s+")


def tool(name: str) -> str:
    """cuobjdump / nvdisasm from PATH, the CUDA toolkit, or Triton's bundled copies."""
    toolkit = f"/usr/local/cuda/bin/{name}"
    found = shutil.which(name) or (toolkit if os.path.exists(toolkit) else None)
    if found:
        return found
    try:
        import triton  # noqa: F401  (only to locate its bundled NVIDIA tools)
        bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        if os.path.exists(bundled):
            return bundled
    except ImportError:
        pass
    sys.exit(f"{name}: not found (PATH, /usr/local/cuda/bin, triton's bundled tools)")


def disassemble(path: str, encodings: bool = False) -> str:
    """nvdisasm -c text of every cubin in `path` (an object, a cubin, or already SASS text); with each instruction's
    two encoding words where `encodings`."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        return open(path).read()
    with tempfile.TemporaryDirectory() as tmp:
        cubins = [path]
        if not path.endswith(".cubin"):
            subprocess.run([tool("cuobjdump"), "-xelf", "all", os.path.abspath(path)], cwd=tmp, check=True,
                           stdout=subprocess.DEVNULL)
            cubins = [os.path.join(tmp, n) for n in sorted(os.listdir(tmp)) if n.endswith(".cubin")]
        flags = ["-c", "-hex"] if encodings else ["-c"]
        return "".join(subprocess.run([tool("nvdisasm"), *flags, c], check=True, capture_output=True,
                                      text=True).stdout for c in cubins)


def functions(text: str) -> dict[str, list[str]]:
    funcs, name = {}, None
    for line in text.splitlines():
        m = SECTION.match(line.strip())
        if m:
            name = m.group(1)
            funcs[name] = []
        elif name:
            funcs[name].append(line)
    return funcs


def parse(lines: list[str]):
    """(instructions as (opcode, text, stall cycles or 0 without encodings), label -> index of the next
    instruction)."""
    ins, labels = [], {}
    for line in lines:
        m = LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(ins)
            continue
        words = ENCODING.findall(line)
        m = INSTRUCTION.match(ENCODING.sub("", line))
        if m and m.group(2):
            body = GUARD.sub("", m.group(2))
            ins.append([body.split()[0] if body else "", m.group(2), 0])
        elif words and ins:
            # The second word of the previous instruction: its control code's stall count is bits 41-44.
            ins[-1][2] = (int(words[-1], 16) >> 41) & 0xF
    return ins, labels


def families(ins, lo: int, hi: int) -> collections.Counter:
    return collections.Counter(op.split(".")[0] for op, _, _ in ins[lo:hi])


def stall_note(ins, lo: int, hi: int, enabled: bool) -> str:
    return f", {sum(stall for _, _, stall in ins[lo:hi])} stall cycles" if enabled else ""


# Opcodes of the warpgroup matrix products: 16-bit (HGMMA) and e4m3 (QGMMA).
PRODUCTS = ("HGMMA", "QGMMA")


def is_product(op: str) -> bool:
    return op.startswith(PRODUCTS)


def describe(c: collections.Counter) -> str:
    return " ".join(f"{k}={v}" for k, v in c.most_common())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="object, cubin, or nvdisasm -c text")
    ap.add_argument("--match", action="append", default=[], help="substring of the mangled kernel name (repeatable)")
    ap.add_argument("--min-hgmma", type=int, default=8, help="report loops with at least this many HGMMA / QGMMA")
    ap.add_argument("--split", action="store_true", help="also the stretches between a loop's product groups")
    ap.add_argument("--stalls", action="store_true", help="also the control codes' stall cycles")
    args = ap.parse_args()
    for name, lines in functions(disassemble(args.path, args.stalls)).items():
        if not all(m in name for m in args.match):
            continue
        ins, labels = parse(lines)
        print(f"== {name}\n   whole kernel: {len(ins)} instructions: {describe(families(ins, 0, len(ins)))}")
        for i, (op, text, _) in enumerate(ins):
            m = re.search(r"`\((\.L_x_\d+)\)", text)
            if not (op.startswith("BRA") and m and m.group(1) in labels and labels[m.group(1)] <= i):
                continue
            lo, hi = labels[m.group(1)], i + 1
            c = families(ins, lo, hi)
            if sum(c[op] for op in PRODUCTS) < args.min_hgmma:
                continue
            print(f"   loop {m.group(1)} ({hi - lo} instructions{stall_note(ins, lo, hi, args.stalls)}, back edge "
                  f"'{text}'): {describe(c)}")
            if args.split:
                # Stretches separated by the instruction before each run of products that follows other work.
                cuts = [lo] + [k for k in range(lo + 1, hi) if is_product(ins[k][0])
                               and not any(is_product(ins[j][0]) for j in range(max(lo, k - 12), k))] + [hi]
                for a, b in zip(cuts, cuts[1:]):
                    print(f"      [{a - lo:5d}, {b - lo:5d}) {b - a:4d}{stall_note(ins, a, b, args.stalls)}: "
                          f"{describe(families(ins, a, b))}")


if __name__ == "__main__":
    main()
