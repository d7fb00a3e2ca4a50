// Test helpers shared by the CPU and GPU suites: an owning host tensor with any layout, random fills,
// conversion to double, and the error measures the tolerance rules use.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "flashattn/flashattn.h"

namespace flashattn::test {

// Owning host storage for a logical tensor of `shape`, laid out with dimension order `perm` (perm[0] outermost)
// and `pad` extra elements at the end of every row, so that strided views are exercised.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape, std::vector<int> perm = {}, int64_t row_pad = 0)
      : dtype_(dtype), shape_(std::move(shape)) {
    const int rank = int(shape_.size());
    if (perm.empty())
      for (int i = 0; i < rank; ++i) perm.push_back(i);
    strides_.assign(size_t(rank), 0);
    int64_t s = 1;
    for (int k = rank - 1; k >= 0; --k) {
      const int dim = perm[size_t(k)];
      strides_[size_t(dim)] = s;
      s *= shape_[size_t(dim)] + (k == rank - 1 ? row_pad : 0);
    }
    storage_elems_ = s;
    bytes_.assign(size_t(s) * dtype_size(dtype), 0);
  }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  int64_t storage_elems() const { return storage_elems_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  size_t bytes() const { return bytes_.size(); }

  TensorView view(Device device = {}, void* data_override = nullptr) const {
    TensorView t;
    t.data = data_override ? data_override : const_cast<uint8_t*>(bytes_.data());
    t.dtype = dtype_;
    t.device = device;
    t.rank = int(shape_.size());
    for (int i = 0; i < t.rank; ++i) {
      t.shape[i] = shape_[size_t(i)];
      t.stride[i] = strides_[size_t(i)];
    }
    return t;
  }

  // Storage offset of a logical index.
  int64_t offset(const std::vector<int64_t>& idx) const {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides_[i];
    return off;
  }

  double get(int64_t off) const {
    switch (dtype_) {
      case DType::f32: return reinterpret_cast<const float*>(bytes_.data())[off];
      case DType::f64: return reinterpret_cast<const double*>(bytes_.data())[off];
      case DType::f16: return to_float(reinterpret_cast<const half_t*>(bytes_.data())[off]);
      case DType::bf16: return to_float(reinterpret_cast<const bfloat16_t*>(bytes_.data())[off]);
      case DType::i32: return reinterpret_cast<const int32_t*>(bytes_.data())[off];
    }
    return 0;
  }
  void set(int64_t off, double v) {
    switch (dtype_) {
      case DType::f32: reinterpret_cast<float*>(bytes_.data())[off] = float(v); break;
      case DType::f64: reinterpret_cast<double*>(bytes_.data())[off] = v; break;
      case DType::f16: reinterpret_cast<half_t*>(bytes_.data())[off] = to_half(float(v)); break;
      case DType::bf16: reinterpret_cast<bfloat16_t*>(bytes_.data())[off] = to_bfloat16(float(v)); break;
      case DType::i32: reinterpret_cast<int32_t*>(bytes_.data())[off] = int32_t(v); break;
    }
  }

  // Visits every logical element in row-major logical order with its storage offset.
  template <typename F>
  void for_each(F&& f) const {
    std::vector<int64_t> idx(shape_.size(), 0);
    const int64_t n = numel();
    for (int64_t e = 0; e < n; ++e) {
      f(offset(idx));
      for (int d = int(shape_.size()) - 1; d >= 0; --d) {
        if (++idx[size_t(d)] < shape_[size_t(d)]) break;
        idx[size_t(d)] = 0;
      }
    }
  }

  // Logical elements in row-major order, as doubles.
  std::vector<double> values() const {
    std::vector<double> out;
    out.reserve(size_t(numel()));
    for_each([&](int64_t off) { out.push_back(get(off)); });
    return out;
  }

  void fill_normal(std::mt19937_64& rng, double stddev = 1.0) {
    std::normal_distribution<double> dist(0.0, stddev);
    for_each([&](int64_t off) { set(off, dist(rng)); });
  }

  // Every storage element (padding too) set to a value no kernel would produce, to catch unwritten outputs.
  void poison() {
    for (int64_t off = 0; off < storage_elems_; ++off) set(off, dtype_ == DType::i32 ? -7 : std::nan(""));
  }

 private:
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_, strides_;
  int64_t storage_elems_ = 0;
  std::vector<uint8_t> bytes_;
};

// cu_seqlens of a varlen batch: int32 [n + 1], 0 then the running sums of `lens`.
template <typename Int>
HostTensor cu_seqlens_of(const std::vector<Int>& lens) {
  HostTensor cu(DType::i32, {int64_t(lens.size()) + 1});
  int64_t total = 0;
  cu.set(0, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu.set(int64_t(i) + 1, double(total += int64_t(lens[i])));
  return cu;
}

// ‖a − b‖₂ with -inf allowed only where both are -inf; NaN or a mismatched infinity gives +inf (never passes).
inline double l2_distance(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    s += (a[i] - b[i]) * (a[i] - b[i]);
  }
  return std::sqrt(s);
}

// ‖a‖₂ over the finite entries.
inline double l2_norm(const std::vector<double>& a) {
  double s = 0;
  for (double x : a)
    if (std::isfinite(x)) s += x * x;
  return std::sqrt(s);
}

// ‖a − b‖₂ / max(‖b‖₂, tiny), with the NaN / infinity rules of l2_distance.
inline double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  return l2_distance(a, b) / std::max(l2_norm(b), 1e-30);
}

// max |a − b| / scale(b) over the finite entries, with the NaN / infinity rules of l2_distance.
template <typename Scale>
double max_scaled_error(const std::vector<double>& a, const std::vector<double>& b, Scale scale) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::fabs(a[i] - b[i]) / scale(b[i]));
  }
  return m;
}

inline double max_abs_error(const std::vector<double>& a, const std::vector<double>& b) {
  return max_scaled_error(a, b, [](double) { return 1.0; });
}

// Absolute below 1, relative above.
inline double max_error_relative_above_one(const std::vector<double>& a, const std::vector<double>& b) {
  return max_scaled_error(a, b, [](double y) { return std::max(1.0, std::fabs(y)); });
}

// Unit roundoff of a storage type: the scale of error any kernel storing in it must be allowed.
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::f16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
    case DType::f32: return 0x1p-24;
    case DType::f64: return 0x1p-53;
    default: return 0;
  }
}

}  // namespace flashattn::test
