// The naive double-precision reference, row by row. The whole-tensor reference backend (cpu_reference) is a
// loop over these rows; the CLI and the benchmarks call the row function directly to check sampled rows of
// problems too large for a full reference run.
#pragma once

#include <vector>

#include "flashattn/params.h"

namespace flashattn::detail {

struct ReferenceRow {
  std::vector<double> out;   // [head_dim_v]
  double lse = 0;            // -inf for a row that sees no key
  std::vector<double> prob;  // [len_k] softmax probabilities of the row
  std::vector<double> weight;  // [len_k] what O sums V with: prob, dropped (0) or scaled by 1 / (1 - p) under dropout
  std::vector<double> dq;    // [head_dim], only with gradients
  std::vector<double> dscore;  // [len_k] dL/d(q·k) of the row (scale and softcap applied), only with gradients
};

// Query row i of head h in batch entry b. With `with_grad`, p.dout must be set (a BwdParams whose dq/dk/dv
// may be null): fills dq and dscore (from the exact O of the row, not a stored one).
void reference_row(const BwdParams& p, int64_t b, int64_t h, int64_t i, bool with_grad, ReferenceRow* row);

}  // namespace flashattn::detail
