// Attention dropout, written once for every backend: which probabilities are dropped, from a counter-based
// generator, so that the mask depends only on (seed, offset) and the element's (sequence b, query head h, query
// row i, key j) coordinates — never on tile sizes, thread counts, traversal order or the backend — and the
// backward regenerates the forward's mask without storing it.
//
// Semantics (flash_attn 2's): O = (P ∘ Z) V with Z = keep / (1 - p): kept probabilities scaled by 1 / (1 - p),
// dropped ones 0; the LSE is that of the undropped scores. Backward, with D = rowsum(dO ∘ O):
//   dV = (P ∘ Z)ᵀ dO,   dS = P ∘ (Z ∘ (dO Vᵀ) - D).
//
// Generator: Philox 4x32-10 (Salmon et al., SC'11; cuRAND's and PyTorch's). One call gives
// eight 16-bit draws, for eight keys of one query row: group g of row i holds keys j with j / 32 == g / 4 and
// (j / 2) % 4 == g % 4 (slot ((j / 8) % 4) · 2 + j % 2), the keys one lane of an mma / wgmma accumulator row holds
// in a 32-key span. Counter = (g, i, h, b); Philox key = seed + offset (mod 2^64), so that a call with the next
// offset (PyTorch's generator advances it) draws a fresh mask, and no coordinate of the mask depends on the
// batch size or the head count. A draw x is kept iff x < keep_threshold = round((1 - p) · 2^16), so the keep
// probability is 1 - p within 2^-17. Rows, key groups, heads and sequences are taken modulo 2^32.
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace flashattn {

// Philox 4x32 with 10 rounds (Random123's philox4x32_10): out = Philox(counter, key).
FA_HD void philox4x32_10(const uint32_t (&counter)[4], uint32_t key0, uint32_t key1, uint32_t (&out)[4]) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c0, p1 = uint64_t(kMul1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ key0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ key1;
    c3 = lo0;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

// Where a call's (seed, offset) come from: the values themselves, or (state set: FwdParams::dropout_state) two
// 64-bit words in the tensors' memory, read where the mask is drawn, so that a captured CUDA graph replays with
// whatever its captured random op wrote there. Both give the same mask for the same values.
struct DropoutRng {
  uint64_t seed = 0, offset = 0;
  const uint64_t* state = nullptr;  // {seed, offset}; null: the two above

  template <typename Params>
  static DropoutRng of(const Params& p) {
    return DropoutRng{p.dropout_seed, p.dropout_offset, p.dropout_state};
  }
};

struct DropoutSpec {
  uint32_t keep_threshold = 1u << 16;  // 16-bit draws below this are kept (2^16: no dropout)
  uint32_t key0 = 0, key1 = 0;         // seed + offset
  uint32_t head = 0, sequence = 0;     // h, b

  static constexpr int kKeysPerGroup = 8;

  FA_HD static uint32_t threshold_of(float p) {
    const double keep = (1.0 - double(p)) * 65536.0;
    return p <= 0.f ? 1u << 16 : uint32_t(keep + 0.5);
  }

  FA_HD static DropoutSpec make(float p, uint64_t seed, uint64_t offset, int64_t b, int64_t h) {
    DropoutSpec d;
    d.keep_threshold = threshold_of(p);
    const uint64_t key = seed + offset;
    d.key0 = uint32_t(key), d.key1 = uint32_t(key >> 32);
    d.head = uint32_t(h), d.sequence = uint32_t(b);
    return d;
  }

  FA_HD static DropoutSpec make(float p, const DropoutRng& rng, int64_t b, int64_t h) {
    return rng.state != nullptr ? make(p, rng.state[0], rng.state[1], b, h) : make(p, rng.seed, rng.offset, b, h);
  }

  FA_HD bool active() const { return keep_threshold < (1u << 16); }
  // Whether dropout_p draws a mask at all: a p whose keep threshold rounds to 2^16 drops nothing and scales
  // nothing (the reference's rule), so the kernels can take it as no dropout.
  FA_HD static bool drops(float p) { return threshold_of(p) < (1u << 16); }

  // Group and slot of key j (file header).
  FA_HD static uint32_t group_of(int64_t j) { return uint32_t((uint64_t(j) >> 5) << 2 | ((uint64_t(j) >> 1) & 3)); }
  FA_HD static int slot_of(int64_t j) { return int(((j >> 3) & 3) << 1 | (j & 1)); }
  // The key of slot s of group g: inverse of (group_of, slot_of).
  FA_HD static int64_t key_of(uint32_t g, int s) {
    return int64_t(g >> 2) * 32 + int64_t(s >> 1) * 8 + int64_t(g & 3) * 2 + (s & 1);
  }

  // The eight draws of group g of row i, slot s in bits 16 (s % 2) of word s / 2.
  FA_HD void draws(int64_t i, uint32_t g, uint32_t (&w)[4]) const {
    const uint32_t counter[4] = {g, uint32_t(i), head, sequence};
    philox4x32_10(counter, key0, key1, w);
  }
  FA_HD bool kept(const uint32_t (&w)[4], int slot) const {
    return ((w[slot >> 1] >> (16 * (slot & 1))) & 0xffffu) < keep_threshold;
  }
  // Bit s set iff slot s of group g of row i is kept: the eight keep decisions of one Philox call. A slot's
  // 16-bit draw x is compared in place: the high half as the word against keep_threshold << 16, the low half
  // shifted up first.
  FA_HD uint32_t kept_slots(int64_t i, uint32_t g) const {
    uint32_t w[4];
    draws(i, g, w);
    const uint32_t high_threshold = keep_threshold << 16;  // keep_threshold < 2^16 whenever dropout is active
    uint32_t slots = 0;
    for (int k = 0; k < 4; ++k) {
      slots |= uint32_t(w[k] << 16 < high_threshold) << (2 * k);
      slots |= uint32_t(w[k] < high_threshold) << (2 * k + 1);
    }
    return slots;
  }
  FA_HD bool keep(int64_t i, int64_t j) const {
    uint32_t w[4];
    draws(i, group_of(j), w);
    return kept(w, slot_of(j));
  }
};

}  // namespace flashattn
