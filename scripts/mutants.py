#!/usr/bin/env python3
"""Mutation check of the test suites: applies each plausible bug of a list (scripts/mutants/*.txt) to a copy of
the tree, one at a time, rebuilds, runs the tests and reports which mutants the tests kill. A mutant that
survives names a blind spot of the suite; one whose old text is missing from the tree is reported as stale (the
list must follow the code). The working tree is never modified. Run through scripts/mutants.sh."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Mutant:
    name: str
    file: str = ""
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    gtest_filter: str = ""


def parse(path: Path) -> list[Mutant]:
    mutants: list[Mutant] = []
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("@ "):
            mutants.append(Mutant(line[2:].strip()))
        elif not mutants:
            raise SystemExit(f"{path}: '{line}' before the first '@ name'")
        elif line.startswith("file "):
            mutants[-1].file = line[5:].strip()
        elif line.startswith("filter "):
            mutants[-1].gtest_filter = line[7:].strip()
        elif line.startswith("- ") or line == "-":
            mutants[-1].old.append(line[2:])
        elif line.startswith("+ ") or line == "+":
            mutants[-1].new.append(line[2:])
        else:
            raise SystemExit(f"{path}: cannot read '{line}'")
    for m in mutants:
        if not m.file or not m.old:
            raise SystemExit(f"{path}: mutant '{m.name}' needs a file and old lines")
    return mutants


def run(cmd: list[str], cwd: Path, log: Path, timeout: int) -> int:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            return subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {timeout} s\n")
            return 124


def first_failure(log: Path) -> str:
    """The tests that failed (ctest's summary, or gtest's), or the first compiler error."""
    text = log.read_text(errors="replace")
    summary = text.split("The following tests FAILED:")[-1] if "The following tests FAILED:" in text else ""
    failed = re.findall(r"\d+ - (\S+) \(Failed\)", summary) or re.findall(r"\[  FAILED  \] (\S+)", text)
    if failed:
        return ", ".join(dict.fromkeys(f.rstrip(",") for f in failed[:3]))[:160]
    errors = re.findall(r"error: (.*)", text)
    return errors[0][:160] if errors else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpu", action="store_true", help="the CUDA build and the GPU suite (scripts/mutants/gpu.txt)")
    ap.add_argument("--list", type=Path, help="mutant list (default: scripts/mutants/cpu.txt or gpu.txt)")
    ap.add_argument("--only", default="", help="run only mutants whose name contains this")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "flashattn-mutants")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cmake-arg", action="append", default=[], help="extra CMake argument (repeatable)")
    ap.add_argument("--report", type=Path, help="also write the result table (markdown) here")
    args = ap.parse_args()

    mutants = parse(args.list or ROOT / "scripts" / "mutants" / ("gpu.txt" if args.gpu else "cpu.txt"))
    mutants = [m for m in mutants if args.only in m.name]
    src = args.work / "src"
    build = args.work / "build"
    logs = args.work / "logs"
    shutil.rmtree(src, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)

    cuda = "ON" if args.gpu else "OFF"
    configure = ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 f"-DFLASHATTN_CUDA={cuda}", "-DFLASHATTN_BUILD_BENCH=OFF", "-DFLASHATTN_BUILD_PYTHON=OFF",
                 *args.cmake_arg]
    build_cmd = ["ninja", "-C", str(build), f"-j{args.jobs}"]
    gpu_binary = build / "tests" / "flashattn_gpu_tests"

    def test_cmd(m: Mutant | None) -> list[str]:
        if args.gpu:
            # The baseline runs what the mutants will (the union of their filters, or everything).
            filters = [m.gtest_filter] if m else [x.gtest_filter for x in mutants]
            cmd = [str(gpu_binary), "--gtest_fail_fast"]
            if all(filters):
                cmd.append("--gtest_filter=" + ":".join(filters))
            return cmd
        return ["ctest", "--test-dir", str(build), "-L", "cpu", "-j", str(args.jobs), "--stop-on-failure",
                "--output-on-failure"]

    base_log = logs / "baseline.log"
    base_log.write_text("")
    t0 = time.time()
    if run(configure, args.work, base_log, 600) or run(build_cmd, args.work, base_log, 3600):
        print(f"the unmutated tree does not build: {base_log}", file=sys.stderr)
        return 2
    if run(test_cmd(None), args.work, base_log, 3600):
        print(f"the unmutated tree fails its tests ({first_failure(base_log)}): {base_log}", file=sys.stderr)
        return 2
    print(f"baseline: builds and passes ({time.time() - t0:.0f} s)", flush=True)

    rows = []
    for n, m in enumerate(mutants, 1):
        target = src / m.file
        original = target.read_text()
        old, new = "\n".join(m.old), "\n".join(m.new)
        count = original.count(old)
        log = logs / f"mutant{n:02d}.log"
        log.write_text(f"{m.name}\n{m.file}\n")
        t1 = time.time()
        if count != 1:
            result, detail = "stale", f"old text found {count} times"
        else:
            target.write_text(original.replace(old, new))
            try:
                if run(build_cmd, args.work, log, 3600):
                    result, detail = "does not build", first_failure(log)
                elif run(test_cmd(m), args.work, log, 3600):
                    result, detail = "killed", first_failure(log)
                else:
                    result, detail = "SURVIVED", ""
            finally:
                target.write_text(original)
        rows.append((m.name, m.file, result, detail, time.time() - t1))
        print(f"[{n}/{len(mutants)}] {result:14s} {m.name} ({time.time() - t1:.0f} s) {detail}", flush=True)
    run(build_cmd, args.work, logs / "restore.log", 3600)  # leave the build matching the tree

    table = ["| mutant | file | result | first failing test |", "|---|---|---|---|"]
    table += [f"| {name} | `{file}` | {result} | {detail} |" for name, file, result, detail, _ in rows]
    killed = sum(r[2] == "killed" for r in rows)
    summary = f"{killed} of {len(rows)} mutants killed ({'GPU' if args.gpu else 'CPU'} suite)"
    print("\n" + "\n".join(table) + "\n\n" + summary)
    if args.report:
        args.report.write_text("\n".join(table) + "\n\n" + summary + "\n")
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
