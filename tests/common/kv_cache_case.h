// One KV-cache call (flash_attn_with_kvcache) as a test describes it, shared by the CPU and GPU suites: a dense or
// paged cache filled at random, index tensors, new rows and rotary tables; the expected cache after appending and
// the expected output, computed here from the documented semantics (include/flashattn/flashattn.h, KVCacheArgs)
// with the oracle (oracle.h) over the gathered keys; and the checks (cache bitwise, O per element, LSE).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "common/oracle.h"
#include "common/rounding.h"

namespace flashattn::test {

struct KVCaseSpec {
  DType dtype = DType::bf16;
  int64_t batch = 2, s_q = 1, h_q = 4, h_kv = 1, d = 64, d_v = 64;
  int64_t capacity = 100;  // rows per cache entry (paged: rounded up to whole pages)
  int64_t page_size = 0;   // 0 = dense
  int64_t s_new = 0;       // rows appended
  bool leftpad = false, batch_idx = false, with_seqlens = true;
  int64_t rotary_dim = 0;
  bool interleaved = true;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  int64_t attention_chunk = 0;
  double softcap = 0;
  int num_splits = 0;
  bool full = false;  // every cache_seqlens at the capacity minus s_new (else random, zero included)
  bool varlen_q = false;    // q packed [total_q, h_q, d] with cu_seqlens_q; lengths in [0, s_q], the first s_q
  bool varlen_new = false;  // k_new / v_new packed with cu_seqlens_k_new; counts in [0, s_new], the last 0
  bool rotary_base = false; // rotary_seqlens given: random position bases instead of cache_seqlens
  uint64_t seed = 1;

  std::string name() const {
    std::ostringstream os;
    os << dtype_name(dtype) << "_b" << batch << "_sq" << s_q << "_h" << h_q << "x" << h_kv << "_d" << d;
    if (d_v != d) os << "v" << d_v;
    os << "_cap" << capacity << (page_size ? "_page" + std::to_string(page_size) : std::string("_dense"));
    if (s_new) os << "_new" << s_new;
    if (leftpad) os << "_leftpad";
    if (batch_idx) os << "_bidx";
    if (!with_seqlens) os << "_noseqlens";
    if (rotary_dim) os << "_rot" << rotary_dim << (interleaved ? "i" : "n");
    if (causal) os << "_causal";
    if (window_left >= 0 || window_right >= 0) os << "_win" << window_left << "_" << window_right;
    if (attention_chunk > 0) os << "_chunk" << attention_chunk;
    if (softcap > 0) os << "_cap" << softcap;
    if (varlen_q) os << "_varq";
    if (varlen_new) os << "_varnew";
    if (rotary_base) os << "_rotbase";
    os << "_splits" << num_splits << (full ? "_full" : "") << "_s" << seed;
    return os.str();
  }
};

struct KVCase {
  KVCaseSpec spec;
  int64_t entries = 0, pages_per_entry = 0, num_pages = 0, capacity = 0;
  HostTensor q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens, leftpad, batch_idx, block_table, out, lse;
  HostTensor cu_q, cu_new, rotary_seqlens;
  std::vector<int64_t> seqlens_v, leftpad_v, entry_v;
  std::vector<int64_t> lens_q, starts_q, new_v, new_starts, rotary_v;  // per sequence
  int64_t total_q = 0, total_new = 0;
  std::vector<int32_t> table_v;  // [entries, pages_per_entry]

  // Element offset of (entry, row, head, c) in a cache tensor with the given head dim.
  int64_t cache_offset(const HostTensor& t, int64_t e, int64_t row, int64_t h, int64_t c) const {
    if (spec.page_size == 0) return t.offset({e, row, h, c});
    const int64_t page = table_v[size_t(e * pages_per_entry + row / spec.page_size)];
    return t.offset({page, row % spec.page_size, h, c});
  }
};

inline KVCase make_kv_case(const KVCaseSpec& s) {
  KVCase c;
  c.spec = s;
  std::mt19937_64 rng(s.seed);
  c.entries = s.batch_idx ? s.batch + 2 : s.batch;
  if (s.page_size > 0) {
    c.pages_per_entry = (s.capacity + s.page_size - 1) / s.page_size;
    c.capacity = c.pages_per_entry * s.page_size;
    c.num_pages = c.entries * c.pages_per_entry + 3;  // a few pages no entry uses
    std::vector<int32_t> pages(size_t(c.num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    c.table_v.assign(pages.begin(), pages.begin() + c.entries * c.pages_per_entry);
    c.block_table = HostTensor(DType::i32, {c.entries, c.pages_per_entry});
    for (int64_t i = 0; i < c.entries * c.pages_per_entry; ++i) c.block_table.set(i, c.table_v[size_t(i)]);
    // Heads outermost inside a page (HND-like strides) for the V cache, to exercise strides.
    c.k_cache = HostTensor(s.dtype, {c.num_pages, s.page_size, s.h_kv, s.d});
    c.v_cache = HostTensor(s.dtype, {c.num_pages, s.page_size, s.h_kv, s.d_v}, {0, 2, 1, 3});
  } else {
    c.capacity = s.capacity;
    c.k_cache = HostTensor(s.dtype, {c.entries, c.capacity, s.h_kv, s.d}, {}, 8);
    c.v_cache = HostTensor(s.dtype, {c.entries, c.capacity, s.h_kv, s.d_v}, {0, 2, 1, 3});
  }
  c.k_cache.fill_normal(rng);
  c.v_cache.fill_normal(rng);
  // Query rows and new rows per sequence, packed (varlen) or padded.
  auto packed = [&](bool varlen, int64_t most, bool last_empty, std::vector<int64_t>* lens, std::vector<int64_t>* starts,
                    HostTensor* cu) {
    int64_t total = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      int64_t n = most;
      if (varlen) n = b == 0 ? most : std::uniform_int_distribution<int64_t>(0, most)(rng);
      if (varlen && last_empty && b == s.batch - 1 && s.batch > 1) n = 0;
      lens->push_back(n);
      starts->push_back(total);
      total += n;
    }
    if (varlen) {
      *cu = HostTensor(DType::i32, {s.batch + 1});
      for (int64_t b = 0; b <= s.batch; ++b) cu->set(b, double(b < s.batch ? (*starts)[size_t(b)] : total));
    }
    return total;
  };
  c.total_q = packed(s.varlen_q, s.s_q, false, &c.lens_q, &c.starts_q, &c.cu_q);
  c.total_new = packed(s.varlen_new, s.s_new, true, &c.new_v, &c.new_starts, &c.cu_new);
  if (s.varlen_q) {
    c.q = HostTensor(s.dtype, {c.total_q, s.h_q, s.d});
    c.out = HostTensor(s.dtype, {c.total_q, s.h_q, s.d_v});
    c.lse = HostTensor(DType::f32, {s.h_q, c.total_q});
  } else {
    c.q = HostTensor(s.dtype, {s.batch, s.s_q, s.h_q, s.d});
    c.out = HostTensor(s.dtype, {s.batch, s.s_q, s.h_q, s.d_v});
    c.lse = HostTensor(DType::f32, {s.batch, s.h_q, s.s_q});
  }
  c.q.fill_normal(rng);
  c.out.poison();
  c.lse.poison();

  // Entries: a permutation of some of the cache rows.
  std::vector<int64_t> perm(size_t(c.entries));
  std::iota(perm.begin(), perm.end(), 0);
  if (s.batch_idx) std::shuffle(perm.begin(), perm.end(), rng);
  c.entry_v.assign(perm.begin(), perm.begin() + s.batch);
  c.seqlens_v.resize(size_t(s.batch));
  c.leftpad_v.assign(size_t(s.batch), 0);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t most = c.capacity - s.s_new;
    c.seqlens_v[size_t(b)] =
        !s.with_seqlens ? c.capacity : s.full ? most : std::uniform_int_distribution<int64_t>(0, most)(rng);
    if (b == 0 && !s.full && s.with_seqlens) c.seqlens_v[0] = std::min<int64_t>(most, 0);  // an empty cache
    if (s.leftpad) {
      const int64_t end = c.seqlens_v[size_t(b)];
      c.leftpad_v[size_t(b)] = std::uniform_int_distribution<int64_t>(0, end)(rng);
    }
  }
  if (s.with_seqlens) {
    c.seqlens = HostTensor(DType::i32, {s.batch});
    for (int64_t b = 0; b < s.batch; ++b) c.seqlens.set(b, double(c.seqlens_v[size_t(b)]));
  }
  if (s.leftpad) {
    c.leftpad = HostTensor(DType::i32, {s.batch});
    for (int64_t b = 0; b < s.batch; ++b) c.leftpad.set(b, double(c.leftpad_v[size_t(b)]));
  }
  if (s.batch_idx) {
    c.batch_idx = HostTensor(DType::i32, {s.batch});
    for (int64_t b = 0; b < s.batch; ++b) c.batch_idx.set(b, double(c.entry_v[size_t(b)]));
  }
  if (s.s_new > 0 && s.varlen_new) {
    c.k_new = HostTensor(s.dtype, {c.total_new, s.h_kv, s.d});
    c.v_new = HostTensor(s.dtype, {c.total_new, s.h_kv, s.d_v}, {1, 0, 2});
    c.k_new.fill_normal(rng);
    c.v_new.fill_normal(rng);
  } else if (s.s_new > 0) {
    c.k_new = HostTensor(s.dtype, {s.batch, s.s_new, s.h_kv, s.d});
    c.v_new = HostTensor(s.dtype, {s.batch, s.s_new, s.h_kv, s.d_v}, {0, 2, 1, 3});
    c.k_new.fill_normal(rng);
    c.v_new.fill_normal(rng);
  }
  if (s.rotary_base) {
    // Bases anywhere the table covers: new rows reach base + s_new - 1 < capacity, queries base + s_q - 1.
    c.rotary_seqlens = HostTensor(DType::i32, {s.batch});
    for (int64_t b = 0; b < s.batch; ++b) {
      c.rotary_v.push_back(std::uniform_int_distribution<int64_t>(0, c.capacity - s.s_new)(rng));
      c.rotary_seqlens.set(b, double(c.rotary_v.back()));
    }
  }
  if (s.rotary_dim > 0) {
    const int64_t half = s.rotary_dim / 2;
    // Positions reach cache_seqlens + s_q - 1 for the queries, past the cache when s_q > s_new.
    const int64_t positions = c.capacity + s.s_q;
    c.cos = HostTensor(s.dtype, {positions, half});
    c.sin = HostTensor(s.dtype, {positions, half});
    for (int64_t pos = 0; pos < positions; ++pos) {
      for (int64_t f = 0; f < half; ++f) {
        const double angle = double(pos) * std::pow(10000.0, -double(f) / double(half));
        c.cos.set(pos * half + f, round_to_storage(s.dtype, std::cos(angle)));
        c.sin.set(pos * half + f, round_to_storage(s.dtype, std::sin(angle)));
      }
    }
  }
  return c;
}

inline KVCacheArgs kv_args(KVCase& c, const std::vector<TensorView>& views) {
  // views in the order of kv_tensors()
  KVCacheArgs a;
  a.q = views[0], a.k_cache = views[1], a.v_cache = views[2], a.out = views[3], a.lse = views[4];
  a.k_new = views[5], a.v_new = views[6], a.rotary_cos = views[7], a.rotary_sin = views[8];
  a.cache_seqlens = views[9], a.cache_leftpad = views[10], a.cache_batch_idx = views[11], a.block_table = views[12];
  a.cu_seqlens_q = views[13], a.cu_seqlens_k_new = views[14], a.rotary_seqlens = views[15];
  a.max_seqlen_q = c.spec.varlen_q ? c.spec.s_q : 0;
  a.rotary_interleaved = c.spec.interleaved;
  a.num_splits = c.spec.num_splits;
  return a;
}

// Every tensor of the call, in kv_args' order (undefined ones stay default-constructed).
inline std::vector<HostTensor*> kv_tensors(KVCase& c) {
  return {&c.q,       &c.k_cache, &c.v_cache,   &c.out,         &c.lse,  &c.k_new,  &c.v_new,         &c.cos, &c.sin,
          &c.seqlens, &c.leftpad, &c.batch_idx, &c.block_table, &c.cu_q, &c.cu_new, &c.rotary_seqlens};
}

inline AttentionOptions kv_options(const KVCaseSpec& s, Backend backend) {
  AttentionOptions o;
  o.causal = s.causal;
  o.window_left = s.window_left, o.window_right = s.window_right;
  o.attention_chunk = s.attention_chunk;
  o.softcap = s.softcap;
  o.backend = backend;
  return o;
}

// The rotary embedding as documented: pairs (2i, 2i + 1) or (i, i + rotary_dim / 2) of the first rotary_dim
// columns rotated by the position's angle in fp32, y0 = x0 c − x1 s and y1 = x0 s + x1 c, each one fused
// multiply-add over a rounded product, then rounded to the storage type.
inline std::vector<double> rotate_row(const KVCaseSpec& s, const HostTensor& cos, const HostTensor& sin,
                                      const std::vector<double>& x, int64_t pos) {
  std::vector<double> y = x;
  const int64_t half = s.rotary_dim / 2;
  for (int64_t f = 0; f < half; ++f) {
    const int64_t c0 = s.interleaved ? 2 * f : f, c1 = s.interleaved ? 2 * f + 1 : f + half;
    const float cs = float(cos.get(pos * half + f)), sn = float(sin.get(pos * half + f));
    const float x0 = float(x[size_t(c0)]), x1 = float(x[size_t(c1)]);
    y[size_t(c0)] = round_to_storage(s.dtype, double(std::fmaf(x0, cs, -(x1 * sn))));
    y[size_t(c1)] = round_to_storage(s.dtype, double(std::fmaf(x0, sn, x1 * cs)));
  }
  return y;
}

struct KVExpected {
  HostTensor k_cache, v_cache;        // the caches after appending (storage for bitwise comparison)
  AttnResult attn;                    // oracle over the gathered keys, varlen order
  std::vector<int64_t> lens_k;
};

inline KVExpected expected_kv(const KVCase& c) {
  const KVCaseSpec& s = c.spec;
  KVExpected e;
  e.k_cache = c.k_cache;
  e.v_cache = c.v_cache;
  const bool per_row = s.causal || s.window_left >= 0 || s.window_right >= 0 || s.attention_chunk > 0;
  // New row i of sequence b: packed row new_starts[b] + i, or (b, i); rotated at base + i.
  auto new_offset = [&](const HostTensor& t, int64_t b, int64_t i, int64_t h, int64_t x) {
    return s.varlen_new ? t.offset({c.new_starts[size_t(b)] + i, h, x}) : t.offset({b, i, h, x});
  };
  auto rotary_pos = [&](int64_t b) { return s.rotary_base ? c.rotary_v[size_t(b)] : c.seqlens_v[size_t(b)]; };
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t ent = c.entry_v[size_t(b)];
    for (int64_t i = 0; i < (s.s_new > 0 ? c.new_v[size_t(b)] : 0); ++i) {
      const int64_t row = c.seqlens_v[size_t(b)] + i;
      for (int64_t h = 0; h < s.h_kv; ++h) {
        std::vector<double> kx(size_t(s.d));
        for (int64_t x = 0; x < s.d; ++x) kx[size_t(x)] = c.k_new.get(new_offset(c.k_new, b, i, h, x));
        if (s.rotary_dim) kx = rotate_row(s, c.cos, c.sin, kx, rotary_pos(b) + i);
        for (int64_t x = 0; x < s.d; ++x) e.k_cache.set(c.cache_offset(c.k_cache, ent, row, h, x), kx[size_t(x)]);
        for (int64_t x = 0; x < s.d_v; ++x)
          e.v_cache.set(c.cache_offset(c.v_cache, ent, row, h, x), c.v_new.get(new_offset(c.v_new, b, i, h, x)));
      }
    }
  }
  // Queries (rotated), and the used keys of each sequence gathered as a varlen batch.
  std::vector<double> Q, K, V;
  AttnSpec spec;
  spec.causal = s.causal, spec.window_left = s.window_left, spec.window_right = s.window_right;
  spec.attention_chunk = s.attention_chunk;
  spec.softcap = s.softcap;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < c.lens_q[size_t(b)]; ++i) {
      for (int64_t h = 0; h < s.h_q; ++h) {
        std::vector<double> qx(size_t(s.d));
        for (int64_t x = 0; x < s.d; ++x) {
          qx[size_t(x)] = c.q.get(s.varlen_q ? c.q.offset({c.starts_q[size_t(b)] + i, h, x}) : c.q.offset({b, i, h, x}));
        }
        if (s.rotary_dim) qx = rotate_row(s, c.cos, c.sin, qx, rotary_pos(b) + (per_row ? i : 0));
        Q.insert(Q.end(), qx.begin(), qx.end());
      }
    }
    const int64_t appended = s.with_seqlens && s.s_new > 0 ? c.new_v[size_t(b)] : 0;
    const int64_t begin = c.leftpad_v[size_t(b)], end = c.seqlens_v[size_t(b)] + appended;
    const int64_t ent = c.entry_v[size_t(b)];
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t h = 0; h < s.h_kv; ++h) {
        for (int64_t x = 0; x < s.d; ++x) K.push_back(e.k_cache.get(c.cache_offset(c.k_cache, ent, row, h, x)));
        for (int64_t x = 0; x < s.d_v; ++x) V.push_back(e.v_cache.get(c.cache_offset(c.v_cache, ent, row, h, x)));
      }
    }
    spec.lens_q.push_back(c.lens_q[size_t(b)]);
    spec.lens_k.push_back(end - begin);
  }
  e.lens_k = spec.lens_k;
  AttnShape shape;
  shape.h_q = s.h_q, shape.h_kv = s.h_kv, shape.d = s.d, shape.d_v = s.d_v;
  e.attn = textbook_attention<double>(shape, Q, K, V, nullptr, spec);
  return e;
}

// Checks the call's results (already in c.out, c.lse, c.k_cache, c.v_cache) against the expectation.
inline void check_kv_results(const KVCase& c, const KVExpected& e, DType accumulate) {
  const KVCaseSpec& s = c.spec;
  // The caches: appended rows as documented, every other element untouched, bit for bit.
  for (const auto& [got, want, name] : {std::tuple<const HostTensor*, const HostTensor*, const char*>{
                                            &c.k_cache, &e.k_cache, "k_cache"},
                                        {&c.v_cache, &e.v_cache, "v_cache"}}) {
    int64_t differing = 0, first = -1;
    for (int64_t off = 0; off < got->storage_elems(); ++off) {
      const double a = got->get(off), b = want->get(off);
      if (!(a == b || (std::isnan(a) && std::isnan(b)))) differing += (first < 0 ? (first = off) : 0, 1);
    }
    EXPECT_EQ(differing, 0) << name << ": first differing storage element " << first;
  }
  // O per element: |O − O_ref| <= 4u (|O_ref| + Σ|terms|) + keys · 2^-22 (u of the storage type, or of the
  // accumulation type where it is coarser... the storage rounding dominates for 16-bit types).
  const double u = std::max(unit_roundoff(s.dtype), unit_roundoff(accumulate));
  std::vector<double> got_o = c.out.values(), bound(e.attn.o.size());
  for (int64_t b = 0, row = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < c.lens_q[size_t(b)]; ++i, ++row) {
      for (int64_t h = 0; h < s.h_q; ++h) {
        for (int64_t x = 0; x < s.d_v; ++x) {
          const size_t el = size_t((row * s.h_q + h) * s.d_v + x);
          bound[el] = 4 * u * (std::fabs(e.attn.o[el]) + e.attn.o_mag[el]) + 0x1p-22 * double(e.lens_k[size_t(b)]);
        }
      }
    }
  }
  std::string worst;
  EXPECT_EQ(count_outside(got_o, e.attn.o, bound, &worst), 0) << "out: " << worst;
  // LSE: the oracle's is [h, total] (varlen); ours [b, h, s_q] or, varlen, [h, total_q] too.
  std::vector<double> got_lse, want_lse, lse_bound;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.h_q; ++h) {
      for (int64_t i = 0; i < c.lens_q[size_t(b)]; ++i) {
        const int64_t row = c.starts_q[size_t(b)] + i;
        got_lse.push_back(c.lse.get(s.varlen_q ? c.lse.offset({h, row}) : c.lse.offset({b, h, i})));
        const size_t el = size_t(h * c.total_q + row);
        want_lse.push_back(e.attn.lse[el]);
        lse_bound.push_back(1e-4 * (1 + e.attn.lse_mag[el]));
      }
    }
  }
  EXPECT_EQ(count_outside(got_lse, want_lse, lse_bound, &worst), 0) << "lse: " << worst;
}

// The grid both suites run: page sizes, new rows, rotary styles, index tensors, GQA, masks, splits.
inline std::vector<KVCaseSpec> kv_case_grid(bool gpu) {
  std::vector<KVCaseSpec> out;
  uint64_t seed = 1;
  auto add = [&](KVCaseSpec s) {
    s.seed = seed++;
    out.push_back(s);
  };
  for (int64_t page : {0, 1, 16, 64}) {
    for (int64_t s_q : {1, 4, 16}) {
      KVCaseSpec s;
      s.page_size = page, s.s_q = s_q, s.capacity = gpu ? 300 : 90;
      s.h_q = 8, s.h_kv = 2;
      add(s);
      s.s_new = std::min<int64_t>(s_q, 3), s.rotary_dim = 32, s.interleaved = page % 2 == 0, s.causal = true;
      add(s);
      s.leftpad = page != 1, s.batch_idx = true, s.softcap = 20, s.rotary_dim = 64, s.interleaved = !s.interleaved;
      add(s);
    }
  }
  {
    KVCaseSpec s;  // MQA, window, odd head dim, d_v != d
    s.h_q = 8, s.h_kv = 1, s.d = 59, s.d_v = 40, s.window_left = 10, s.window_right = 0, s.s_q = 2, s.page_size = 16;
    add(s);
    s.dtype = DType::f16, s.d = 128, s.d_v = 128, s.h_kv = 8, s.window_left = -1, s.window_right = -1;
    s.num_splits = 3, s.s_new = 2, s.rotary_dim = 128, s.causal = true;
    add(s);
    s.d = 256, s.d_v = 256, s.h_q = 4, s.h_kv = 4, s.num_splits = 1, s.page_size = 0, s.capacity = gpu ? 700 : 130;
    add(s);
    s.with_seqlens = false, s.s_new = 0, s.rotary_dim = 0, s.num_splits = 0;  // the whole cache, no lengths
    add(s);
    s = KVCaseSpec{};
    s.full = true, s.capacity = gpu ? 5000 : 300, s.h_q = 32, s.h_kv = 8, s.d = 128, s.d_v = 128, s.batch = 3;
    s.page_size = 256, s.num_splits = 0;
    add(s);
    s.window_left = 0, s.window_right = 0, s.s_q = 3, s.causal = true, s.page_size = 0;  // one key per row
    add(s);
  }
  {
    // FA3's varlen forms: new rows of varying counts (cu_seqlens_k_new), packed queries with appends, and rotary
    // positions from rotary_seqlens.
    KVCaseSpec s;
    s.batch = 3, s.h_q = 8, s.h_kv = 2, s.s_q = 4, s.s_new = 4, s.varlen_new = true, s.page_size = 16;
    s.rotary_dim = 32, s.causal = true, s.capacity = gpu ? 300 : 90;
    add(s);
    s.varlen_q = true, s.rotary_base = true, s.leftpad = true, s.batch_idx = true, s.page_size = 0;
    s.interleaved = false;
    add(s);
    s.varlen_new = false, s.s_new = 2, s.window_left = 5, s.window_right = 1, s.causal = false, s.page_size = 1;
    s.rotary_base = false, s.rotary_dim = 64;
    add(s);
    s.varlen_q = false, s.rotary_base = true, s.window_left = -1, s.window_right = -1, s.page_size = 64;
    s.num_splits = 3, s.h_kv = 8, s.d = 128, s.d_v = 128, s.rotary_dim = 128, s.s_q = 1, s.s_new = 1;
    add(s);
    s.varlen_q = true, s.varlen_new = true, s.s_q = 20, s.s_new = 20, s.h_q = 32, s.causal = true;  // 64-row plan
    s.capacity = gpu ? 4096 : 100, s.rotary_base = false, s.rotary_dim = 0, s.num_splits = 0, s.leftpad = false;
    add(s);
  }
  {
    // Chunked attention (FA3's attention_chunk) over caches: chunks in the coordinates after leftpad, queries
    // rotated per row, new rows, pages, splits.
    KVCaseSpec s;
    s.h_q = 8, s.h_kv = 2, s.s_q = 16, s.s_new = 3, s.page_size = 16, s.capacity = gpu ? 300 : 90;
    s.attention_chunk = 7;
    s.causal = true, s.leftpad = true, s.batch_idx = true, s.rotary_dim = 32;
    add(s);
    s.causal = false, s.s_q = 4, s.s_new = 4, s.attention_chunk = 24, s.page_size = 0, s.num_splits = 3;
    add(s);  // rotated per row without causal or a window: the chunk alone asks for it, as in FA3
    s.window_left = 5, s.window_right = 2, s.s_q = 1, s.s_new = 1, s.attention_chunk = 3, s.varlen_q = true;
    add(s);
  }
  return out;
}

}  // namespace flashattn::test
