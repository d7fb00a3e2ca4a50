// merge_attention_states on the CPU: one (row, head) at a time, its two LSEs read before anything of it is written,
// so out / lse may be out_a / lse_a (or the b side) themselves. fp32 arithmetic, as on CUDA (common/softmax_state.h).
#include <omp.h>

#include <vector>

#include "backend.h"
#include "common/half.h"
#include "common/softmax_state.h"

namespace flashattn::detail {
namespace {

void load_row(DType dtype, const void* src, int64_t n, float* dst) {
  switch (dtype) {
    case DType::f16:
      for (int64_t c = 0; c < n; ++c) dst[c] = to_float(static_cast<const half_t*>(src)[c]);
      return;
    case DType::bf16:
      for (int64_t c = 0; c < n; ++c) dst[c] = to_float(static_cast<const bfloat16_t*>(src)[c]);
      return;
    default:
      for (int64_t c = 0; c < n; ++c) dst[c] = static_cast<const float*>(src)[c];
  }
}

void store_row(DType dtype, const float* src, int64_t n, void* dst) {
  switch (dtype) {
    case DType::f16:
      for (int64_t c = 0; c < n; ++c) static_cast<half_t*>(dst)[c] = to_half(src[c]);
      return;
    case DType::bf16:
      for (int64_t c = 0; c < n; ++c) static_cast<bfloat16_t*>(dst)[c] = to_bfloat16(src[c]);
      return;
    default:
      for (int64_t c = 0; c < n; ++c) static_cast<float*>(dst)[c] = src[c];
  }
}

const char* element(const void* base, DType dtype, int64_t offset) {
  return static_cast<const char*>(base) + offset * int64_t(dtype_size(dtype));
}

}  // namespace

Status cpu_merge(const MergeParams& p) {
  const int64_t items = p.batch * p.rows * p.heads, d = p.head_dim_v;
  const int threads = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads) if (items * d > (int64_t(1) << 16))
  {
    std::vector<float> oa(static_cast<size_t>(d)), ob(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t h = item % p.heads, i = (item / p.heads) % p.rows, b = item / (p.heads * p.rows);
      const MergeParams::Side* sides[2] = {&p.a, &p.b};
      float* rows[2] = {oa.data(), ob.data()};
      float lse[2];
      for (int s = 0; s < 2; ++s) {
        const MergeParams::Side& x = *sides[s];
        load_row(x.dtype, element(x.out, x.dtype, b * x.batch_stride + i * x.row_stride + h * x.head_stride), d,
                 rows[s]);
        lse[s] = x.lse[b * x.lse_batch_stride + h * x.lse_head_stride + i];
      }
      const LseMerge<float> m = merge_lse(lse[0], lse[1]);
      for (int64_t c = 0; c < d; ++c) oa[size_t(c)] = m.combine(oa[size_t(c)], ob[size_t(c)]);
      char* out = const_cast<char*>(
          element(p.out, p.a.dtype, b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride));
      store_row(p.a.dtype, oa.data(), d, out);
      if (p.lse != nullptr) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + i] = m.lse;
    }
  }
  return Status::success();
}

}  // namespace flashattn::detail
