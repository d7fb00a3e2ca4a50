// Entry points of the Hopper forward (forward_sm90.cu). Dispatch reaches them through cuda_sm90_supports /
// cuda_sm90_forward once the kernel has passed its tests on the device; the GPU tests call them directly.
#pragma once

#include <string>

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// ok, or unsupported with the reason (dtype, head dim, strides/alignment TMA cannot express, device).
Status sm90_forward_supports(const FwdParams& p);

// How the consumer warpgroups order their work (forward_sm90.cu): `serial` waits for each product before the
// next step; `overlapped` issues S_n = Q K_nᵀ together with O += P_{n+1} V_{n+1}, runs the softmax while P V
// is in flight, and alternates the two warpgroups' products (ping-pong).
// The _wide variants run the wider tiles of forward_config.h (WideTiles) in the same two orderings.
enum class Sm90ForwardVariant { serial, overlapped, serial_wide, overlapped_wide };
constexpr Sm90ForwardVariant kSm90ForwardVariants[] = {
    Sm90ForwardVariant::serial,          Sm90ForwardVariant::overlapped,
    Sm90ForwardVariant::serial_wide,     Sm90ForwardVariant::overlapped_wide};
inline const char* sm90_forward_variant_name(Sm90ForwardVariant v) {
  switch (v) {
    case Sm90ForwardVariant::serial: return "serial";
    case Sm90ForwardVariant::overlapped: return "overlapped";
    case Sm90ForwardVariant::serial_wide: return "serial_wide";
    case Sm90ForwardVariant::overlapped_wide: return "overlapped_wide";
  }
  return "?";
}

// How (batch, head, query block) tiles reach CTAs (ForwardKernelArgs in forward_tiles.cuh).
//   lpt_sections: tiles in longest-first order across sections of heads whose K/V fit in L2, applied only
//                 where the mask makes query blocks differ in cost (causal or a window); otherwise head-major.
//   persistent:   one CTA per multiprocessor; each claims the next tile from a counter when it starts on one
//                 (tiles start in order, whatever their costs), and the producer loads the next tile's K and
//                 Q while the consumers finish the current one. Otherwise one CTA per tile.
struct Sm90Schedule {
  bool lpt_sections = false;
  bool persistent = false;
};
constexpr Sm90Schedule kSm90Schedules[] = {{false, false}, {true, false}, {false, true}, {true, true}};
inline std::string sm90_schedule_suffix(Sm90Schedule s) {
  return std::string(s.lpt_sections ? "+lpt" : "") + (s.persistent ? "+pers" : "");
}

// Runs validated params for which sm90_forward_supports is ok. Asynchronous on p.stream. Dispatch uses the
// defaults; tests and the benchmark name a variant and schedule.
Status sm90_forward_run(const FwdParams& p, Sm90ForwardVariant variant = Sm90ForwardVariant::serial,
                        Sm90Schedule schedule = Sm90Schedule{});

}  // namespace flashattn::detail
