// Run-time choice of the CPU flash kernels' instruction-set level. The kernels (flash_forward.cpp,
// flash_backward.cpp) are compiled once per level the build lists (CMakeLists.txt: baseline x86-64, AVX2 + FMA
// (x86-64-v3), AVX-512 (x86-64-v4), AVX-512 with BF16 dot products; or one -march=native copy with
// FLASHATTN_NATIVE), each in its own namespace. This file, compiled for the baseline, picks the best level the CPU
// supports once, capped by the environment variable FLASHATTN_CPU_ISA (baseline, avx2, avx512, avx512_bf16) so
// that tests and measurements can run the lower ones.
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend.h"
#include "flashattn/flashattn.h"

namespace flashattn::detail {

#define FA_DECLARE_LEVEL(ns)                            \
  namespace ns {                                        \
  Status flash_forward_kernels(const FwdParams& p);     \
  Status flash_backward_kernels(const BwdParams& p);    \
  bool bf16_pair_products();                            \
  }
#if defined(FLASHATTN_CPU_LEVEL_NATIVE)
FA_DECLARE_LEVEL(isa_native)
#endif
#if defined(FLASHATTN_CPU_LEVEL_BASELINE)
FA_DECLARE_LEVEL(isa_baseline)
#endif
#if defined(FLASHATTN_CPU_LEVEL_AVX2)
FA_DECLARE_LEVEL(isa_avx2_fma)
#endif
#if defined(FLASHATTN_CPU_LEVEL_AVX512)
FA_DECLARE_LEVEL(isa_avx512)
#endif
#if defined(FLASHATTN_CPU_LEVEL_AVX512_BF16)
FA_DECLARE_LEVEL(isa_avx512_bf16)
#endif
#undef FA_DECLARE_LEVEL

namespace {

struct Level {
  const char* name;
  Status (*forward)(const FwdParams&);
  Status (*backward)(const BwdParams&);
  bool (*supported)();
  bool (*bf16_pair_products)();
};

// Lowest first: the choice is the last supported level at or below the cap.
constexpr Level kLevels[] = {
#if defined(FLASHATTN_CPU_LEVEL_NATIVE)
    {"native", isa_native::flash_forward_kernels, isa_native::flash_backward_kernels, [] { return true; },
     isa_native::bf16_pair_products},
#endif
#if defined(FLASHATTN_CPU_LEVEL_BASELINE)
    {"baseline", isa_baseline::flash_forward_kernels, isa_baseline::flash_backward_kernels, [] { return true; },
     isa_baseline::bf16_pair_products},
#endif
#if defined(FLASHATTN_CPU_LEVEL_AVX2)
    {"avx2", isa_avx2_fma::flash_forward_kernels, isa_avx2_fma::flash_backward_kernels,
     [] { return __builtin_cpu_supports("x86-64-v3") > 0; }, isa_avx2_fma::bf16_pair_products},
#endif
#if defined(FLASHATTN_CPU_LEVEL_AVX512)
    {"avx512", isa_avx512::flash_forward_kernels, isa_avx512::flash_backward_kernels,
     [] { return __builtin_cpu_supports("x86-64-v4") > 0; }, isa_avx512::bf16_pair_products},
#endif
#if defined(FLASHATTN_CPU_LEVEL_AVX512_BF16)
    {"avx512_bf16", isa_avx512_bf16::flash_forward_kernels, isa_avx512_bf16::flash_backward_kernels,
     [] { return __builtin_cpu_supports("x86-64-v4") > 0 && __builtin_cpu_supports("avx512bf16") > 0; },
     isa_avx512_bf16::bf16_pair_products},
#endif
};

struct Choice {
  const Level* level = nullptr;
  Status status;
};

Choice choose() {
  Choice c;
  const char* cap = std::getenv("FLASHATTN_CPU_ISA");
  int cap_index = int(sizeof(kLevels) / sizeof(kLevels[0])) - 1;
  if (cap != nullptr && *cap != '\0') {
    cap_index = -1;
    std::string known;
    for (int i = 0; i < int(sizeof(kLevels) / sizeof(kLevels[0])); ++i) {
      if (std::strcmp(cap, kLevels[i].name) == 0) cap_index = i;
      known += (i ? ", " : "") + std::string(kLevels[i].name);
    }
    if (cap_index < 0) {
      c.status = Status::invalid(std::string("FLASHATTN_CPU_ISA: unknown level '") + cap + "'; this build has " + known);
      return c;
    }
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
#endif
  for (int i = cap_index; i >= 0; --i) {
    if (kLevels[i].supported()) {
      c.level = &kLevels[i];
      return c;
    }
  }
  c.status = Status::unsupported("cpu_flash: no kernel level this CPU supports");  // the lowest always is
  return c;
}

const Choice& chosen() {
  static const Choice c = choose();  // once: the environment and the CPU do not change under a running process
  return c;
}

}  // namespace

const char* cpu_flash_level() { return chosen().level ? chosen().level->name : "none"; }

bool cpu_flash_bf16_pair_products() { return chosen().level && chosen().level->bf16_pair_products(); }

Status cpu_flash_forward(const FwdParams& p) {
  const Choice& c = chosen();
  return c.level ? c.level->forward(p) : c.status;
}

Status cpu_flash_backward(const BwdParams& p) {
  const Choice& c = chosen();
  return c.level ? c.level->backward(p) : c.status;
}

}  // namespace flashattn::detail

namespace flashattn {
const char* cpu_isa() { return detail::cpu_flash_level(); }
}  // namespace flashattn
