// The Hopper backward of float8_e4m3fn Q, K, V, dO: contiguous copies in the gradients' 16-bit dtype, then the
// 16-bit backward kernel (backward_sm90.cu) on them; dQ, dK, dV are the gradients of the dequantised inputs (value ·
// descale[b, h / group]), as the CPU backends compute them (cpu/fp8.h).
// Q and K are copied as their e4m3 values, exact in 16 bits, and their descales go to the kernel, which scales the
// scores by softmax_scale · q_descale · k_descale as the FP8 forward did: a score recomputed from rounded products
// value · descale would be off by up to |S| · 2^-8, and P by as much relative, against the forward's LSE (measured
// on the H200: gradients 1.2-3.6e-2 off on peaky inputs, against 0.4-6.8e-3 with the exact copies). V and dO are
// copied as value · descale rounded to 16 bits (relative 2^-8 in bfloat16, like any 16-bit input).
// All five products run in 16 bits: S = QKᵀ and dP = dO Vᵀ could take the e4m3 operands as they are, but dV = Pᵀ dO,
// dQ = dS K and dK = dSᵀ Q would need P and dS in e4m3, 10-16x the bfloat16 error (bench/fp8_backward_products.py,
// bench/results/fp8.md); an FP8 kernel would only pay for the first two.
// float16 gradients stage float16 copies, which overflow past 65504 (value · descale of V and dO).
// Work (fp8_stage_kernel): blockIdx.y picks the tensor (Q, K, V, dO); threads stride over 8-element chunks of
// (batch, row, head), 8 bytes in, 16 bytes out. Memory-bound: the copies are 2.5x the bytes of the inputs, against
// a backward that reads each input several times.
// Preconditions (sm90_backward_supports): validated e4m3 params with out_dtype float16 or bfloat16, head dims
// multiples of 8 (so a chunk never straddles heads).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/kv_cache.h"
#include "cuda/check.h"
#include "cuda/primitives.cuh"
#include "cuda/sm90/backward_sm90_fp8.h"
#include "cuda/workspace.h"

namespace flashattn::cuda::sm90 {
namespace {

constexpr int kStageThreads = 256;
constexpr int kChunk = 8;            // elements per thread and step: 8 e4m3 bytes in, one 16-byte store out
constexpr int kStagedTensors = 4;    // Q, K, V, dO
constexpr int kMaxStageBlocks = 4096;  // per tensor; threads stride over the rest
constexpr size_t kStageAlign = 256;    // each copy's start: TMA needs 16 bytes, 256 keeps whole cache lines

// One e4m3 tensor [batches, rows, heads, dim] (varlen: [1, total rows, ...]) and its contiguous 16-bit copy.
struct StageJob {
  const uint8_t* src = nullptr;
  void* dst = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // of src, in elements (= bytes)
  const float* descale = nullptr;                             // null: 1
  int64_t descale_batch_stride = 0, descale_head_stride = 0;
  const int32_t* cu_seqlens = nullptr;  // varlen: the offsets that name a packed row's sequence (its descale's row)
  int64_t rows = 0;
  int heads = 0, dim = 0, head_group = 1;  // head_group: heads per descale column (query heads per KV head)
  bool vector = false;                      // src's base and strides 8-byte aligned: one 8-byte load per chunk
};

struct StageArgs {
  StageJob job[kStagedTensors];
  int batches = 0;    // batch entries of the copies (1 in varlen)
  int sequences = 0;  // p.batch: varlen's sequence count
};

template <typename T>
__global__ void __launch_bounds__(kStageThreads) fp8_stage_kernel(const StageArgs a) {
  const StageJob& j = a.job[blockIdx.y];
  const int chunks = j.dim / kChunk;
  const int64_t units = int64_t(a.batches) * j.rows * j.heads * chunks;
  const int64_t step = int64_t(gridDim.x) * kStageThreads;
  for (int64_t u = int64_t(blockIdx.x) * kStageThreads + threadIdx.x; u < units; u += step) {
    // u enumerates (batch, row, head, chunk) in the copy's own order, so the copy's offset is u chunks.
    const int c = int(u % chunks) * kChunk;
    int64_t rest = u / chunks;
    const int h = int(rest % j.heads);
    rest /= j.heads;
    const int64_t r = rest % j.rows, b = rest / j.rows;
    const uint8_t* src = j.src + b * j.batch_stride + r * j.row_stride + int64_t(h) * j.head_stride + c;
    uint8_t bytes[kChunk];
    if (j.vector) {
      *reinterpret_cast<uint2*>(bytes) = *reinterpret_cast<const uint2*>(src);
    } else {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) bytes[e] = src[e];
    }
    float scale = 1.f;
    if (j.descale != nullptr) {
      const int64_t seq = j.cu_seqlens != nullptr ? varlen_sequence_of(j.cu_seqlens, a.sequences, r) : b;
      scale = j.descale[seq * j.descale_batch_stride + int64_t(h / j.head_group) * j.descale_head_stride];
    }
    reinterpret_cast<uint4*>(j.dst)[u] = e4m3x8_to<T>(bytes, scale);
  }
}

// The job of one e4m3 input; its copy's place (dst) is set once the workspace exists.
StageJob stage_job(const FwdParams& p, const void* src, int64_t rows, int64_t heads, int64_t dim,
                   int64_t batch_stride, int64_t row_stride, int64_t head_stride, const float* descale,
                   const int64_t* descale_strides, int64_t head_group, const int32_t* cu_seqlens) {
  const bool varlen = p.is_varlen();
  StageJob j;
  j.src = static_cast<const uint8_t*>(src);
  j.batch_stride = varlen ? 0 : batch_stride, j.row_stride = row_stride, j.head_stride = head_stride;
  j.descale = descale;
  if (descale != nullptr) j.descale_batch_stride = descale_strides[0], j.descale_head_stride = descale_strides[1];
  j.cu_seqlens = varlen ? cu_seqlens : nullptr;
  j.rows = rows, j.heads = int(heads), j.dim = int(dim), j.head_group = int(head_group);
  j.vector = reinterpret_cast<uintptr_t>(src) % kChunk == 0 && row_stride % kChunk == 0 &&
             head_stride % kChunk == 0 && (varlen || batch_stride % kChunk == 0);
  return j;
}

size_t aligned_bytes(size_t bytes) { return (bytes + kStageAlign - 1) / kStageAlign * kStageAlign; }

}  // namespace
}  // namespace flashattn::cuda::sm90

namespace flashattn::detail {

Status sm90_fp8_backward_run(const BwdParams& p, Sm90BackwardFn run16) {
  using namespace flashattn::cuda::sm90;
  const bool varlen = p.is_varlen();
  const int64_t batches = varlen ? 1 : p.batch;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const int64_t group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  StageArgs a;
  a.batches = int(batches), a.sequences = int(p.batch);
  // Q and K without their descales, which the kernel applies to the scores (f keeps them).
  a.job[0] = stage_job(p, p.q, rows_q, p.heads_q, p.head_dim, p.q_batch_stride, p.q_row_stride, p.q_head_stride,
                       nullptr, nullptr, group, p.cu_seqlens_q);
  a.job[1] = stage_job(p, p.k, rows_k, p.heads_kv, p.head_dim, p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                       nullptr, nullptr, 1, p.cu_seqlens_k);
  a.job[2] = stage_job(p, p.v, rows_k, p.heads_kv, p.head_dim_v, p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                       p.v_descale, p.v_descale_strides, 1, p.cu_seqlens_k);
  a.job[3] = stage_job(p, p.dout, rows_q, p.heads_q, p.head_dim_v, p.do_batch_stride, p.do_row_stride,
                       p.do_head_stride, p.do_descale, p.do_descale_strides, group, p.cu_seqlens_q);

  // One workspace for the four contiguous 16-bit copies, each [batches, rows, heads, dim].
  constexpr size_t kElemBytes = 2;
  size_t offsets[kStagedTensors], total = 0;
  int64_t most_chunks = 0;
  for (int i = 0; i < kStagedTensors; ++i) {
    const StageJob& j = a.job[i];
    const int64_t elements = batches * j.rows * j.heads * j.dim;
    offsets[i] = total;
    total += aligned_bytes(std::max<size_t>(size_t(elements) * kElemBytes, 1));
    most_chunks = std::max(most_chunks, elements / kChunk);
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  void* workspace = nullptr;
  Status st = workspace_alloc(&workspace, total, p.device.index, stream);
  if (!st.ok()) return st;
  for (int i = 0; i < kStagedTensors; ++i) a.job[i].dst = static_cast<uint8_t*>(workspace) + offsets[i];

  // The 16-bit backward's params: the copies (contiguous; 0 batch stride in varlen, as validation leaves a varlen
  // call's), V's and dO's descales applied.
  BwdParams f = p;
  f.dtype = p.out_dtype;
  auto point = [&](int i, const void** data, int64_t* batch_stride, int64_t* row_stride, int64_t* head_stride) {
    const StageJob& j = a.job[i];
    *data = j.dst;
    *batch_stride = varlen ? 0 : j.rows * j.heads * j.dim, *row_stride = int64_t(j.heads) * j.dim,
    *head_stride = j.dim;
  };
  point(0, &f.q, &f.q_batch_stride, &f.q_row_stride, &f.q_head_stride);
  point(1, &f.k, &f.k_batch_stride, &f.k_row_stride, &f.k_head_stride);
  point(2, &f.v, &f.v_batch_stride, &f.v_row_stride, &f.v_head_stride);
  point(3, &f.dout, &f.do_batch_stride, &f.do_row_stride, &f.do_head_stride);
  f.v_descale = f.do_descale = nullptr;

  if (most_chunks > 0) {
    const dim3 grid(unsigned(std::min<int64_t>((most_chunks + kStageThreads - 1) / kStageThreads, kMaxStageBlocks)),
                    kStagedTensors);
    if (p.out_dtype == DType::bf16)
      fp8_stage_kernel<__nv_bfloat16><<<grid, kStageThreads, 0, stream>>>(a);
    else
      fp8_stage_kernel<__half><<<grid, kStageThreads, 0, stream>>>(a);
    st = cuda_status(cudaGetLastError(), "cuda_sm90 FP8 backward staging launch");
  }
  if (st.ok()) st = run16(f);
  Status freed = workspace_free(workspace, stream);
  return st.ok() ? freed : st;
}

}  // namespace flashattn::detail
