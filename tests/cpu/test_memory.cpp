// The flash path's extra memory does not grow with s_q · s_k. This binary replaces the global operator new /
// delete with counting versions (thread-safe atomics, every aligned and nothrow form), so it is built apart from
// the main suite. Every allocation the library makes goes through operator new (std::vector, AlignedBuffer).
#include <gtest/gtest.h>

#include <functional>

#include "common/host_tensor.h"
#include "cpu/heap_counter.h"  // replaces operator new / delete in this binary
#include "flashattn/flashattn.h"

namespace flashattn::test {
namespace {

using heap_counter::peak_extra_bytes;

struct Measured {
  int64_t forward, backward;
};

Measured measure(Backend backend, int64_t batch, int64_t s, int64_t heads_q, int64_t heads_kv) {
  const int64_t d = 16;  // small: the point is the length dependence, and this also runs under the sanitizers
  HostTensor q(DType::f32, {batch, s, heads_q, d}), k(DType::f32, {batch, s, heads_kv, d}), v(DType::f32, {batch, s, heads_kv, d});
  HostTensor o(DType::f32, {batch, s, heads_q, d}), lse(DType::f32, {batch, heads_q, s});
  HostTensor dout(DType::f32, o.shape()), dq(DType::f32, q.shape()), dk(DType::f32, k.shape()), dv(DType::f32, v.shape());
  std::mt19937_64 rng(1);
  for (HostTensor* t : {&q, &k, &v, &dout}) t->fill_normal(rng);
  BackwardArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = o.view(), a.lse = lse.view();
  a.dout = dout.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
  AttentionOptions opt;
  opt.backend = backend;
  opt.num_threads = 2;  // the per-thread buffers are part of the measure: keep their number fixed
  Measured m{};
  m.forward = peak_extra_bytes([&] { EXPECT_TRUE(attention_forward(a, opt).ok()); });
  m.backward = peak_extra_bytes([&] { EXPECT_TRUE(attention_backward(a, opt).ok()); });
  return m;
}

// The counter sees what it must: plain and aligned allocations, from the calling thread and from OpenMP workers.
TEST(Memory, CounterSeesEveryAllocation) {
  const int64_t n = 1 << 20;
  const int64_t live_before = heap_counter::live_bytes();
  const int64_t peak = peak_extra_bytes([&] {
    std::vector<float> plain(static_cast<size_t>(n));
    float* aligned = static_cast<float*>(::operator new(size_t(n) * sizeof(float), std::align_val_t(64)));
#pragma omp parallel num_threads(2)
    { std::vector<char> per_thread(static_cast<size_t>(n)); }
    ::operator delete(aligned, std::align_val_t(64));
  });
  EXPECT_GE(peak, 2 * n * int64_t(sizeof(float)) + n);
  EXPECT_EQ(heap_counter::live_bytes(), live_before);  // every form of delete found its block's size
}

// Doubling the sequence length (4x the scores) at most doubles the flash path's peak extra memory, and at
// s = 4096 it stays far below even one fp32 score matrix. Two shapes: one (batch, KV head) unit with grouped
// heads (the backward's split path, with partial buffers) and 16 units (its unsplit path).
TEST(Memory, FlashExtraMemoryIsLinearInSequenceLength) {
  struct Shape {
    int64_t batch, hq, hkv;
  } shapes[] = {{1, 2, 1}, {4, 4, 4}};
  const int64_t lengths[] = {1024, 2048, 4096};
  for (const Shape& sh : shapes) {
    Measured m[3];
    for (int i = 0; i < 3; ++i) m[i] = measure(Backend::cpu_flash, sh.batch, lengths[i], sh.hq, sh.hkv);
    const int64_t score_matrix = lengths[2] * lengths[2] * int64_t(sizeof(float));
    for (int pass = 0; pass < 2; ++pass) {
      const char* name = pass ? "backward" : "forward";
      int64_t bytes[3];
      for (int i = 0; i < 3; ++i) bytes[i] = pass ? m[i].backward : m[i].forward;
      std::printf("[ memory   ] b=%ld h=%ld/%ld %s peak extra bytes: s=1024 %ld, s=2048 %ld, s=4096 %ld "
                  "(one s=4096 fp32 score matrix: %ld)\n",
                  long(sh.batch), long(sh.hq), long(sh.hkv), name, long(bytes[0]), long(bytes[1]), long(bytes[2]),
                  long(score_matrix));
      for (int i = 1; i < 3; ++i) {
        // 10% and 256 KiB of slack for the fixed per-thread tile buffers and bookkeeping; O(s²) would be 4x.
        EXPECT_LE(bytes[i], bytes[i - 1] * 22 / 10 + (256 << 10)) << name << " from s=" << lengths[i - 1];
      }
      EXPECT_LT(bytes[2], score_matrix / 2) << name;
    }
  }
}

}  // namespace
}  // namespace flashattn::test
