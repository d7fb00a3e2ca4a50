// The one place that chooses a backend, and can say why.
#include <string>

#include "backend.h"
#include "cpu/fp8.h"
#include "cpu/kv_cache.h"
#include "flashattn/flashattn.h"
#include "value_slices.h"

namespace flashattn {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::automatic: return "auto";
    case Backend::cpu_reference: return "cpu_reference";
    case Backend::cpu_flash: return "cpu_flash";
    case Backend::cuda_sm80: return "cuda_sm80";
    case Backend::cuda_sm90: return "cuda_sm90";
  }
  return "unknown";
}

bool parse_backend(const std::string& name, Backend* out) {
  for (Backend b : {Backend::automatic, Backend::cpu_reference, Backend::cpu_flash, Backend::cuda_sm80,
                    Backend::cuda_sm90}) {
    if (name == backend_name(b)) {
      *out = b;
      return true;
    }
  }
  return false;
}

namespace {

bool on_cpu(const FwdParams& p) { return p.device.type == DeviceType::cpu; }

// The widest V the CUDA kernels take; wider ones (up to kMaxHeadDimV) run forwards over slices of V's columns
// (value_slices.h).
constexpr int64_t kCudaKernelHeadDimV = kMaxHeadDim;

// A CUDA backend's forward (KV-cache params included) over slices of V's columns where d_v needs them.
template <detail::ForwardFn kForward>
Status run_cuda_forward(const FwdParams& p) {
  return detail::for_each_value_slice(p, kCudaKernelHeadDimV, kForward);
}

// bwd: the backward's params when choosing for the backward (they say more than the forward's: dout's layout,
// the deterministic mode); null for the forward.
Status supports(Backend b, const FwdParams& p, const BwdParams* bwd) {
  const bool cpu = b == Backend::cpu_reference || b == Backend::cpu_flash;
  if (!cpu && b != Backend::cuda_sm80 && b != Backend::cuda_sm90) {
    return Status::invalid("backend: not a concrete backend");
  }
  if (bwd && p.qv) {
    return Status::unsupported("qv: the backward of attention with qv is not supported (forward only, as in FA3)");
  }
  if (cpu) {
    return on_cpu(p) ? Status::success()
                     : Status::unsupported(std::string(backend_name(b)) + " runs on CPU tensors; these are on CUDA");
  }
  if (on_cpu(p)) return Status::unsupported(std::string(backend_name(b)) + " runs on CUDA tensors; these are on the CPU");
  if (p.qv) return Status::unsupported("qv: the query-value term runs on the CPU backends only so far");
  if (bwd) {
    if (p.head_dim_v > kCudaKernelHeadDimV) {
      return Status::unsupported("v: head dim " + std::to_string(p.head_dim_v) + ": the CUDA backward takes d_v up to " +
                                 std::to_string(kCudaKernelHeadDimV) + " (the CPU backends up to " +
                                 std::to_string(kMaxHeadDimV) + ")");
    }
    return b == Backend::cuda_sm80 ? detail::cuda_sm80_supports(p, true) : detail::cuda_sm90_backward_supports(*bwd);
  }
  // Wider values run in slices of V's columns (run_cuda_forward): every slice must be supported.
  return detail::for_each_value_slice(p, kCudaKernelHeadDimV, [b](const FwdParams& slice) {
    return b == Backend::cuda_sm80 ? detail::cuda_sm80_supports(slice, false) : detail::cuda_sm90_supports(slice);
  });
}

BackendChoice choose(const FwdParams& p, Backend requested, const BwdParams* bwd) {
  BackendChoice c;
  if (bwd != nullptr && p.has_kv_cache()) {
    c.backend = requested == Backend::automatic ? (on_cpu(p) ? Backend::cpu_flash : Backend::cuda_sm80) : requested;
    c.status = Status::unsupported("the backward does not take a KV cache (seqused_k, leftpad_k, kv_batch_idx, "
                                   "block_table): the cache path is inference only");
    c.reason = c.status.message;
    return c;
  }
  if (requested != Backend::automatic) {
    c.backend = requested;
    c.status = supports(requested, p, bwd);
    c.reason = c.status.ok() ? std::string("requested explicitly") : c.status.message;
    return c;
  }
  if (on_cpu(p)) {
    c.backend = Backend::cpu_flash;
    c.status = supports(c.backend, p, bwd);
    c.reason = c.status.ok() ? std::string("CPU tensors: tiled online-softmax CPU path (") +
                                   detail::cpu_flash_level() + " kernels)"
                             : c.status.message;
    return c;
  }
  // CUDA: fastest first; record why each faster backend was passed over.
  std::string passed_over, reason;
  bool one_reason = true;  // every backend refused with the same message (qv, say): reported once, as it is
  for (Backend b : {Backend::cuda_sm90, Backend::cuda_sm80}) {
    Status s = supports(b, p, bwd);
    if (s.ok()) {
      const int64_t slices = bwd ? 1 : detail::value_slice_count(p, kCudaKernelHeadDimV);
      const char* decode_note = p.has_kv_cache()                   ? " (KV cache: the split-KV decode kernel)"
                                : !bwd && detail::cuda_decode_runs(p) ? " (few query rows: the split-KV decode kernel)"
                                                                      : "";
      c.backend = b;
      c.reason = std::string(backend_name(b)) + " supports this call" + decode_note +
                 (slices > 1 ? " (d_v " + std::to_string(p.head_dim_v) + " as " + std::to_string(slices) +
                                   " forwards over slices of V's columns)"
                             : std::string()) +
                 (passed_over.empty() ? std::string() : " (" + passed_over + ")");
      return c;
    }
    one_reason = one_reason && (passed_over.empty() || s.message == reason);
    reason = s.message;
    passed_over += (passed_over.empty() ? "" : "; ") + std::string(backend_name(b)) + " passed over: " + s.message;
  }
  c.backend = Backend::cuda_sm80;
  c.status = Status::unsupported(one_reason ? reason : "no CUDA backend can run this call: " + passed_over);
  c.reason = c.status.message;
  return c;
}

}  // namespace

BackendChoice choose_backend(const FwdParams& p, Backend requested, bool backward, bool deterministic) {
  if (!backward) return choose(p, requested, nullptr);
  // The backward these params would make: gradients and dout laid out like the tensors they belong to.
  BwdParams b;
  static_cast<FwdParams&>(b) = p;
  b.dout = p.o;
  b.do_batch_stride = p.o_batch_stride, b.do_row_stride = p.o_row_stride, b.do_head_stride = p.o_head_stride;
  b.dq = const_cast<void*>(p.q), b.dk = const_cast<void*>(p.k), b.dv = const_cast<void*>(p.v);
  b.dq_batch_stride = p.q_batch_stride, b.dq_row_stride = p.q_row_stride, b.dq_head_stride = p.q_head_stride;
  b.dk_batch_stride = p.k_batch_stride, b.dk_row_stride = p.k_row_stride, b.dk_head_stride = p.k_head_stride;
  b.dv_batch_stride = p.v_batch_stride, b.dv_row_stride = p.v_row_stride, b.dv_head_stride = p.v_head_stride;
  b.deterministic = deterministic;
  return choose(b, requested, &b);
}

BackendChoice choose_backend(const BwdParams& p, Backend requested) { return choose(p, requested, &p); }

namespace {
// A CPU backend's forward or backward; float8 inputs through the dequantising adapter around it (cpu/fp8.h).
Status cpu_forward(const FwdParams& p, detail::ForwardFn run) {
  return p.dtype == DType::e4m3 ? detail::cpu_fp8_forward(p, run) : run(p);
}
Status cpu_backward(const BwdParams& p, detail::BackwardFn run) {
  return p.dtype == DType::e4m3 ? detail::cpu_fp8_backward(p, run) : run(p);
}
}  // namespace

Status run_forward(const FwdParams& p, Backend requested) {
  const BackendChoice c = choose_backend(p, requested, false);
  if (!c.status.ok()) return c.status;
  switch (c.backend) {
    case Backend::cpu_reference: return cpu_forward(p, detail::cpu_reference_forward);
    case Backend::cpu_flash: return cpu_forward(p, detail::cpu_flash_forward);
    case Backend::cuda_sm80: return run_cuda_forward<detail::cuda_sm80_forward>(p);
    case Backend::cuda_sm90: return run_cuda_forward<detail::cuda_sm90_forward>(p);
    case Backend::automatic: break;
  }
  return Status::invalid("backend: not a concrete backend");
}

Status run_backward(const BwdParams& p, Backend requested) {
  const BackendChoice c = choose_backend(p, requested);
  if (!c.status.ok()) return c.status;
  switch (c.backend) {
    case Backend::cpu_reference: return cpu_backward(p, detail::cpu_reference_backward);
    case Backend::cpu_flash: return cpu_backward(p, detail::cpu_flash_backward);
    case Backend::cuda_sm80: return detail::cuda_sm80_backward(p);
    case Backend::cuda_sm90: return detail::cuda_sm90_backward(p);
    case Backend::automatic: break;
  }
  return Status::invalid("backend: not a concrete backend");
}

Status run_kvcache(const KVCacheParams& kp, Backend requested) {
  const BackendChoice c = choose_backend(kp.attn, requested, false);
  if (!c.status.ok()) return c.status;
  switch (c.backend) {
    case Backend::cpu_reference: return detail::cpu_kvcache(kp, detail::cpu_reference_forward);
    case Backend::cpu_flash: return detail::cpu_kvcache(kp, detail::cpu_flash_forward);
    case Backend::cuda_sm80: return detail::cuda_kvcache(kp, run_cuda_forward<detail::cuda_sm80_forward>);
    case Backend::cuda_sm90: return detail::cuda_kvcache(kp, run_cuda_forward<detail::cuda_sm90_forward>);
    case Backend::automatic: break;
  }
  return Status::invalid("backend: not a concrete backend");
}

Status attention_with_kvcache(const KVCacheArgs& args, const AttentionOptions& options) {
  KVCacheParams p;
  Status st = make_kvcache_params(args, options, &p);
  if (!st.ok()) return st;
  return run_kvcache(p, options.backend);
}

Status attention_forward(const ForwardArgs& args, const AttentionOptions& options) {
  FwdParams p;
  Status st = make_forward_params(args, options, &p);
  if (!st.ok()) return st;
  return run_forward(p, options.backend);
}

Status attention_backward(const BackwardArgs& args, const AttentionOptions& options) {
  BwdParams p;
  Status st = make_backward_params(args, options, &p);
  if (!st.ok()) return st;
  return run_backward(p, options.backend);
}

Status run_merge(const MergeParams& p) {
  return p.device.type == DeviceType::cuda ? detail::cuda_merge(p) : detail::cpu_merge(p);
}

Status merge_attention_states(const MergeArgs& args) {
  MergeParams p;
  Status st = make_merge_params(args, &p);
  if (!st.ok()) return st;
  return run_merge(p);
}

bool built_with_cuda() {
#ifdef FLASHATTN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() { return detail::cuda_device_count_impl(); }
Status release_cached_memory() { return detail::release_cached_memory_impl(); }
int cuda_compute_capability(int device_index) { return detail::cuda_compute_capability_impl(device_index); }
const char* version() { return FLASHATTN_VERSION; }

}  // namespace flashattn
