// V_t for the Hopper FP8 forward (fp8_v_layout.h): V's e4m3 bytes transposed to [column][slot] per (batch, KV
// head), each 32-key group's keys in the A fragment's order, every sequence in whole spans of kFp8KeyPad slots
// with zeros past its last key.
// Work: a CTA per (span of a sequence, KV head, batch entry or sequence), striding over the sequence's spans (so a
// max_seqlen_k below a sequence's true length loses nothing). kTransposeThreads threads stage the span's
// kFp8KeyPad x d_v bytes in shared memory (kFp8KeyPad x (256 + 4) bytes at most: the 4-byte pad spreads a warp's
// reads of one column down the keys over the banks), then write the d_v rows of kFp8KeyPad slots. Where V's rows and
// heads start on 16-byte boundaries (`vector`) both sides move 16 bytes per thread: the byte-wise copy ran at about
// 0.5 TB/s on the H200, 15-20% of the FP8 forward at 4k keys (bench/results/fp8.md).
// Preconditions (sm90_forward_supports): e4m3 V with unit column stride, d_v <= 256 a multiple of 8, lengths below
// 2^31.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/sm90/fp8_v_layout.h"
#include "cuda/sm90/fp8_v_transpose.h"

namespace flashattn::cuda::sm90 {
namespace {

constexpr int kTransposeThreads = 256;
constexpr int kMaxColumns = 256;
constexpr int kRowPad = 4;

struct TransposeArgs {
  const uint8_t* v;
  uint8_t* vt;
  int64_t v_batch_stride, v_row_stride, v_head_stride;  // bytes (= elements)
  const int32_t* cu_seqlens_k;                          // null: padded batch
  int seqlen_k, heads_kv, columns;
  int64_t row_slots;  // slots of one V_t row (fp8_v_row_slots)
  bool vector;        // V's base, row and head strides 16-byte aligned, d_v a multiple of 16
};

__global__ void __launch_bounds__(kTransposeThreads) fp8_v_transpose_kernel(const TransposeArgs a) {
  __shared__ __align__(16) uint8_t staged[kFp8KeyPad][kMaxColumns + kRowPad];
  const int head = int(blockIdx.y), b = int(blockIdx.z);
  const bool varlen = a.cu_seqlens_k != nullptr;
  const int64_t k_row0 = varlen ? a.cu_seqlens_k[b] : 0;
  const int len = varlen ? int(a.cu_seqlens_k[b + 1] - k_row0) : a.seqlen_k;
  const int spans = int(fp8_round_to_span(len) / kFp8KeyPad);
  const uint8_t* src = a.v + (varlen ? 0 : int64_t(b) * a.v_batch_stride) + k_row0 * a.v_row_stride +
                       int64_t(head) * a.v_head_stride;
  // V_t's rows of this (batch, head): varlen sequences share the batch-0 rows, from their own first slot.
  uint8_t* dst = a.vt + (int64_t(varlen ? 0 : b) * a.heads_kv + head) * a.columns * a.row_slots +
                 fp8_v_slot0(varlen, k_row0, b);
  constexpr int kChunk = 16;  // bytes per thread and access on the vector path
  const int chunks = a.columns / kChunk;
  for (int span = int(blockIdx.x); span < spans; span += int(gridDim.x)) {
    const int key0 = span * kFp8KeyPad;
    if (a.vector) {
      for (int i = int(threadIdx.x); i < kFp8KeyPad * chunks; i += kTransposeThreads) {
        const int key = i / chunks, c = (i % chunks) * kChunk;
        const uint4 x = key0 + key < len ? *reinterpret_cast<const uint4*>(src + int64_t(key0 + key) * a.v_row_stride + c)
                                         : make_uint4(0, 0, 0, 0);
        uint32_t* row = reinterpret_cast<uint32_t*>(&staged[key][c]);
        row[0] = x.x, row[1] = x.y, row[2] = x.z, row[3] = x.w;
      }
    } else {
      for (int i = int(threadIdx.x); i < kFp8KeyPad * a.columns; i += kTransposeThreads) {
        const int key = i / a.columns, c = i % a.columns;
        staged[key][c] = key0 + key < len ? src[int64_t(key0 + key) * a.v_row_stride + c] : uint8_t(0);
      }
    }
    __syncthreads();
    // Each thread gathers 16 slots of one column (a 16-byte store; V_t rows and spans start 128-byte aligned).
    constexpr int kRuns = kFp8KeyPad / kChunk;
    for (int i = int(threadIdx.x); i < kRuns * a.columns; i += kTransposeThreads) {
      const int c = i / kRuns, slot0 = (i % kRuns) * kChunk;
      uint32_t words[kChunk / 4];
#pragma unroll
      for (int w = 0; w < kChunk / 4; ++w) {
        uint32_t word = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // slot0 is a multiple of 16 and the order maps each half of a group onto itself (fp8_v_layout.h): the key
          // is slot0 plus a compile-time offset.
          const int key = slot0 + fp8_key_of_slot(4 * w + e);
          word |= uint32_t(staged[key][c]) << (8 * e);
        }
        words[w] = word;
      }
      *reinterpret_cast<uint4*>(dst + int64_t(c) * a.row_slots + key0 + slot0) =
          make_uint4(words[0], words[1], words[2], words[3]);
    }
    __syncthreads();  // the next span overwrites the staging buffer
  }
}

}  // namespace
}  // namespace flashattn::cuda::sm90

namespace flashattn::detail {

Status sm90_fp8_transpose_v(const FwdParams& p, void* vt, int64_t row_slots) {
  using namespace flashattn::cuda::sm90;
  if (p.head_dim_v > kMaxColumns) return Status::unsupported("cuda_sm90: FP8 V with more than 256 columns");
  const bool varlen = p.is_varlen();
  TransposeArgs a{};
  a.v = static_cast<const uint8_t*>(p.v);
  a.vt = static_cast<uint8_t*>(vt);
  a.v_batch_stride = p.v_batch_stride, a.v_row_stride = p.v_row_stride, a.v_head_stride = p.v_head_stride;
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.seqlen_k = int(p.seqlen_k);
  a.heads_kv = int(p.heads_kv);
  a.columns = int(p.head_dim_v);
  a.row_slots = row_slots;
  // In a padded batch the batch stride matters too; varlen sequences start at rows.
  a.vector = reinterpret_cast<uintptr_t>(p.v) % 16 == 0 && p.v_row_stride % 16 == 0 && p.v_head_stride % 16 == 0 &&
             (varlen || p.v_batch_stride % 16 == 0) && p.head_dim_v % 16 == 0;
  // Spans of the longest sequence (a CTA strides over any more); at least one, so that every sequence is visited.
  const int64_t spans = std::max<int64_t>(1, fp8_round_to_span(p.seqlen_k) / kFp8KeyPad);
  const dim3 grid(unsigned(std::min<int64_t>(spans, 65535)), unsigned(p.heads_kv), unsigned(p.batch));
  fp8_v_transpose_kernel<<<grid, kTransposeThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(a);
  return cuda_status(cudaGetLastError(), "cuda_sm90 FP8 V transpose launch");
}

}  // namespace flashattn::detail
