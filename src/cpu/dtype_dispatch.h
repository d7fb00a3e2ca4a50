// Calls a functor template at the CPU storage type of a DType: the one switch the CPU backends share.
#pragma once

#include <string>

#include "common/half.h"
#include "flashattn/types.h"

namespace flashattn::detail {

// F<T>()(args...) for the storage type T of `dtype` (float, double, half_t, bfloat16_t); other dtypes are
// unsupported, the message naming `who`.
template <template <typename> class F, typename... Args>
Status call_by_dtype(const char* who, DType dtype, Args&&... args) {
  switch (dtype) {
    case DType::f32: return F<float>()(args...);
    case DType::f64: return F<double>()(args...);
    case DType::f16: return F<half_t>()(args...);
    case DType::bf16: return F<bfloat16_t>()(args...);
    default: return Status::unsupported(std::string(who) + ": dtype " + dtype_name(dtype) + " is not supported");
  }
}

}  // namespace flashattn::detail
