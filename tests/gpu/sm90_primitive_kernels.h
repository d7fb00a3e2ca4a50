// Launchers of the sm_90a test kernels (tests/gpu/sm90_primitive_kernels.cu) that exercise one primitive of
// src/cuda/sm90/primitives_sm90.cuh each. All pointers are device pointers; 16-bit data travels as raw bits.
// Each launcher synchronises and returns the first CUDA error.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashattn::test::sm90 {

// Adds to *count the number of 32-bit words at which a and b (bytes long, a multiple of 4) differ. Asynchronous
// on the default stream, unlike the launchers below: for comparing the outputs of many back-to-back launches.
cudaError_t count_differing_words(const void* a, const void* b, size_t bytes, unsigned* count);

// One TMA load of `panels` boxes of [box_rows x 64] at (col0, row0) into shared memory, then a raw dump of
// that shared memory (panels * box_rows * 128 bytes) to `dump`.
cudaError_t tma_load_and_dump(const CUtensorMap& map, int col0, int row0, int box_rows, int panels, uint8_t* dump);

// A cluster of two CTAs: each TMA-multicasts its half (half_rows rows from row rank * half_rows, 64 columns) of a
// [2 * half_rows x 64] box into both, then dumps its shared tile (2 * half_rows * 128 bytes) to dump[rank];
// rank 0 stores `token` into rank 1's shared memory and arrives on its barrier, rank 1 writes what it received
// to *echo and arrives back (st_shared_cluster, mbarrier_arrive_cluster, mbarrier_wait_cluster, cluster_sync).
cudaError_t cluster_multicast(const CUtensorMap& map, int half_rows, uint32_t token, uint8_t* dump, uint32_t* echo);

// C[64 x n] = A[64 x k] * B[n x k]ᵀ (A, B row-major) through wgmma with both operands in shared memory, K-major.
cudaError_t wgmma_ss_product(bool bf16, int n, int k, const uint16_t* a, const uint16_t* b, float* c);

// C[64 x n] = A[64 x k] * B[k x n] (row-major): A from registers, B in shared memory, N-major (transposed).
cudaError_t wgmma_rs_product(bool bf16, int n, int k, const uint16_t* a, const uint16_t* b, float* c);

// The forward's two-product chain without softmax: S = Q Kᵀ (SS) rounded to 16 bits in registers, then
// O = S V (RS). Q [64 x d], K [n x d], V [n x d], O [64 x d], all row-major.
cudaError_t wgmma_chain(bool bf16, int n, int d, const uint16_t* q, const uint16_t* k, const uint16_t* v, float* o);

// A warp-specialised ring: one producer thread (its warpgroup shrunk by setmaxnreg) streams `tiles` boxes
// of [64 x 64] starting at row 0 through a 2-stage shared-memory ring with full/empty mbarriers; two consumer
// warpgroups (grown by setmaxnreg) copy each tile out, unswizzled, to out[tiles * 64 x 64].
cudaError_t tma_ring_copy(const CUtensorMap& map, int tiles, uint16_t* out);

// One warp: lane l loads in[4l .. 4l+3], runs quad_transpose (src/cuda/primitives.cuh, used by the Hopper
// forward's epilogue) and stores its four words to out[4l .. 4l+3].
cudaError_t quad_transpose_words(const uint32_t* in, uint32_t* out);

// The deterministic backward's dQ protocol (take_bulk_turn, bulk_store_f32 / bulk_reduce_add_f32, pass_bulk_turn):
// each of `ctas` CTAs, all resident at once, writes kTurnTestParts parts of kTurnTestPartFloats floats into each of
// `tiles` tiles of `sums` (not zeroed) in turn, CTA c's turn being c: turn 0 stores, the others add. Element i of
// CTA c's parts is c + 1 + i % 7; `turns` holds `tiles` zeroed counters.
constexpr int kTurnTestParts = 2, kTurnTestPartFloats = 1024;
cudaError_t turn_ordered_tiles(int ctas, int tiles, float* sums, int* turns);

// Host-only check of desc_advance against encoding the advanced address anew (both descriptor layouts) over
// every 1024-byte tile base of the 227 KB window and every 16-byte step up to 64 KB past it, while the address stays
// below 2^18: the number of mismatches; the first one's base and step in *first_base, *first_bytes.
int descriptor_advance_mismatches(uint32_t* first_base, uint32_t* first_bytes);

}  // namespace flashattn::test::sm90
