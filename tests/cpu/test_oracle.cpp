// The oracle (tests/common/oracle.h) against the library's own semantics, from both sides: the library's
// reference backend and its mask arithmetic (src/common/mask.h, which every kernel reads) must agree with the
// oracle's few lines of definition on a grid of masks, lengths, windows, scales, softcaps, GQA and varlen; and the
// library's 16-bit conversions, and the values every backend stores, must be the round-to-nearest-even of the
// exact result, ties included.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/dropout.h"
#include "common/half.h"
#include "common/mask.h"
#include "cpu/attention_problem.h"
#include "cpu/vec_math.h"

namespace flashattn::test {
namespace {

// ---- the reference backend ----

std::vector<AttnCase> reference_cases() {
  std::vector<AttnCase> cases;
  AttnCase c;
  c.dtype = DType::f64, c.batch = 2, c.h_q = 4, c.h_kv = 2, c.d = 12, c.dv = 7;
  struct Mask {
    bool causal;
    int64_t left, right;
  };
  // Windows of 0, inside and past the lengths (past 2^32, and up to the largest int64, which the library narrows
  // to the same window), on either side, with and without causal.
  const int64_t huge = (int64_t(1) << 32) + 3;
  const Mask masks[] = {{false, -1, -1}, {true, -1, -1}, {false, 0, 0}, {false, 2, -1}, {false, -1, 1},
                        {true, 3, -1},   {false, 1, 4},  {true, 0, -1}, {false, huge, huge}, {true, huge, -1},
                        {false, 30, 0},  {false, INT64_MAX, INT64_MAX}, {false, INT64_MAX - 5, 2}};
  const int64_t lens[][2] = {{1, 1}, {5, 9}, {9, 5}, {17, 17}, {1, 12}, {12, 1}};
  int n = 0;
  for (const Mask& m : masks)
    for (const auto& l : lens) {
      c.causal = m.causal, c.window_left = m.left, c.window_right = m.right;
      c.s_q = l[0], c.s_k = l[1];
      c.softmax_scale = n % 3 == 0 ? 0 : n % 3 == 1 ? 0.31 : 1.7;
      c.softcap = n % 4 == 3 ? 2.5 : 0;
      c.h_q = n % 2 ? 4 : 3, c.h_kv = n % 2 ? 2 : 1;
      c.alibi = n % 5 == 1 ? AttnCase::Alibi::per_head : n % 5 == 3 ? AttnCase::Alibi::per_batch : AttnCase::Alibi::none;
      c.dropout_p = n % 7 == 2 ? 0.4 : 0;
      cases.push_back(c);
      ++n;
    }
  // Varlen, empty sequences on either side, in both layouts.
  c = AttnCase{};
  c.dtype = DType::f64, c.h_q = 2, c.h_kv = 1, c.d = 8, c.dv = 8;
  c.lens_q = {3, 0, 7, 1}, c.lens_k = {5, 2, 0, 6};
  for (const Mask& m : masks) {
    c.causal = m.causal, c.window_left = m.left, c.window_right = m.right;
    c.softmax_scale = m.causal ? 0.6 : 0;
    c.layout = m.left == 2 ? Layout::bhsd : Layout::bshd;
    c.alibi = m.right == 1 || m.right == 2 ? AttnCase::Alibi::per_batch : AttnCase::Alibi::none;
    cases.push_back(c);
  }
  return cases;
}

// Philox 4x32-10, the library's and the tests' own, against Random123's known-answer vectors (kat_vectors:
// counter, key, result).
TEST(Oracle, PhiloxKnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    uint32_t lib[4];
    philox4x32_10(k.ctr, k.key[0], k.key[1], lib);
    const Philox4 ref = philox4x32_10_reference({k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}, {k.key[0], k.key[1]});
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(lib[w], k.out[w]) << "library word " << w;
      EXPECT_EQ(ref[size_t(w)], k.out[w]) << "reference word " << w;
    }
  }
}

// The library's dropout mask is the documented one (philox_reference.h), its groups and slots a bijection onto the
// keys, and its keep rate 1 - p within statistical bounds.
TEST(Oracle, DropoutMaskIsTheDocumentedOne) {
  for (int64_t j = 0; j < 200; ++j)
    EXPECT_EQ(DropoutSpec::key_of(DropoutSpec::group_of(j), DropoutSpec::slot_of(j)), j) << j;
  for (float p : {0.1f, 0.3f, 0.5f, 0.9f}) {
    const uint64_t seed = 0x1234abcd5678ull, offset = 77;
    const DropoutSpec d = DropoutSpec::make(p, seed, offset, 3, 5);
    int64_t kept = 0, n = 0, differ = 0;
    for (int64_t i = 0; i < 300; ++i)
      for (int64_t j = 0; j < 700; ++j, ++n) {
        const bool k = d.keep(i, j);
        kept += k;
        differ += k != dropout_kept(p, seed, offset, 3, 5, i, j);
      }
    EXPECT_EQ(differ, 0) << "p " << p;
    const double rate = double(kept) / double(n), sigma = std::sqrt(double(p) * (1 - double(p)) / double(n));
    EXPECT_LT(std::fabs(rate - (1 - double(p))), 5 * sigma) << "p " << p << " keep rate " << rate;
  }
}

// kept_slots (the GPU kernels' eight keep decisions per Philox call) says what keep says for each key of the
// group, at keep rates down to 0 and up to the last threshold below 2^16.
TEST(Oracle, DropoutKeptSlotsAgreeWithKeep) {
  for (float p : {0.9999f, 0.5f, 0.1f, 1.f / 65536.f, 0.f + 1.5f / 65536.f}) {
    const DropoutSpec d = DropoutSpec::make(p, 0x9e3779b97f4a7c15ull, 12, 1, 2);
    ASSERT_TRUE(d.active()) << p;
    int64_t differ = 0;
    for (int64_t i = 0; i < 64; ++i)
      for (uint32_t g = 0; g < 64; ++g) {
        const uint32_t slots = d.kept_slots(i, g);
        for (int s = 0; s < DropoutSpec::kKeysPerGroup; ++s)
          differ += bool(slots >> s & 1u) != d.keep(i, DropoutSpec::key_of(g, s));
      }
    EXPECT_EQ(differ, 0) << "p " << p;
  }
}

// The reference in fp64 is the oracle's arithmetic in another order: every element within a few fp64 units of the
// terms it sums, LSE within its fp32 storage.
TEST(Oracle, ReferenceBackendAgrees) {
  for (const AttnCase& c : reference_cases()) {
    SCOPED_TRACE(c.name());
    const AttnProblem pb(c, std::hash<std::string>{}(c.name()));
    const AttnResult ref = run_attention(pb, Backend::cpu_reference, true);
    const AttnResult want = oracle_for(pb, true);
    struct Out {
      const char* name;
      const std::vector<double>*got, *want, *mag;
      double rel;
    } outs[] = {{"O", &ref.o, &want.o, &want.o_mag, 1e-13},       {"LSE", &ref.lse, &want.lse, &want.lse_mag, 2 * 0x1p-24},
                {"dQ", &ref.dq, &want.dq, &want.dq_mag, 1e-13}, {"dK", &ref.dk, &want.dk, &want.dk_mag, 1e-13},
                {"dV", &ref.dv, &want.dv, &want.dv_mag, 1e-13}};
    for (const Out& o : outs) {
      std::vector<double> bound(o.want->size());
      for (size_t i = 0; i < bound.size(); ++i) bound[i] = o.rel * std::fabs((*o.want)[i]) + 1e-13 * (*o.mag)[i];
      std::string worst;
      EXPECT_EQ(count_outside(*o.got, *o.want, bound, &worst), 0) << o.name << ": worst " << worst;
    }
  }
}

// ---- MaskSpec, which every backend reads ----

// Every query of a sequence and every key range its methods answer for, against the definition.
TEST(Oracle, MaskSpecAgreesWithTheDefinition) {
  const int64_t huge = (int64_t(1) << 33) + 1;
  const int64_t edges[] = {-1, 0, 1, 2, 5, 40, huge};
  const int64_t lens[] = {0, 1, 2, 3, 5, 8};
  // Chunks of 1 key, of a few (rows crossing chunk edges inside every block), of the sequence and past it.
  const int64_t chunks[] = {0, 1, 2, 3, 5, 8, huge};
  const int64_t chunk_edges[] = {-1, 0, 2, huge};  // with a chunk: fewer windows, the same kinds of edge
  for (int64_t sq : lens)
    for (int64_t sk : lens)
      for (bool causal : {false, true})
        for (int64_t chunk : chunks)
          for (int64_t left : edges)
            for (int64_t right : edges) {
              if (chunk > 0 && (std::count(std::begin(chunk_edges), std::end(chunk_edges), left) == 0 ||
                                std::count(std::begin(chunk_edges), std::end(chunk_edges), right) == 0))
                continue;
              AttnSpec spec;
              spec.causal = causal, spec.window_left = left, spec.window_right = right, spec.attention_chunk = chunk;
              const MaskSpec mask = MaskSpec::make(sq, sk, causal, left, right, chunk);
              const std::string where = "sq " + std::to_string(sq) + " sk " + std::to_string(sk) + (causal ? " causal" : "") +
                                        " window " + std::to_string(left) + "," + std::to_string(right) + " chunk " +
                                        std::to_string(chunk);
              // The narrowest edges that mean the same (the kernels' 32-bit arguments) see the same keys.
              const MaskSpec narrow = MaskSpec::make(sq, sk, causal, MaskSpec::narrowest_left(left, sk),
                                                     MaskSpec::narrowest_right(right, sq),
                                                     MaskSpec::narrowest_chunk(chunk, sk));
              for (int64_t i = 0; i < sq; ++i) {
                int64_t first = -1, last = -1;
                for (int64_t j = -1; j <= sk; ++j) {
                  const bool sees = spec.sees(i, j, sq, sk);
                  ASSERT_EQ(mask.visible(i, j), sees) << where << " i " << i << " j " << j;
                  ASSERT_EQ(narrow.visible(i, j), sees) << where << " narrowed, i " << i << " j " << j;
                  if (sees && first < 0) first = j;
                  if (sees) last = j;
                }
                int64_t lo, hi;
                mask.key_range(i, &lo, &hi);
                if (first < 0) {
                  ASSERT_GE(lo, hi) << where << " i " << i << ": a row that sees nothing has an empty range";
                } else {
                  ASSERT_EQ(lo, first) << where << " i " << i;
                  ASSERT_EQ(hi, last + 1) << where << " i " << i;
                }
              }
              // Row and key blocks: the ranges cover every visible pair (and are tight when their end rows and keys
              // see something); a tile is fully visible exactly when every pair in it is.
              for (int64_t rb = 0; rb < sq; ++rb)
                for (int64_t re = rb + 1; re <= sq; ++re) {
                  int64_t lo, hi;
                  mask.key_range_for_rows(rb, re, &lo, &hi);
                  for (int64_t i = rb; i < re; ++i)
                    for (int64_t j = 0; j < sk; ++j)
                      if (spec.sees(i, j, sq, sk)) ASSERT_TRUE(j >= lo && j < hi) << where << " rows " << rb << "-" << re;
                  for (int64_t kb = 0; kb < sk; ++kb)
                    for (int64_t ke = kb + 1; ke <= sk; ++ke) {
                      bool all = true;
                      for (int64_t i = rb; i < re; ++i)
                        for (int64_t j = kb; j < ke; ++j) all = all && spec.sees(i, j, sq, sk);
                      ASSERT_EQ(mask.tile_fully_visible(rb, re, kb, ke), all)
                          << where << " tile " << rb << "-" << re << " x " << kb << "-" << ke;
                    }
                }
              // The rows that see every key of a key block: exactly those whose row sees each of them.
              for (int64_t kb = 0; kb < sk; ++kb)
                for (int64_t ke = kb + 1; ke <= sk; ++ke) {
                  int64_t lo, hi;
                  mask.rows_seeing_all_keys(kb, ke, &lo, &hi);
                  for (int64_t i = 0; i < sq; ++i) {
                    bool all = true;
                    for (int64_t j = kb; j < ke; ++j) all = all && spec.sees(i, j, sq, sk);
                    ASSERT_EQ(i >= lo && i < hi, all) << where << " keys " << kb << "-" << ke << " row " << i;
                  }
                }
              for (int64_t kb = 0; kb < sk; ++kb)
                for (int64_t ke = kb + 1; ke <= sk; ++ke) {
                  int64_t lo, hi, first = -1, last = -1;
                  mask.query_range_for_keys(kb, ke, &lo, &hi);
                  for (int64_t i = 0; i < sq; ++i)
                    for (int64_t j = kb; j < ke; ++j)
                      if (spec.sees(i, j, sq, sk)) {
                        ASSERT_TRUE(i >= lo && i < hi) << where << " keys " << kb << "-" << ke << " query " << i;
                        if (first < 0) first = i;
                        last = i;
                      }
                  if (first >= 0) {
                    ASSERT_EQ(lo, first) << where << " keys " << kb << "-" << ke;
                    ASSERT_EQ(hi, last + 1) << where << " keys " << kb << "-" << ke;
                  }
                }
            }
}

// ---- rounding of stores ----

// Every narrowing the library stores with (src/common/half.h for the reference and the tests' inputs,
// src/cpu/vec_math.h for the flash path) against the definition.
TEST(Oracle, LibraryConversionsRoundToNearestEven) {
  for (DType t : {DType::bf16, DType::f16}) {
    int64_t wrong = 0;
    std::string first;
    for (float x : rounding_probes(t)) {
      const double want = round_to_storage(t, x);
      double got[3];
      if (t == DType::bf16) {
        got[0] = to_float(to_bfloat16(x));
        got[1] = to_float(detail::narrow<bfloat16_t>(x));
        got[2] = to_float(from_double<bfloat16_t>(double(x)));
      } else {
        got[0] = to_float(to_half(x));
        got[1] = to_float(detail::narrow<half_t>(x));
        got[2] = to_float(from_double<half_t>(double(x)));
      }
      for (double g : got)
        if (!(g == want && std::signbit(g) == std::signbit(want))) {
          if (wrong++ == 0) first = std::to_string(x) + " gave " + std::to_string(g) + ", want " + std::to_string(want);
        }
    }
    EXPECT_EQ(wrong, 0) << dtype_name(t) << ": first " << first;
    // NaN stays NaN.
    EXPECT_TRUE(std::isnan(t == DType::bf16 ? to_float(to_bfloat16(NAN)) : to_float(to_half(NAN))));
    EXPECT_TRUE(std::isnan(t == DType::bf16 ? to_float(detail::narrow<bfloat16_t>(NAN))
                                            : to_float(detail::narrow<half_t>(NAN))));
  }
  // The definition itself, at a few points worked by hand.
  EXPECT_EQ(round_to_storage(DType::bf16, 1 + 0x1p-8), 1.0);               // tie, to even
  EXPECT_EQ(round_to_storage(DType::bf16, 1 + 3 * 0x1p-8), 1 + 0x1p-6);    // tie, to even (up)
  EXPECT_EQ(round_to_storage(DType::bf16, 1 + 0x1p-8 + 0x1p-20), 1 + 0x1p-7);
  EXPECT_EQ(round_to_storage(DType::f16, 65519.0), 65504.0);
  EXPECT_EQ(round_to_storage(DType::f16, 65520.0), INFINITY);
  EXPECT_EQ(round_to_storage(DType::f16, 0x1p-25), 0.0);                   // tie with 0, to even
  EXPECT_EQ(round_to_storage(DType::f16, 3 * 0x1p-25), 0x1p-23);           // subnormal tie, to even
}

// Exactly computable attention, so that every store is checked against the rounding of the exact value:
// - forward: four keys with the same K row give every query the same four probabilities, 1/4 exactly, so O is
//   the mean of four rows of V, exact in fp32 and mostly between two 16-bit values (a quarter of them ties);
// - backward: one key and Q = 0 give P = 1 and LSE = 0 exactly, so dV is the plain sum of dO's rows and dK = 0.
TEST(Oracle, BackendsStoreTheRoundedExactValue) {
  for (Backend backend : {Backend::cpu_reference, Backend::cpu_flash})
    for (DType dt : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dt));
      std::mt19937_64 rng(3);
      std::uniform_real_distribution<double> unit(1.0, 2.0);
      AttnCase c;
      c.dtype = dt, c.s_q = 8, c.s_k = 4, c.h_q = 2, c.h_kv = 1, c.d = 16, c.dv = 64;
      AttnProblem pb(c, 1);
      HostTensor q = pb.q(), k = pb.k(), v = pb.v();
      for (int64_t j = 0; j < c.s_k; ++j)
        for (int64_t x = 0; x < c.d; ++x) k.set(k.offset({0, j, 0, x}), k.get(k.offset({0, 0, 0, x})));
      v.for_each([&](int64_t off) { v.set(off, (rng() % 2 ? 1 : -1) * unit(rng)); });
      HostTensor out = pb.alloc_out(dt);
      out.poison();
      ASSERT_TRUE(attention_forward(pb.forward_args(q, k, v, out, nullptr), c.options(backend)).ok());
      const std::vector<double> vv = v.values(), got = out.values();
      int64_t wrong = 0;
      for (int64_t h = 0; h < c.h_q; ++h)
        for (int64_t i = 0; i < c.s_q; ++i)
          for (int64_t x = 0; x < c.dv; ++x) {
            double sum = 0;
            for (int64_t j = 0; j < c.s_k; ++j) sum += vv[size_t(j * c.dv + x)];
            wrong += got[size_t((i * c.h_q + h) * c.dv + x)] != round_to_storage(dt, sum / 4);
          }
      EXPECT_EQ(wrong, 0) << "O elements that are not the rounded mean of V";

      AttnCase b = c;
      b.s_q = 4, b.s_k = 1;
      AttnProblem pb1(b, 2);
      HostTensor q0 = pb1.q(), dout = pb1.dout();
      q0.for_each([&](int64_t off) { q0.set(off, 0.0); });
      dout.for_each([&](int64_t off) { dout.set(off, (rng() % 2 ? 1 : -1) * unit(rng)); });
      HostTensor o1 = pb1.alloc_out(dt), lse1 = pb1.alloc_lse();
      BackwardArgs a;
      static_cast<ForwardArgs&>(a) = pb1.forward_args(q0, pb1.k(), pb1.v(), o1, &lse1);
      ASSERT_TRUE(attention_forward(a, b.options(backend)).ok());
      HostTensor dq = pb1.alloc(dt, true, b.h_q, b.d), dk = pb1.alloc(dt, false, b.h_kv, b.d);
      HostTensor dv = pb1.alloc(dt, false, b.h_kv, b.dv);
      a.dout = dout.view(), a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
      ASSERT_TRUE(attention_backward(a, b.options(backend)).ok());
      const std::vector<double> dov = dout.values(), dvv = dv.values(), dkv = dk.values();
      wrong = 0;
      for (int64_t x = 0; x < b.dv; ++x) {
        double sum = 0;  // both query heads share the one KV head
        for (int64_t h = 0; h < b.h_q; ++h)
          for (int64_t i = 0; i < b.s_q; ++i) sum += dov[size_t((i * b.h_q + h) * b.dv + x)];
        wrong += dvv[size_t(x)] != round_to_storage(dt, sum);
      }
      EXPECT_EQ(wrong, 0) << "dV elements that are not the rounded sum of dO";
      for (double x : dkv) EXPECT_EQ(x, 0.0);
    }
}

}  // namespace
}  // namespace flashattn::test
