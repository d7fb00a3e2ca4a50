// Thread-block cluster primitives (sm_90 and later, not sm_90a-specific): the CTA's rank, the cluster barrier and
// another CTA's shared memory (distributed shared memory). Used by the Hopper kernels (primitives_sm90.cuh) and by
// the decode kernel's in-cluster combine of its key splits, which also compiles for sm_80: callers guard their uses
// with __CUDA_ARCH__ >= 900. Unit-tested on the GPU through tests/gpu/sm90_primitive_kernels.cu.
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace flashattn::cuda {

// This CTA's rank in its cluster (blockIdx.x % cluster size for one-dimensional clusters). Read anew at every
// call (a volatile read of the special register, where CCCL's get_sreg_cluster_ctarank lets the compiler keep the
// value): a thread short of registers then holds no register for it between uses.
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// Every thread of every CTA of the cluster: the arrive releases this thread's earlier shared-memory writes
// (barrier initialisation included) to the cluster, the wait acquires the others'. Also a barrier for the CTA.
__device__ __forceinline__ void cluster_sync() {
  ::cuda::ptx::barrier_cluster_arrive();
  ::cuda::ptx::barrier_cluster_wait();
}
// The shared::cluster address of the variable at `local` in the CTA of rank `rank`: the same offset in that CTA's
// window. Inline PTX: CCCL has no mapa, and its remote-arrive wrapper takes a generic pointer, not this address.
__device__ __forceinline__ uint32_t cluster_shared_address(const void* local, uint32_t rank) {
  uint32_t remote;
  asm("mapa.shared::cluster.u32 %0, %1, %2;\n"
      : "=r"(remote)
      : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  return remote;
}
// A float of any CTA of the cluster (cluster_shared_address), written before a cluster_sync both passed.
__device__ __forceinline__ float ld_shared_cluster_f32(uint32_t addr) {
  float value;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(value) : "r"(addr) : "memory");
  return value;
}

}  // namespace flashattn::cuda
