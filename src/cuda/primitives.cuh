// The small in-house layer of named warp-level primitives the sm80 kernels are written in. Each one is a thin,
// named wrapper over one PTX instruction (inline PTX only where CCCL has no wrapper: mma.sync, ldmatrix,
// cp.async with zero-fill), unit-tested on the GPU in tests/gpu/test_primitives.cu.
//
// Register fragment layouts follow the PTX ISA for mma.m16n8k16 (row.col): for a warp, lane = 4 * group + quad,
//   A (16x16): a[0] = (group,     2*quad..+1), a[1] = (group + 8, 2*quad..+1),
//              a[2] = (group, 8 + 2*quad..+1), a[3] = (group + 8, 8 + 2*quad..+1)
//   B (16x8, "col"): b[0] = (k = 2*quad..+1, n = group), b[1] = (k = 8 + 2*quad..+1, n = group)
//   C (16x8, fp32): c[0..1] = (group, 2*quad..+1), c[2..3] = (group + 8, 2*quad..+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace flashattn::cuda {

// ---- element types ----
template <typename T>
struct ElementTraits;
template <>
struct ElementTraits<__half> {
  using Pair = __half2;
  static constexpr bool is_bf16 = false;
  __device__ static Pair pack(float lo, float hi) { return __floats2half2_rn(lo, hi); }
  __device__ static float2 unpack(Pair v) { return __half22float2(v); }
  __device__ static __half from(float x) { return __float2half_rn(x); }
  __device__ static float to(__half x) { return __half2float(x); }
};
template <>
struct ElementTraits<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static constexpr bool is_bf16 = true;
  __device__ static Pair pack(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
  __device__ static float2 unpack(Pair v) { return __bfloat1622float2(v); }
  __device__ static __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
  __device__ static float to(__nv_bfloat16 x) { return __bfloat162float(x); }
};

// fp32 storage (the merge kernel's accumulators): to_float / from_float are the identity.
template <>
struct ElementTraits<float> {
  __device__ static float from(float x) { return x; }
  __device__ static float to(float x) { return x; }
};

// float8_e4m3fn storage (the kernels hold e4m3 values as bytes): widened exactly (every e4m3 value is a float16),
// rounded to the nearest e4m3 and saturated at +-448 (common/half.h to_e4m3 on the CPU backends: the same bits).
template <>
struct ElementTraits<uint8_t> {
  __device__ static uint8_t from(float x) { return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }
  __device__ static float to(uint8_t x) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(x), __NV_E4M3)));
  }
};

// Two floats rounded into one 32-bit register of two 16-bit elements (low half = first).
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  typename ElementTraits<T>::Pair v = ElementTraits<T>::pack(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// One float rounded to T (round to nearest even), and back.
template <typename T>
__device__ __forceinline__ T from_float(float x) {
  return ElementTraits<T>::from(x);
}
template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return ElementTraits<T>::to(x);
}

template <typename T>
__device__ __forceinline__ float2 unpack_pair(uint32_t bits) {
  return ElementTraits<T>::unpack(*reinterpret_cast<typename ElementTraits<T>::Pair*>(&bits));
}

// Two float8_e4m3fn values (low byte first) as two float16 in one register (low half first), exactly: every e4m3
// value, NaN included, is a float16, so this is one hardware conversion on sm_89+ (the header's emulation before).
__device__ __forceinline__ uint32_t e4m3_pair_to_half(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// Eight float8_e4m3fn values (the low byte of eight.x first) as one 16-byte chunk of float16, exactly.
__device__ __forceinline__ uint4 e4m3x8_to_half(uint2 eight) {
  return make_uint4(e4m3_pair_to_half(uint16_t(eight.x)), e4m3_pair_to_half(uint16_t(eight.x >> 16)),
                    e4m3_pair_to_half(uint16_t(eight.y)), e4m3_pair_to_half(uint16_t(eight.y >> 16)));
}

// Two float8_e4m3fn values (low byte first) times `scale`, rounded into one register of two T (16-bit). With scale
// 1 the conversion is exact (every e4m3 value is a float16 and a bfloat16).
template <typename T>
__device__ __forceinline__ uint32_t e4m3_pair_to(uint16_t pair, float scale) {
  const float2 f = unpack_pair<__half>(e4m3_pair_to_half(pair));
  return pack_pair<T>(f.x * scale, f.y * scale);
}

// Eight float8_e4m3fn values (bytes[0] first) times `scale` as one 16-byte chunk of T.
template <typename T>
__device__ __forceinline__ uint4 e4m3x8_to(const uint8_t (&bytes)[8], float scale) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = e4m3_pair_to<T>(uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8)), scale);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// ---- tensor-core matrix multiply: C(16x8, fp32) += A(16x16) * B(16x8) ----
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (ElementTraits<T>::is_bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// ---- shared memory -> registers: ldmatrix (each lane passes the address of one 16-byte row) ----
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row_addr)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row_addr)));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row_addr)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_address(row_addr)));
}

// ---- global -> shared asynchronous copies (cp.async, sm80+) ----
// Copies 16 bytes when `valid`, else writes 16 zero bytes (src-size 0): out-of-range tail rows and columns
// arrive as zeros, so the matrix products need no branch.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "r"(src_bytes));
}

// Copies the first `src_bytes` (0..16) of a 16-byte chunk and zero-fills the rest: a chunk that straddles the
// end of a row (head dims that are not multiples of 8) arrives zero-padded.
__device__ __forceinline__ void cp_async_16_partial(void* smem_dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "r"(src_bytes));
}

// Copies one 4-byte word when `valid`, else writes zero (for small per-row vectors such as LSE; .ca because
// 4-byte copies cannot bypass L1).
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem_dst)), "l"(gmem_src),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- reductions across the four lanes of a quad (the lanes holding one row of an mma C fragment) ----
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// 4 x 4 transpose of 32-bit words across the four lanes of a quad: lane q holds w[i] = M[q][i] before and
// w[i] = M[i][q] after. Two butterfly stages (lane bit 1, then 2), each exchanging the two words whose index bit
// differs from the lane's, so that no word is indexed by the lane number (that would put w in local memory).
// Every lane of the warp must take part. Turns an mma accumulator's 4-byte column pairs (lane q: columns 2q, 2q+1
// of each 8) into 16-byte runs (lane q: 8 consecutive columns).
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4], int quad) {
#pragma unroll
  for (int bit = 1; bit <= 2; bit *= 2) {
    const bool upper = (quad & bit) != 0;
#pragma unroll
    for (int i0 = 0; i0 < 4; ++i0) {
      if (i0 & bit) continue;
      const int i1 = i0 | bit;
      const uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? w[i0] : w[i1], bit);
      if (upper)
        w[i0] = got;
      else
        w[i1] = got;
    }
  }
}

// 2^x on the special-function unit; softmax uses exp2 with log2(e) folded into the scale so that
// exp(s*scale - m) becomes one FFMA and one MUFU.EX2. The .ftz form: exp2f adds a range test and two FMULs per
// call to keep subnormal results, which a probability in [0, 1] summed in fp32 does not need. exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- softcap's tanh ----
// tanh on the special-function unit for softcap, whose score softcap · tanh(s · scale / softcap) needs tanh only to
// an absolute error (the softmax sees the score, not its digits): with e = 2^-|z| in (0, 1] for z = 2·log2(e)·x,
// tanh|x| = (1 - e) / (1 + e) and 1 - tanh²x = 4e / (1 + e)², one ex2.approx and one rcp.approx, absolute error
// below 2^-21 on the whole line, ±1 at the ends and NaN kept. tanhf's relative accuracy near 0 cost about 20
// instructions per score (two range tests, a polynomial besides the same ex2 and rcp); this costs 6, and the slope
// from e keeps its relative accuracy where 1 - t² would cancel. Callers fold 2·log2(e) into their scale
// (kTanhExp2): z = s · (scale · kTanhExp2).
constexpr float kTanhExp2 = 2.88539008177792681f;  // 2·log2(e)

struct TanhParts {
  float e, r;  // 2^-|z| and 1 / (1 + e)
  float z;     // the argument, for the sign
};
__device__ __forceinline__ TanhParts tanh_parts(float z) {
  TanhParts t;
  t.z = z;
  t.e = fast_exp2(-fabsf(z));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t.r) : "f"(1.f + t.e));
  return t;
}
// c · tanh(x).
__device__ __forceinline__ float scaled_tanh(const TanhParts& t, float c) {
  const float cr = c * t.r;
  return copysignf(fmaf(-t.e, cr, cr), t.z);
}
// 1 - tanh²(x), tanh's derivative.
__device__ __forceinline__ float tanh_slope(const TanhParts& t) { return 4.f * t.e * (t.r * t.r); }

// ---- fp32 reductions into global memory ----
// dQ accumulation into fp32 global memory: dst[0] += x, dst[1] += y where `pred`, as one vector reduction
// where the hardware has it (sm_90: red.global.add.v2.f32), else two scalar ones. The test is a predicate on the
// reduction itself rather than a branch around it, so a tile's reductions stay in one block of straight-line
// code that the compiler can interleave with the surrounding mma.sync.
__device__ __forceinline__ void atomic_add_pair_if(float* dst, float x, float y, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p red.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(dst),
      "f"(x), "f"(y), "r"(int(pred)));
#else
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p red.global.add.f32 [%0], %1;\n @p red.global.add.f32 [%0+4], "
      "%2;\n}\n" ::"l"(dst),
      "f"(x), "f"(y), "r"(int(pred)));
#endif
}

}  // namespace flashattn::cuda
