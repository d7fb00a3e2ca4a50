// The tests' own Philox 4x32-10 and dropout layout, written from their published definitions (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11; Random123's known-answer vectors in test_oracle.cpp) and
// from the layout documented in include/flashattn/flashattn.h and src/common/dropout.h, not from the library's
// code: the oracle's dropout mask cannot share a bug with it.
#pragma once

#include <array>
#include <cstdint>

namespace flashattn::test {

using Philox4 = std::array<uint32_t, 4>;

// Random123's order: the first round with the key as given, the key bumped by the Weyl constants before each
// of the nine others.
inline Philox4 philox4x32_10_reference(Philox4 ctr, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += 0x9E3779B9u;
      key[1] += 0xBB67AE85u;
    }
    const uint64_t a = uint64_t(ctr[0]) * 0xD2511F53u;
    const uint64_t b = uint64_t(ctr[2]) * 0xCD9E8D57u;
    ctr = {uint32_t(b >> 32) ^ ctr[1] ^ key[0], uint32_t(b), uint32_t(a >> 32) ^ ctr[3] ^ key[1], uint32_t(a)};
  }
  return ctr;
}

// Whether query i of query head h, sequence b keeps key j: the 16-bit draw of (i, j) against round((1 - p) 2^16).
// Key j belongs to group 4 (j / 32) + (j / 2) % 4 of its row, at slot 2 ((j / 8) % 4) + j % 2; the group's counter
// is (group, i, h, b), the Philox key seed + offset.
inline bool dropout_kept(float p, uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i, int64_t j) {
  const uint32_t group = uint32_t(4 * (j / 32) + (j / 2) % 4);
  const int slot = int(2 * ((j / 8) % 4) + j % 2);
  const uint64_t key = seed + offset;
  const Philox4 w = philox4x32_10_reference({group, uint32_t(i), uint32_t(h), uint32_t(b)},
                                            {uint32_t(key), uint32_t(key >> 32)});
  const uint32_t draw = slot % 2 ? w[size_t(slot / 2)] >> 16 : w[size_t(slot / 2)] & 0xffffu;
  const uint32_t threshold = uint32_t((1.0 - double(p)) * 65536.0 + 0.5);
  return draw < threshold;
}

}  // namespace flashattn::test
