// Online-softmax state of one query row: the running maximum m of the scores seen so far and the running sum
// d = Σ exp(s - m). Written once for the CPU paths and the CUDA kernels.
//
// Edge cases, and why:
// - Before any visible key, m = -inf and d = 0. A new maximum that is still -inf (every score so far masked)
//   must not produce exp(-inf - -inf) = NaN, so `rescale_factor` treats that case as "nothing to rescale" (0).
// - A row that never saw a key finishes with d = 0: its output is 0 and its LSE is -inf, never NaN.
// - NaN scores propagate (a NaN input gives a NaN output): hiding them would hide bugs upstream.
#pragma once

#include <cmath>
#include <limits>

#include "common/hd.h"

namespace flashattn {

template <typename T>
struct SoftmaxState {
  T m = -std::numeric_limits<T>::infinity();
  T d = T(0);

  // exp(old_max - new_max), with the all-masked case (-inf to -inf) mapped to 0 rather than NaN.
  FA_HD static T rescale_factor(T old_max, T new_max) {
    return new_max == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(old_max - new_max);
  }

  // Raises the running maximum to at least `tile_max`; returns the factor by which the caller must scale its
  // partial output (and which has already been applied to d).
  FA_HD T update_max(T tile_max) {
    const T new_max = tile_max > m ? tile_max : m;
    const T factor = rescale_factor(m, new_max);
    d *= factor;
    m = new_max;
    return factor;
  }

  // exp(s - m) for a score under the current maximum; masked scores (-inf) give 0.
  FA_HD T prob(T s) const { return m == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(s - m); }

  // Combines two partial states of the same row (split-K merge).
  FA_HD void merge(const SoftmaxState& other, T* self_factor, T* other_factor) {
    const T new_max = other.m > m ? other.m : m;
    *self_factor = rescale_factor(m, new_max);
    *other_factor = rescale_factor(other.m, new_max);
    d = d * *self_factor + other.d * *other_factor;
    m = new_max;
  }

  // 1 / d, or 0 for a row that saw no key (its output is then 0).
  FA_HD T inv_sum() const { return d > T(0) ? T(1) / d : T(0); }

  // Natural-log log-sum-exp of the row's scores; -inf for a row that saw no key.
  FA_HD T lse() const { return d > T(0) ? m + std::log(d) : -std::numeric_limits<T>::infinity(); }

  // For kernels that keep m and d in their own (vectorised) arrays and bring their own exponential:
  // the value to subtract from scores before exponentiating. It is the running maximum, or 0 while that is
  // still -inf, so that exp(s - exp_offset(m)) == prob(s) and exp(old - exp_offset(new)) ==
  // rescale_factor(old, new), -inf cases included, with no branch in the inner loop.
  FA_HD static T exp_offset(T max) { return max == -std::numeric_limits<T>::infinity() ? T(0) : max; }

  // lse() for a row whose scores (and so m) are kept in log2 units, i.e. pre-multiplied by log2(e) so that the
  // exponential is a single exp2: ln(2) * (m + log2 d), or -inf for a row that saw no key.
  FA_HD static T lse_from_log2(T m_log2, T d) {
    return d > T(0) ? (m_log2 + std::log2(d)) * T(0.69314718055994530942) : -std::numeric_limits<T>::infinity();
  }
};

// Two partial attentions of one row over disjoint key sets, by their LSEs (merge_attention_states): the merged LSE
// and each side's weight in the merged output. A side at -inf (no key) weighs 0; both at -inf: weights 0 and LSE
// -inf; a NaN LSE makes everything NaN.
template <typename T>
struct LseMerge {
  T lse, weight_a, weight_b;

  // The merged output element; a side of weight 0 is not read into it (its output may be anything, NaN included:
  // an accumulator that saw no key yet).
  FA_HD T combine(T out_a, T out_b) const {
    return (weight_a == T(0) ? T(0) : weight_a * out_a) + (weight_b == T(0) ? T(0) : weight_b * out_b);
  }
};

template <typename T>
FA_HD LseMerge<T> merge_lse(T lse_a, T lse_b) {
  const T m = lse_a > lse_b ? lse_a : lse_b;
  const T offset = SoftmaxState<T>::exp_offset(m);
  const T ea = std::exp(lse_a - offset), eb = std::exp(lse_b - offset);
  const T sum = ea + eb;
  // No key on either side: out 0 and lse -inf (a NaN LSE carries through the arithmetic below).
  if (sum == T(0)) return {-std::numeric_limits<T>::infinity(), T(0), T(0)};
  const T inv = T(1) / sum;
  return {offset + std::log(sum), ea * inv, eb * inv};
}

}  // namespace flashattn
