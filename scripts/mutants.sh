#!/usr/bin/env bash
# Mutation check of the test suites (README "Test"): applies each plausible bug of scripts/mutants/cpu.txt to a
# copy of the tree, one at a time, rebuilds the CPU suite and reports which ones `ctest -L cpu` kills. Run it
# before submitting changes to the reference, the oracle or shared code, and record the result in
# bench/results/test-quality.md with the date. Exit status 0 only if every mutant is killed.
#
#   scripts/mutants.sh                    the CPU list (about 1-2 minutes a mutant on 2 cores)
#   scripts/mutants.sh --only softcap     the mutants whose name contains "softcap"
#   scripts/mutants.sh --gpu              scripts/mutants/gpu.txt against the GPU suite (needs a GPU)
#   scripts/mutants.sh --report FILE      also write the result table (markdown) to FILE
set -euo pipefail
exec python3 "$(dirname "$0")/mutants.py" "$@"
