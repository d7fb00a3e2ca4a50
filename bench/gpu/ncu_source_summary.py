#!/usr/bin/env python3
"""Summarises Nsight Compute's per-instruction source counters: where the warps of one kernel stall.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` (a report taken with
`--set full --import-source yes`). Prints the instructions with the most stall samples (with their share and the
opcode), then the samples per opcode. Column names differ a little between ncu versions, so they are matched by
substring; the header is printed when a needed column is missing.

    python3 bench/gpu/ncu_source_summary.py source.csv [--top 40]
"""
import argparse
import csv
import collections
import sys


def find_column(header, *needles):
    for i, name in enumerate(header):
        low = name.lower()
        if all(n in low for n in needles):
            return i
    return None


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    # The first row naming both an address and a source column is the header (ncu may print a preamble).
    start = next((i for i, r in enumerate(rows) if find_column(r, "source") is not None
                  and find_column(r, "address") is not None), None)
    if start is None:
        sys.exit("no header with Address and Source columns; first rows: %r" % rows[:3])
    header, body = rows[start], rows[start + 1:]
    col_src = find_column(header, "source")
    col_addr = find_column(header, "address")
    col_all = find_column(header, "stall sampling", "all")
    col_not_issued = find_column(header, "stall sampling", "not")
    col_exec = find_column(header, "instructions executed")
    if col_all is None:
        sys.exit("no 'Warp Stall Sampling (All Samples)' column; header: %r" % header)
    entries = []
    for r in body:
        if len(r) <= max(c for c in (col_src, col_addr, col_all) if c is not None):
            continue
        samples = number(r[col_all])
        entries.append((samples, r[col_addr], r[col_src].strip(),
                        number(r[col_not_issued]) if col_not_issued is not None else 0.0,
                        number(r[col_exec]) if col_exec is not None else 0.0))
    total = sum(e[0] for e in entries) or 1.0
    print(f"{len(entries)} instructions, {total:.0f} stall samples")
    if col_exec is not None:
        # Distinct instructions a launch ran: at short lengths each is fetched cold once per SM, so this count,
        # not the executed total, is what the instruction-fetch stalls scale with.
        print(f"{sum(1 for e in entries if e[4] > 0)} of them executed at least once")
    print(f"{'share':>6} {'samples':>9} {'not-issued':>10} {'executed':>10}  address  instruction")
    for samples, addr, src, not_issued, executed in sorted(entries, reverse=True)[:args.top]:
        print(f"{100 * samples / total:5.1f}% {samples:9.0f} {not_issued:10.0f} {executed:10.0f}  {addr:>7}  {src}")
    by_opcode = collections.Counter()
    for samples, _, src, _, _ in entries:
        tokens = [t for t in src.split() if not t.startswith("@")]
        by_opcode[tokens[0].split(".")[0] if tokens else "?"] += samples
    print("\nsamples per opcode:")
    for op, samples in by_opcode.most_common(20):
        print(f"{100 * samples / total:5.1f}%  {op}")


if __name__ == "__main__":
    main()
