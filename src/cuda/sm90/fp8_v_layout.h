// How the Hopper FP8 forward holds V: transposed (V_t, head-dim rows of keys), because e4m3 wgmma reads both
// shared-memory operands K-major and P V's K dimension is the keys; with each 32-key group's keys in the order in
// which P's accumulator lands in the A fragment (primitives_sm90.cuh, accumulator_to_a_fragment_fp8), so that P
// needs no shuffle between threads. fp8_v_transpose.cu writes it before the forward, into workspace:
//   V_t[batch_or_0][kv head][column c][slot] = V[sequence's key fp8_key_of_slot(slot)][kv head][c]
// Each sequence's keys start at a slot of its own (fp8_v_slot0) and fill whole kFp8KeyPad-slot spans, zeros past
// its last key, so that every key tile the kernel loads holds the sequence's values or zeros (never garbage whose
// NaN bytes would turn P·V's zeros into NaN). Usable from host and device code.
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace flashattn::cuda::sm90 {

// Keys of one group whose order the A fragment fixes (one e4m3 wgmma's K).
constexpr int kFp8KeyGroup = 32;
// Slots per span of V_t: each sequence fills whole spans. A multiple of the FP8 forward's key tile, so that a
// sequence's last key tile ends inside its spans (forward_config.h checks), and of TMA's 16-byte stride unit.
constexpr int kFp8KeyPad = 128;

// The key (within its 32-key group) whose value slot s holds. Thread q of a quad holds P's keys 2q, 2q + 1,
// 8 + 2q, 9 + 2q in slots 4q..4q + 3, and the same 16 keys further in slots 16 + 4q..: a bijection on 0..31 that
// maps each 16-slot half onto the same half of the keys.
FA_HD constexpr int fp8_key_of_slot(int s) {
  const int half = s / 16, q = (s % 16) / 4, e = s % 4;
  return 16 * half + 2 * q + (e % 2) + 8 * (e / 2);
}

FA_HD constexpr int64_t fp8_round_to_span(int64_t n) { return (n + kFp8KeyPad - 1) / kFp8KeyPad * kFp8KeyPad; }

// Slots of one V_t row: whole spans for every sequence. Padded batch: the longest length rounded up (each batch
// entry has its own rows); varlen: the packed keys rounded up plus two spans per sequence (fp8_v_slot0).
FA_HD constexpr int64_t fp8_v_row_slots(bool varlen, int64_t seqlen_k, int64_t total_k, int64_t batch) {
  return varlen ? fp8_round_to_span(total_k) + 2 * kFp8KeyPad * batch : fp8_round_to_span(seqlen_k);
}

// The first slot of a sequence whose keys start at packed row `k_row0` (varlen; 0 in a padded batch): on a span
// boundary (whole 128-byte rows for TMA and the transpose's stores), two spans further per earlier sequence.
// Sequence b fills round_to_span(len_b) < len_b + kFp8KeyPad slots from round_to_span(k_row0) < k_row0 +
// kFp8KeyPad, so it ends before k_row0 + len_b + 2 kFp8KeyPad (two spans further per sequence): before the next
// sequence's first slot.
FA_HD constexpr int64_t fp8_v_slot0(bool varlen, int64_t k_row0, int64_t sequence) {
  return varlen ? fp8_round_to_span(k_row0) + 2 * kFp8KeyPad * sequence : 0;
}

}  // namespace flashattn::cuda::sm90
