// Every tile-size decision of the CPU flash path, in one place.
//
// Two levels of blocking:
// - Register micro-tiles (micro_gemm.h): kMicroRows rows by kMicroVecs vectors of accumulators, within the
//   register file (AVX-512: 32 vector registers, 4 x 4 accumulators + 4 B-vectors + a broadcast; AVX2 / SSE:
//   16, 4 x 2). 4 rows divide every attention block, so no row tails; measured as fast as 6 x 4 (within 2%)
//   for the forward and up to 7% faster for the backward at d = 64, and faster than 8 x 3.
// - Attention tiles (flash_forward.cpp / flash_backward.cpp): query rows (kBlockQ in the backward, a per-call
//   block_q in the forward) by kBlockK key rows. A block is a multiple of the micro-tile width so that the score
//   tiles run at the micro-kernel's full width, and small enough that a tile's working set (Q, K, V, scores,
//   O partial) stays in the 2 MiB L2 of one core.
#pragma once

#include <cstdint>

// These headers are compiled with different instruction sets in different translation units (the kernels once
// per level, src/cpu/isa.cpp; the tests at the baseline), so every template and inline function in them lives in a
// namespace named after the instruction set: the linker can never substitute one ISA's instantiation for another's.
// (What else the kernels instantiate, the standard library's templates included, is made private to each level's
// object when it is linked: CMakeLists.txt.)
// A build may name it (the -march=native kernels: isa_native).
#if defined(FLASHATTN_CPU_ISA)
#elif defined(__AVX512F__) && defined(__AVX512BF16__)
#define FLASHATTN_CPU_ISA isa_avx512_bf16
#elif defined(__AVX512F__)
#define FLASHATTN_CPU_ISA isa_avx512
#elif defined(__AVX2__) && defined(__FMA__)
#define FLASHATTN_CPU_ISA isa_avx2_fma
#elif defined(__AVX__)
#define FLASHATTN_CPU_ISA isa_avx
#else
#define FLASHATTN_CPU_ISA isa_baseline
#endif

namespace flashattn::detail {
inline namespace FLASHATTN_CPU_ISA {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
constexpr int kRegisterCount = 32;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
constexpr int kRegisterCount = 16;
#else
constexpr int kVectorBytes = 16;
constexpr int kRegisterCount = 16;
#endif

template <typename Acc>
struct CpuTiles {
  // Elements per vector register; padded row lengths of fp32/fp64 buffers are multiples of it, so a micro-kernel
  // never needs a scalar column tail.
  static constexpr int kVec = kVectorBytes / int(sizeof(Acc));
  static constexpr int kMicroRows = 4;
  static constexpr int kMicroVecs = kRegisterCount >= 32 ? 4 : 2;
  static constexpr int kMicroCols = kMicroVecs * kVec;

  // Attention tiles, multiples of every micro-tile width above (fp32 and fp64, AVX-512 to SSE), small enough
  // that a tile's working set stays in L2 for head dims up to 256.
  static constexpr int kBlockQ = 64;  // backward
  static constexpr int kBlockK = 64;  // backward and forward

  // Forward query block: the tallest power of two in [kFwdBlockQMin, kFwdBlockQMax] whose Qᵀ and O tiles fit in
  // kFwdQueryTileBytes (a quarter of a 2 MiB L2) and that still cuts the call into kFwdMinTasks tasks (a
  // constant, not a multiple of the thread count, so that the output does not depend on the number of threads).
  // A K / V tile is fetched and converted once per query block (measured: up to 16% of the forward with 256-row
  // blocks on 2 cores), so taller blocks amortise that: on one Sapphire Rapids core at s = 2048, d = 64, going
  // from 64 to 256 rows gained about 25%, and from 256 to 512 rows another 4% (113 -> 118 GFLOP/s).
  static constexpr int kFwdBlockQMax = 512;
  static constexpr int kFwdBlockQMin = 64;
  static constexpr int64_t kFwdQueryTileBytes = 512 << 10;
  static constexpr int64_t kFwdMinTasks = 16;

  // Forward query blocks of at most this many (packed) rows take the few-row products (few_row_products.h: dot
  // products along the head dim, K / V read in place) instead of the block micro-kernels, whose query-column
  // vectors such a block leaves mostly padding.
  static constexpr int kFewRowsMax = kVec;

  // Backward: below this many independent (batch, KV head) units, a unit is split (over its query heads, then
  // over key chunks) so that the parallel loop has work for several threads. A constant, not the thread count,
  // so that gradients are bitwise identical whatever the number of threads.
  static constexpr int64_t kBackwardMinTasks = 16;

  static_assert(kBlockQ % kMicroCols == 0 && kBlockK % kMicroCols == 0 && kFwdBlockQMin % kMicroCols == 0,
                "blocks must be whole micro-tiles");
};

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Row stride of a per-thread buffer that a micro-kernel reads as its B operand (rows of `cols` elements, for
// `bytes`-byte elements): whole vectors plus one vector more. Without the extra vector a row of 256 fp32 is 1 KiB,
// and the K rows of a B panel then map onto a quarter of the L1 sets and evict each other: measured on the
// forward's Qᵀ, the Q·Kᵀ product ran at 103 instead of 146 GFLOP/s on one core.
constexpr int64_t b_operand_ld(int64_t cols, int64_t bytes) {
  return round_up(cols, kVectorBytes / bytes) + kVectorBytes / bytes;
}

}  // namespace FLASHATTN_CPU_ISA
}  // namespace flashattn::detail
