// Plain value types of the public API: element types, devices, strided tensor views, status codes.
// Framework-free on purpose: no torch, no CUDA types. A CUDA stream travels as `void*`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashattn {

// e4m3: float8_e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities, S.1111.111 is NaN),
// an input type only: outputs are float16 or bfloat16, and its values are scaled by the descale factors.
// i64: the dropout generator's state (ForwardArgs::dropout_rng) only.
enum class DType : int { f32, f64, f16, bf16, i32, e4m3, i64 };

// Bytes per element of `t`.
size_t dtype_size(DType t);
const char* dtype_name(DType t);

enum class DeviceType : int { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;
};

constexpr int kMaxRank = 4;

// A non-owning strided view. Shapes and strides are in elements (not bytes), 64-bit, so tensors past 2^31
// elements work. Attention tensors need their last dimension contiguous (stride 1); any other stride is free,
// which is how [batch, heads, seq, dim] storage is passed as a permuted [batch, seq, heads, dim] view.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device;
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};

  int64_t numel() const;
  bool defined() const { return data != nullptr || rank > 0; }
};

// A contiguous (row-major) view over `data` with the given shape.
TensorView make_contiguous_view(void* data, DType dtype, Device device, int rank, const int64_t* shape);

enum class ErrorCode : int {
  ok = 0,
  invalid_argument,  // the caller passed something wrong; the message names the argument
  unsupported,       // valid input that this build or backend cannot run yet; the message says why
  device_error,      // the CUDA runtime reported an error
};

struct Status {
  ErrorCode code = ErrorCode::ok;
  std::string message;

  bool ok() const { return code == ErrorCode::ok; }
  static Status success() { return {}; }
  static Status invalid(std::string msg) { return {ErrorCode::invalid_argument, std::move(msg)}; }
  static Status unsupported(std::string msg) { return {ErrorCode::unsupported, std::move(msg)}; }
  static Status device(std::string msg) { return {ErrorCode::device_error, std::move(msg)}; }
};

}  // namespace flashattn
