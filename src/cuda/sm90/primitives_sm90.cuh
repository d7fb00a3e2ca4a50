// The in-house Hopper (sm_90a) primitives the sm90 kernels are written in: warpgroup matrix multiplies
// (wgmma) with shared-memory matrix descriptors over 128-byte-swizzled tiles, the bulk tensor copy engine
// (TMA), mbarriers with phase tracking, proxy fences and register reallocation (setmaxnreg). Each is a thin,
// named wrapper over PTX: CCCL's cuda::ptx where it has the instruction (TMA, mbarrier, fences), inline PTX
// where it does not (wgmma, setmaxnreg). Unit-tested on the GPU in tests/gpu/test_sm90_primitives.cpp.
//
// Compile for `-gencode=arch=compute_90a,code=sm_90a` only: wgmma and setmaxnreg do not exist elsewhere.
//
// Tiles in shared memory use the 128-byte swizzled layout of cuda/sm90/swizzle.h.
//
// wgmma register layouts (PTX ISA, wgmma .m64nNk16), for thread t of the warpgroup: warp w = t / 32 owns rows
// 16w..16w+15; with g = (t % 32) / 4 and q = t % 4:
//   accumulator (fp32, N/2 registers): d[4j + 0..1] = (row 16w + g,     cols 8j + 2q, +1)
//                                      d[4j + 2..3] = (row 16w + g + 8, cols 8j + 2q, +1)
//   A from registers (4 x 32-bit, two 16-bit values each, low half first):
//     a[0] = (16w + g, 2q..+1), a[1] = (16w + g + 8, 2q..+1), a[2] = (16w + g, 8 + 2q..+1),
//     a[3] = (16w + g + 8, 8 + 2q..+1)
// so an accumulator over keys converts into the A operand of the next product without data movement (the
// forward's P = softmax(S) feeding O += P V).
#pragma once

#include <cuda/atomic>
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "cuda/cluster.cuh"
#include "cuda/primitives.cuh"
#include "cuda/sm90/swizzle.h"
#include "cuda/sm90/warpgroup.h"

namespace flashattn::cuda::sm90 {

// ---- shared-memory matrix descriptors (PTX "matrix descriptor format") ----
// Plain integer arithmetic, so also callable on the host (the descriptor tests check them there).
// Bits 0-13: start address >> 4; 16-29: leading-dimension byte offset >> 4; 32-45: stride-dimension byte
// offset >> 4; 49-51: base offset (0: our tiles start on a 1024-byte boundary); 62-63: swizzle (1 = 128 B, 2 = 64 B).
__host__ __device__ __forceinline__ uint64_t encode_descriptor(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                                               uint64_t swizzle_mode = 1) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo_bytes & 0x3FFFF) >> 4) << 32) | (swizzle_mode << 62);
}

// K-major operand (rows of the M or N dimension, K contiguous), e.g. Q and K for S = Q Kᵀ. One wgmma reads 16
// K-elements = 32 bytes of each 128-byte row, so the leading offset is unused (encoded as 1 by convention) and
// the stride offset is one swizzle atom (8 rows). Step along K inside a panel by adding 32 bytes to the start
// address: the swizzle is a function of the address, so the hardware applies the same XOR that TMA did.
__host__ __device__ __forceinline__ uint64_t make_desc_k_major(uint32_t smem_addr) {
  return encode_descriptor(smem_addr, 16, kSwizzleAtomBytes);
}
// A K-major operand of kRowBytes-byte rows swizzled by as many bytes (128, or 64: e4m3 rows of 64 elements, which
// TMA loads with CU_TENSOR_MAP_SWIZZLE_64B): the stride offset is 8 such rows. Steps along K as above.
template <int kRowBytes>
__host__ __device__ __forceinline__ uint64_t make_desc_k_major_rows(uint32_t smem_addr) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "make_desc_k_major_rows: 128- or 64-byte swizzled rows");
  return encode_descriptor(smem_addr, 16, 8 * kRowBytes, kRowBytes == 128 ? 1 : 2);
}

// MN-major operand (rows of the K dimension, N contiguous), e.g. V for O += P V, where V's rows are keys. The
// leading offset steps to the next 64 columns of N (the next panel); the stride offset steps 8 K-rows.
__host__ __device__ __forceinline__ uint64_t make_desc_mn_major(uint32_t smem_addr, uint32_t panel_bytes) {
  return encode_descriptor(smem_addr, panel_bytes, kSwizzleAtomBytes);
}

// The descriptor of the tile `bytes` further on. The address field is bits 0-13 of the low word (address >> 4)
// and every shared-memory address is below 2^18, so the sum never carries out of the field: one 32-bit add on a
// descriptor built once per tile, instead of re-encoding (mask, shift, or) before every wgmma.
__host__ __device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = uint32_t(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// The same value as desc_advance, as one 64-bit add (the address field never carries). ptxas then steps the
// descriptor as a whole pair (UIADD3.64) instead of rebuilding its constant high word with a UMOV before every
// wgmma, which saves two uniform instructions per wgmma but keeps more descriptor pairs live: a choice per kernel
// (BackwardConfig::kWholeDqDescriptorSteps), by its SASS.
__host__ __device__ __forceinline__ uint64_t desc_advance_whole(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// This thread's warpgroup, broadcast from lane 0 so the compiler knows it is warp-uniform: values derived from it
// (shared-memory addresses, descriptors) then live in uniform registers instead of being moved there (R2UR)
// before every wgmma.
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, int(threadIdx.x) / kWarpgroupThreads, 0);
}

// ---- wgmma: warpgroup-wide asynchronous matrix multiply, D(64 x N, fp32) (+)= A(64 x 16) B(16 x N) ----
// Makes prior register writes (accumulators, A fragments) visible to the next wgmma of this warpgroup.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed wgmma groups of this warp are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across an asynchronous wgmma.
template <int kN>
__device__ __forceinline__ void fence_registers(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define FA_SM90_ACC_REGS_16 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" "}"
#define FA_SM90_ACC_REGS_32 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" "}"
#define FA_SM90_ACC_REGS_40 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39" "}"
#define FA_SM90_ACC_REGS_88 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87" "}"
#define FA_SM90_ACC_REGS_48 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" "}"
#define FA_SM90_ACC_REGS_64 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" "}"
#define FA_SM90_ACC_REGS_96 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" "}"
#define FA_SM90_ACC_REGS_128 "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" "}"

#define FA_SM90_D8(d, i) \
  "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
      "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define FA_SM90_D16(d) FA_SM90_D8(d, 0), FA_SM90_D8(d, 8)
#define FA_SM90_D32(d, i) FA_SM90_D8(d, (i)), FA_SM90_D8(d, (i) + 8), FA_SM90_D8(d, (i) + 16), FA_SM90_D8(d, (i) + 24)
#define FA_SM90_D48(d) FA_SM90_D32(d, 0), FA_SM90_D8(d, 32), FA_SM90_D8(d, 40)
#define FA_SM90_D64(d) FA_SM90_D32(d, 0), FA_SM90_D32(d, 32)
#define FA_SM90_D40(d) FA_SM90_D32(d, 0), FA_SM90_D8(d, 32)
#define FA_SM90_D88(d) FA_SM90_D32(d, 0), FA_SM90_D32(d, 32), FA_SM90_D8(d, 64), FA_SM90_D8(d, 72), FA_SM90_D8(d, 80)
#define FA_SM90_D96(d) FA_SM90_D32(d, 0), FA_SM90_D32(d, 32), FA_SM90_D32(d, 64)
#define FA_SM90_D128(d) FA_SM90_D32(d, 0), FA_SM90_D32(d, 32), FA_SM90_D32(d, 64), FA_SM90_D32(d, 96)

// Operand numbers follow the accumulators: SS takes (desc_a, desc_b, accumulate, trans_b), RS takes
// (a0..a3, desc_b, accumulate, trans_b). `accumulate` = 0 overwrites D (the first product of a sum).
#define FA_SM90_WGMMA_SS(N, TYPE, ACC, DA, DB, SCALE, TRANS, TRANSA)                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                                     \
  "wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TYPE "." TYPE " " ACC ", " DA ", " DB ", p, 1, 1, "    \
  TRANSA ", " TRANS ";\n}\n"
#define FA_SM90_WGMMA_RS(N, TYPE, ACC, A, DB, SCALE, TRANS)                                       \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                              \
  "wgmma.mma_async.sync.aligned.m64n" N "k16.f32." TYPE "." TYPE " " ACC ", " A ", " DB ", p, 1, 1, " \
  TRANS ";\n}\n"

// One asm statement for T's PTX type name (bf16 or f16), the only difference between the two element types.
#define FA_SM90_ASM_FOR_TYPE(PTX_FOR_TYPE, OUTS, INS)                                                  \
  if constexpr (ElementTraits<T>::is_bf16)                                                            \
    asm volatile(PTX_FOR_TYPE("bf16") : OUTS : INS);                                                  \
  else                                                                                                \
    asm volatile(PTX_FOR_TYPE("f16") : OUTS : INS)

// ---- FP8 (e4m3) inputs: wgmma .k32, K-major operands only ----
// The element type of float8_e4m3fn inputs. Its wgmma reads 32 K-elements per instruction, which in bytes is the
// 16-bit k16 step (32 bytes of each 128-byte swizzled row): descriptors and their steps are the same byte for
// byte. FP8 wgmma has no transpose: both shared-memory operands are K-major (the forward stores V transposed,
// fp8_v_layout.h). Its A-from-registers fragment is the 16-bit one with each 16-bit element replaced by two
// consecutive 8-bit ones: a[0] = (row 16w + g, K bytes 4q..4q+3), a[1] = (row + 8, same), a[2] = (row, 16 + 4q..+3),
// a[3] = (row + 8, 16 + 4q..+3).
using Fp8 = __nv_fp8_e4m3;
template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, Fp8>;
// K-elements of one wgmma for element type T.
template <typename T>
constexpr int kWgmmaKFor = kIsFp8<T> ? 32 : kWgmmaK;

#define FA_SM90_WGMMA_SS_FP8(N, ACC, DA, DB, SCALE)                                                       \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                                     \
  "wgmma.mma_async.sync.aligned.m64n" N "k32.f32.e4m3.e4m3 " ACC ", " DA ", " DB ", p, 1, 1;\n}\n"
#define FA_SM90_WGMMA_RS_FP8(N, ACC, A, DB, SCALE)                                                        \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                                     \
  "wgmma.mma_async.sync.aligned.m64n" N "k32.f32.e4m3.e4m3 " ACC ", " A ", " DB ", p, 1, 1;\n}\n"

// D(64 x N) (+)= A(64 x 32, shared, K-major) * B(32 x N, shared, K-major), e4m3 inputs. N: the FP8 forward's key
// tile.
template <int N>
__device__ __forceinline__ void wgmma_ss_fp8(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 128, "wgmma_ss_fp8: N must be 128");
  const uint32_t acc = accumulate ? 1u : 0u;
  asm volatile(FA_SM90_WGMMA_SS_FP8("128", FA_SM90_ACC_REGS_64, "%64", "%65", "%66")
               : FA_SM90_D64(d) : "l"(desc_a), "l"(desc_b), "r"(acc));
}

// D(64 x N) (+)= A(64 x 32, registers: the fragment above) * B(32 x N, shared, K-major), e4m3 inputs.
template <int N>
__device__ __forceinline__ void wgmma_rs_fp8(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                             bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "wgmma_rs_fp8: N must be 64, 128 or 256");
  const uint32_t acc = accumulate ? 1u : 0u;
  if constexpr (N == 64) {
    asm volatile(FA_SM90_WGMMA_RS_FP8("64", FA_SM90_ACC_REGS_32, "{%32, %33, %34, %35}", "%36", "%37")
                 : FA_SM90_D32(d, 0) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc));
  } else if constexpr (N == 128) {
    asm volatile(FA_SM90_WGMMA_RS_FP8("128", FA_SM90_ACC_REGS_64, "{%64, %65, %66, %67}", "%68", "%69")
                 : FA_SM90_D64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc));
  } else {
    asm volatile(FA_SM90_WGMMA_RS_FP8("256", FA_SM90_ACC_REGS_128, "{%128, %129, %130, %131}", "%132", "%133")
                 : FA_SM90_D128(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc));
  }
}

// Four floats rounded to e4m3 (nearest, saturating at +-448) in one register, the first in the low byte.
__device__ __forceinline__ uint32_t pack_fp8x4(float x0, float x1, float x2, float x3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x2, x3), __NV_SATFINITE, __NV_E4M3);
  return lo | hi << 16;
}

// The e4m3 A operand for K-slots 32kk..32kk+31 of a product whose previous accumulator (over 32 keys, N = keys)
// is `acc`, without moving data between threads: the thread's own keys 2q, 2q+1, 8+2q, 9+2q (+16) fill its slots
// 4q..4q+3 (+16). Slot s of a 32-key group therefore holds key fp8_key_of_slot(s) (fp8_v_layout.h), and the other
// operand (V) must be stored in that order.
template <int kAccRegs>
__device__ __forceinline__ void accumulator_to_a_fragment_fp8(uint32_t (&a)[4], const float (&acc)[kAccRegs], int kk) {
  const int j = 4 * kk;  // the four 8-column blocks j..j+3 make up 32 keys
#pragma unroll
  for (int h = 0; h < 2; ++h)      // keys 0-15, 16-31 of the group: registers 0-1, 2-3
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // the thread's rows g, g + 8
      const int b = 4 * (j + 2 * h) + 2 * r;
      a[2 * h + r] = pack_fp8x4(acc[b], acc[b + 1], acc[b + 4], acc[b + 5]);
    }
}

// D(64 x N) (+)= A(64 x 16, shared; K-major if kTransA == 0, M-major if 1) * B(16 x N, shared; K-major if
// kTransB == 0, N-major if 1). The M-major A serves products whose left operand is stored transposed (the
// backward's dQ = dS K, with dS kept as dSᵀ). Operands after the N/2 accumulators: desc_a, desc_b, accumulate,
// kTransB, kTransA.
template <typename T, int N, int kTransB, int kTransA = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  if constexpr (kIsFp8<T>) {
    static_assert(kTransA == 0 && kTransB == 0, "wgmma_ss: e4m3 operands are K-major");
    wgmma_ss_fp8<N>(d, desc_a, desc_b, accumulate);
  } else {
    static_assert(N == 32 || N == 64 || N == 80 || N == 128 || N == 176 || N == 256,
                  "wgmma_ss: N must be 32, 64, 80, 128, 176 or 256");
    const uint32_t acc = accumulate ? 1u : 0u;
#define FA_SM90_SS_INS "l"(desc_a), "l"(desc_b), "r"(acc), "n"(kTransB), "n"(kTransA)
#define FA_SM90_SS32(TYPE) FA_SM90_WGMMA_SS("32", TYPE, FA_SM90_ACC_REGS_16, "%16", "%17", "%18", "%19", "%20")
#define FA_SM90_SS64(TYPE) FA_SM90_WGMMA_SS("64", TYPE, FA_SM90_ACC_REGS_32, "%32", "%33", "%34", "%35", "%36")
#define FA_SM90_SS80(TYPE) FA_SM90_WGMMA_SS("80", TYPE, FA_SM90_ACC_REGS_40, "%40", "%41", "%42", "%43", "%44")
#define FA_SM90_SS128(TYPE) FA_SM90_WGMMA_SS("128", TYPE, FA_SM90_ACC_REGS_64, "%64", "%65", "%66", "%67", "%68")
#define FA_SM90_SS176(TYPE) FA_SM90_WGMMA_SS("176", TYPE, FA_SM90_ACC_REGS_88, "%88", "%89", "%90", "%91", "%92")
#define FA_SM90_SS256(TYPE) \
  FA_SM90_WGMMA_SS("256", TYPE, FA_SM90_ACC_REGS_128, "%128", "%129", "%130", "%131", "%132")
    if constexpr (N == 32) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_SS32, FA_SM90_D16(d), FA_SM90_SS_INS);
    } else if constexpr (N == 80) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_SS80, FA_SM90_D40(d), FA_SM90_SS_INS);
    } else if constexpr (N == 176) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_SS176, FA_SM90_D88(d), FA_SM90_SS_INS);
    } else if constexpr (N == 64) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_SS64, FA_SM90_D32(d, 0), FA_SM90_SS_INS);
    } else if constexpr (N == 128) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_SS128, FA_SM90_D64(d), FA_SM90_SS_INS);
    } else {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_SS256, FA_SM90_D128(d), FA_SM90_SS_INS);
    }
  }
#undef FA_SM90_SS_INS
#undef FA_SM90_SS32
#undef FA_SM90_SS64
#undef FA_SM90_SS80
#undef FA_SM90_SS128
#undef FA_SM90_SS176
#undef FA_SM90_SS256
}

// D(64 x N) (+)= A(64 x 16, registers, layout above) * B(16 x N, shared; K-major if kTransB == 0, else N-major).
// Operands after the N/2 accumulators: a0..a3, desc_b, accumulate, kTransB.
template <typename T, int N, int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                         bool accumulate) {
  if constexpr (kIsFp8<T>) {
    static_assert(kTransB == 0, "wgmma_rs: e4m3 operands are K-major");
    wgmma_rs_fp8<N>(d, a, desc_b, accumulate);
  } else {
    static_assert(N == 64 || N == 96 || N == 128 || N == 192 || N == 256,
                  "wgmma_rs: N must be 64, 96, 128, 192 or 256");
    const uint32_t acc = accumulate ? 1u : 0u;
#define FA_SM90_RS_INS "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc), "n"(kTransB)
#define FA_SM90_RS64(TYPE) \
  FA_SM90_WGMMA_RS("64", TYPE, FA_SM90_ACC_REGS_32, "{%32, %33, %34, %35}", "%36", "%37", "%38")
#define FA_SM90_RS96(TYPE) \
  FA_SM90_WGMMA_RS("96", TYPE, FA_SM90_ACC_REGS_48, "{%48, %49, %50, %51}", "%52", "%53", "%54")
#define FA_SM90_RS128(TYPE) \
  FA_SM90_WGMMA_RS("128", TYPE, FA_SM90_ACC_REGS_64, "{%64, %65, %66, %67}", "%68", "%69", "%70")
#define FA_SM90_RS192(TYPE) \
  FA_SM90_WGMMA_RS("192", TYPE, FA_SM90_ACC_REGS_96, "{%96, %97, %98, %99}", "%100", "%101", "%102")
#define FA_SM90_RS256(TYPE) \
  FA_SM90_WGMMA_RS("256", TYPE, FA_SM90_ACC_REGS_128, "{%128, %129, %130, %131}", "%132", "%133", "%134")
    if constexpr (N == 64) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_RS64, FA_SM90_D32(d, 0), FA_SM90_RS_INS);
    } else if constexpr (N == 96) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_RS96, FA_SM90_D48(d), FA_SM90_RS_INS);
    } else if constexpr (N == 128) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_RS128, FA_SM90_D64(d), FA_SM90_RS_INS);
    } else if constexpr (N == 192) {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_RS192, FA_SM90_D96(d), FA_SM90_RS_INS);
    } else {
      FA_SM90_ASM_FOR_TYPE(FA_SM90_RS256, FA_SM90_D128(d), FA_SM90_RS_INS);
    }
  }
#undef FA_SM90_RS_INS
#undef FA_SM90_RS64
#undef FA_SM90_RS96
#undef FA_SM90_RS128
#undef FA_SM90_RS192
#undef FA_SM90_RS256
}

// The A operand for keys 16kk..16kk+15 of a product whose previous accumulator (over those keys, N = keys)
// is `acc`: same thread, same rows, so conversion is register-local (see the layout comment at the top).
template <typename T, int kAccRegs>
__device__ __forceinline__ void accumulator_to_a_fragment(uint32_t (&a)[4], const float (&acc)[kAccRegs], int kk) {
  const int j = 2 * kk;  // the two 8-column blocks j, j+1 make up 16 keys
  a[0] = pack_pair<T>(acc[4 * j + 0], acc[4 * j + 1]);
  a[1] = pack_pair<T>(acc[4 * j + 2], acc[4 * j + 3]);
  a[2] = pack_pair<T>(acc[4 * j + 4], acc[4 * j + 5]);
  a[3] = pack_pair<T>(acc[4 * j + 6], acc[4 * j + 7]);
}

// ---- register reallocation between warpgroups (setmaxnreg) ----
// Takes effect only under a register cap at entry (__launch_bounds__(threads, 1)); every warp of the
// warpgroup must execute the same one. kRegs: a multiple of 8 in [24, 256].
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_increase() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_decrease() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- named barriers (bar.sync / bar.arrive on ids other than __syncthreads' 0) ----
// `threads` counts every thread that takes part, arriving or waiting; a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// named_barrier_sync for threads that reach the barrier from different instructions (code copies of their own):
// bar.sync is barrier.sync.aligned, which requires every thread to execute the same one.
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- shared memory ----
// The dynamic shared-memory window rounded up to a swizzle atom: 128-byte-swizzled tiles (TMA boxes, wgmma
// descriptors with base offset 0) must start on a 1024-byte boundary, which the window does not promise.
__device__ __forceinline__ uint8_t* align_to_swizzle_atom(uint8_t* raw) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(raw);
  return reinterpret_cast<uint8_t*>((p + kSwizzleAtomBytes - 1) & ~uintptr_t(kSwizzleAtomBytes - 1));
}

// ---- mbarriers (shared-memory transaction barriers) ----
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  ::cuda::ptx::mbarrier_init(bar, arrivals);
}
// Makes initialised barriers visible to the async proxy (TMA) before any thread uses them; follow with a
// block-wide barrier.
__device__ __forceinline__ void mbarrier_init_fence() {
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) { (void)::cuda::ptx::mbarrier_arrive(bar); }
// One arrival that also announces `bytes` of TMA transactions the current phase must wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  (void)::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                               ::cuda::ptx::space_shared, bar, bytes);
}
// Blocks until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so waiting on
// parity 1 returns at once: that is how a producer sees every slot of a new ring as free.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

// ---- thread-block clusters: another CTA's shared memory (distributed shared memory) ----
// cluster_cta_rank, cluster_sync, cluster_shared_address: cuda/cluster.cuh.
// One arrival on a barrier of any CTA of the cluster (cluster_shared_address), releasing this thread's earlier
// memory operations at cluster scope: what it wrote (st_shared_cluster) is seen by whoever waits with
// mbarrier_wait_cluster. The release compiles to MEMBAR.ALL.GPU, which waits for every outstanding store of the
// thread (global ones included): keep it off hot loops.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival on a barrier of any CTA of the cluster that says "this CTA has finished reading the buffer" (a K / V
// slot, a tile number): a CTA-scope release, as CUTLASS's cluster barriers arrive, so no GPU-wide fence. It
// publishes no data; a TMA load that overwrites the buffer after the barrier completes is ordered by it. The reads
// must have returned before it issues: wgmma's do once waited for, a plain load's does not (ld_shared_acquire_cluster).
__device__ __forceinline__ void mbarrier_arrive_cluster_after_reads(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// A 32-bit read of this CTA's shared memory that completes before any later memory operation of the thread
// (an acquire at cluster scope). For a value read before an arrival on another CTA's barrier that lets that CTA
// overwrite it: ptxas issues the remote arrival (SYNCS.ARRIVE...RED) without waiting for an earlier plain load's
// result, so the overwrite could land first and the load return the next value; the acquire load's CCTL waits for
// the value (SASS). Inline PTX: CCCL's ld has no acquire form for shared memory.
__device__ __forceinline__ int ld_shared_acquire_cluster(const int* local) {
  int value;
  asm volatile("ld.acquire.cluster.shared::cta.b32 %0, [%1];\n"
               : "=r"(value)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local)))
               : "memory");
  return value;
}
// A 32-bit store into any CTA of the cluster; a later mbarrier_arrive_cluster publishes it.
__device__ __forceinline__ void st_shared_cluster(uint32_t addr, uint32_t value) {
  asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}
// mbarrier_wait for a barrier that other CTAs of the cluster arrive on: acquires at cluster scope, so what they
// wrote before arriving (a remote store, their reads of a buffer this thread overwrites next) is ordered before.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(::cuda::ptx::sem_acquire, ::cuda::ptx::scope_cluster, bar, parity)) {
  }
}

// Position in a ring of kStages slots and the parity of the current pass over it: each slot's barrier
// completes once per pass, so the parity to wait for flips every time the index wraps.
template <int kStages>
struct RingPosition {
  int index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// A descriptor the compiler cannot see through, for a loop of wgmmas to step with desc_advance: re-encoding it
// costs about ten instructions per wgmma, and a transparent one lets the compiler hoist every step's descriptor
// out of the enclosing loop into registers (64 of them for the hd 256 backward's K and V).
__device__ __forceinline__ uint64_t opaque_desc(uint64_t desc) {
  asm volatile("" : "+l"(desc));
  return desc;
}

// opaque_desc of a descriptor that every lane of the warp computes alike, read from lane 0 so that the compiler
// sees it is warp-uniform: ptxas then keeps it, and the steps desc_advance takes from it, in uniform registers
// instead of moving it there (R2UR) before every wgmma.
__device__ __forceinline__ uint64_t warp_uniform_desc(uint64_t desc) {
  const uint32_t lo = __shfl_sync(0xffffffffu, uint32_t(desc), 0);
  const uint32_t hi = __shfl_sync(0xffffffffu, uint32_t(desc >> 32), 0);
  return opaque_desc(uint64_t(hi) << 32 | lo);
}

// ---- stmatrix ----
// Four 8 x 8 matrices of 16-bit elements from registers to shared memory: register i of every lane holds its
// accumulator-layout pair of matrix i (row lane / 4, columns 2 (lane % 4), +1), and lane l gives the address of
// row l % 8 of matrix l / 8 (16 contiguous bytes). CCCL has no wrapper for it.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- proxy fences ----
// Ordinary (generic-proxy) shared-memory stores that wgmma or TMA read next need this in each writing
// thread, before the barrier that publishes them.
__device__ __forceinline__ void fence_async_shared() { ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared); }

// ---- TMA: bulk tensor copies global -> shared, completing on an mbarrier ----
// `map` is a CUtensorMap (passed as a __grid_constant__ kernel parameter); coordinates innermost first,
// in elements. Out-of-range box elements arrive as zeros and still count toward the barrier's bytes.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const void* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_shared, ::cuda::ptx::space_global, smem_dst, map, coords,
                                    bar);
}

// tma_load_4d into the same shared-memory offset of every CTA in `cta_mask` (bit r: cluster rank r), each
// destination's barrier at `bar`'s offset receiving the box's bytes as transactions.
__device__ __forceinline__ void tma_load_4d_multicast(void* smem_dst, const void* map, int c0, int c1, int c2, int c3,
                                                      uint64_t* bar, uint16_t cta_mask) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem_dst, map, coords, bar,
                                    cta_mask);
}
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const void* map, int c0, int c1, uint64_t* bar) {
  const int32_t coords[2] = {c0, c1};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_shared, ::cuda::ptx::space_global, smem_dst, map, coords,
                                    bar);
}

// ---- bulk reduce-add: shared -> global, tracked by the issuing thread's bulk groups ----
// gmem[0 .. bytes/4) += smem[0 .. bytes/4) as fp32, one asynchronous operation (both 16-byte aligned, bytes a
// multiple of 16). The shared memory it reads must be published by fence_async_shared in the writing threads.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
  ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared, ::cuda::ptx::op_add, gmem,
                                    smem, bytes);
}
// gmem[0 .. bytes/4) = smem[0 .. bytes/4): bulk_reduce_add_f32's plain copy, with the same rules.
__device__ __forceinline__ void bulk_store_f32(float* gmem, const float* smem, uint32_t bytes) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared, gmem, smem, bytes);
}
__device__ __forceinline__ void bulk_commit() { ::cuda::ptx::cp_async_bulk_commit_group(); }
// Until the shared memory of every committed group but the newest kPending has been read (it may be reused).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<kPending>{});
}
// Until every committed group but the newest kPending has completed (its global writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<kPending>{});
}

// Orders this thread's generic-proxy global accesses before its later async-proxy (bulk) ones, and the bulk
// operations it has completed before its later generic ones.
__device__ __forceinline__ void fence_async_global() { ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_global); }

// ---- a GPU-wide turn counter (deterministic reductions) ----
// Waits until *counter == turn (acquire); traps after about 4 s, so that a protocol bug fails the launch
// instead of hanging the device.
__device__ __forceinline__ void wait_for_turn(const int* counter, int turn) {
  ::cuda::atomic_ref<const int, ::cuda::thread_scope_device> c(*counter);
  for (uint32_t spins = 0; c.load(::cuda::memory_order_acquire) != turn; ++spins) {
    if (spins > (1u << 27)) __trap();
    __nanosleep(32);
  }
}
// Passes the turn on (release: this thread's earlier global writes are visible to the next holder).
__device__ __forceinline__ void pass_turn(int* counter) {
  ::cuda::atomic_ref<int, ::cuda::thread_scope_device>(*counter).fetch_add(1, ::cuda::memory_order_release);
}
// The same turns for bulk (async-proxy) writes: after take_bulk_turn, the bulk writes this thread issues come after
// the previous holder's; pass_bulk_turn waits for this thread's committed bulk writes to complete (not only to have
// read shared memory) and passes the turn on.
__device__ __forceinline__ void take_bulk_turn(const int* counter, int turn) {
  wait_for_turn(counter, turn);
  fence_async_global();
}
__device__ __forceinline__ void pass_bulk_turn(int* counter) {
  bulk_wait<0>();
  fence_async_global();
  pass_turn(counter);
}

// Pulls a tensor map's descriptor into the cache ahead of its first use.
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// ---- special-function unit math for the softmax ----
// 2^x as one MUFU.EX2 (ftz: the denormal results we lose are far below what P can hold in 16 bits).
// ex2(-inf) = +0, so masked scores vanish without a branch.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// tanh on the special-function unit (max relative error about 2^-11: below the 16-bit output's rounding).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashattn::cuda::sm90
