// flashattn: exact attention, softmax(Q Kᵀ · scale) V, computed without materialising the score matrix.
//
// Usage (C++):
//   flashattn::ForwardArgs a;
//   a.q = view_of(q); a.k = view_of(k); a.v = view_of(v); a.out = view_of(out); a.lse = view_of(lse);
//   flashattn::AttentionOptions opt; opt.causal = true;
//   flashattn::Status st = flashattn::attention_forward(a, opt);
//   if (!st.ok()) { std::cerr << st.message; }
//
// Every function validates its input and returns a Status naming the offending argument; nothing is written
// to any output unless validation passed.
#pragma once

#include <string>

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn {

constexpr int64_t kMaxHeadDim = 256;
// d_v may be larger (FA3's MLA shapes: d 64 with d_v 512): the CPU backends take every d_v up to this; the CUDA
// kernels take d_v up to kMaxHeadDim, so the CUDA forward runs wider values in slices of V's columns and the CUDA
// backward declines them.
constexpr int64_t kMaxHeadDimV = 512;

enum class Backend : int {
  automatic = 0,  // the dispatcher picks the fastest backend that supports the call
  cpu_reference,  // naive, materialises S and P in double precision: the oracle, for tests
  cpu_flash,      // tiled online softmax on the CPU, multithreaded
  cuda_sm80,      // mma.sync kernels, compute capability >= 8.0
  cuda_sm90,      // wgmma + TMA kernels, compute capability 9.0
};

const char* backend_name(Backend b);
// Parses "auto", "cpu_reference", "cpu_flash", "cuda_sm80", "cuda_sm90"; false if unknown.
bool parse_backend(const std::string& name, Backend* out);

struct AttentionOptions {
  // <= 0 selects the default 1 / sqrt(head_dim) (1 / sqrt(head_dim + head_dim_v) with qv, as FA3). Applied in fp32
  // (rounded to the nearest float), as is softcap.
  double softmax_scale = 0.0;
  bool causal = false;
  // Sliding window around the (bottom-right aligned) diagonal; -1 = unbounded on that side.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Chunked attention (FlashAttention-3's attention_chunk, Llama 4's local layers); 0 = off. The keys are cut
  // into chunks of attention_chunk keys ([0, c), [c, 2c), ...) and query row i sees only the keys of the chunk
  // that holds its diagonal i + s_k - s_q (a row with a negative diagonal sees nothing), on top of causal and the
  // window. Every backend; on cuda_sm90 the backward runs cuda_sm80's kernels (automatic dispatch picks them).
  int64_t attention_chunk = 0;
  // Scores become softcap * tanh(scores / softcap); 0 = off.
  double softcap = 0.0;
  // Attention dropout: probabilities dropped with probability dropout_p in [0, 1), kept ones scaled by
  // 1 / (1 - dropout_p), as flash_attn 2. The mask is a function of (dropout_seed, dropout_offset) and of each
  // element's (sequence, query head, query row, key) alone (not of the batch size or head count): the backward of
  // a forward must get the same seed and offset; a call with another offset (or seed) draws a fresh mask.
  // Forward and backward on every backend. ForwardArgs::dropout_rng, when given, replaces the two below.
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  // Backward only: gradients bitwise identical from run to run.
  bool deterministic = false;
  Backend backend = Backend::automatic;
  void* stream = nullptr;  // cudaStream_t (CUDA tensors); nullptr = the default stream
  int num_threads = 0;     // CPU backends: 0 = all hardware threads
};

// Padded batch: q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v], out [b, s_q, h_q, d_v],
// lse [b, h_q, s_q] (fp32, optional: leave undefined to skip).
// Varlen: q [total_q, h_q, d], k [total_k, h_kv, d], v [total_k, h_kv, d_v], out [total_q, h_q, d_v],
// lse [h_q, total_q]; cu_seqlens_q / cu_seqlens_k int32 [b + 1], non-decreasing from 0 to the totals;
// max_seqlen_q / max_seqlen_k bound every sequence's length.
// alibi_slopes (optional): fp32 [h_q] or [b, h_q] on q's device, last dim contiguous; query head h of sequence b
// adds -slope · |i + s_k - s_q - j| to its score for key j, after scale and softcap, with or without a mask
// (flash_attn 2's ALiBi; the LSE is that of the biased scores). CPU slopes are checked to be finite; CUDA slopes
// are not read on the host (a non-finite slope makes the rows of its head NaN).
struct ForwardArgs {
  TensorView q, k, v, out, lse;
  TensorView cu_seqlens_q, cu_seqlens_k;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  TensorView alibi_slopes;
  // float8_e4m3fn q, k, v (all three): out is float16 or bfloat16, and these optional fp32 [batch, heads_kv]
  // factors scale them (FA3's descales; undefined = 1). Forward only: the CPU backends and cuda_sm90 (Hopper).
  TensorView q_descale, k_descale, v_descale;
  // Dropout's seed and offset as int64 [2] {seed, offset} on q's device (optional; only with dropout_p > 0): read
  // where the mask is drawn (by the kernels on CUDA) instead of AttentionOptions' dropout_seed / dropout_offset, so
  // a CUDA graph that captured the call draws a fresh mask on every replay when a captured random op rewrites it
  // (PyTorch's graph-safe generator does). The same mask as the options' values would give; the backward must be
  // given the same tensor, holding the same values.
  TensorView dropout_rng;
  // FA3's qv (optional): [b, s_q, h_q, d_v] (varlen [total_q, h_q, d_v]) in q's dtype, last dim contiguous; each
  // score becomes scale · (q·k + qv·v) before softcap, ALiBi and the mask (DeepSeek MLA's absorbed attention: the
  // latent values double as keys). Forward only (a backward given qv is refused, as in FA3), CPU backends; not
  // with float8_e4m3fn inputs.
  TensorView qv;
};

// The forward's inputs plus dout (like out) and the gradients dq, dk, dv (like q, k, v). lse is required.
// float8_e4m3fn q, k, v: dout is float8_e4m3fn too, scaled by do_descale (fp32 [batch, heads_kv] like q_descale,
// undefined = 1); out and the gradients are in out's 16-bit dtype, the gradients those of the dequantised inputs.
// The CPU backends only for now.
struct BackwardArgs : ForwardArgs {
  TensorView dout, dq, dk, dv;
  TensorView do_descale;
};

// Attention over a key/value cache (flash_attn_with_kvcache), forward only.
//   q        [b, s_q, h_q, d], or [total_q, h_q, d] with cu_seqlens_q ([b + 1]) and max_seqlen_q (0 = computed;
//            cu_seqlens_q is then read on the host, like the index tensors below)
//   k_cache  dense [b_cache, s_cache, h_kv, d] or, with block_table, paged [num_pages, page_size, h_kv, d]
//   v_cache  like k_cache with d_v; both writable when k_new / v_new are given
//   cache_seqlens   int32 [b]: rows in use before appending (absolute, leftpad included); undefined = all rows
//   k_new, v_new    [b, s_new, h_kv, d / d_v]: appended in place at rows cache_seqlens[b] .. + s_new, then attended;
//                   or [total_new, h_kv, d / d_v] with cu_seqlens_k_new (int32 [b + 1]): sequence b appends rows
//                   cu_seqlens_k_new[b] .. cu_seqlens_k_new[b + 1] - 1 (FA3's varlen append)
//   rotary_cos/sin  [s_ro, rotary_dim / 2] in q's dtype, contiguous; need k_new; rotate k_new and q (see params.h)
//   rotary_seqlens  int32 [b]: the rotary positions' base per sequence (FA3); undefined = cache_seqlens. Without
//                   rotary_cos / rotary_sin nothing rotates: checked (shape, dtype, device), then unused
//   cache_batch_idx int32 [b]: cache entry (dense row / block_table row) of sequence b
//   cache_leftpad   int32 [b]: first used cache row of sequence b
//   block_table     int32 [entries, max_pages], last dim contiguous: the pages of each entry (any page size)
//   out [like q with d_v], lse [b, h_q, s_q] (varlen: [h_q, total_q]) fp32, optional
//   alibi_slopes    fp32 [h_q] or [b, h_q], as for ForwardArgs; distances count from each sequence's diagonal
//                   over its used keys (cache_seqlens + new rows - cache_leftpad)
// The index tensors may live on the device (no host round trip is needed to run). With check_index_values (the
// default) cache_seqlens, cache_leftpad and cache_batch_idx are read on the host first (a synchronising copy each
// on CUDA) and every value is checked (lengths within the capacity, entries in range), naming the argument; the
// block table's pages too for CPU tensors. Turn it off under CUDA-graph capture. Unchecked values are clamped by
// the kernels: lengths to the capacity, an entry out of range gives an empty sequence, a page out of range reads
// as zeros and is never written; nothing outside the tensors is read or written.
struct KVCacheArgs {
  TensorView q, k_cache, v_cache, out, lse;
  TensorView cache_seqlens, k_new, v_new, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table;
  TensorView cu_seqlens_q;
  TensorView cu_seqlens_k_new, rotary_seqlens;
  TensorView alibi_slopes;
  // float8_e4m3fn q, caches and new rows (FA3's FP8 KV cache): fp32 [batch, heads_kv] descales as in ForwardArgs (the
  // k / v descales apply to every row of sequence b's cache), out in bfloat16 or float16. CPU backends only for now;
  // no rotary embedding (e4m3 rows would need requantising).
  TensorView q_descale, k_descale, v_descale;
  // qv like q with d_v columns (as in ForwardArgs; not rotated). CPU backends.
  TensorView qv;
  int64_t max_seqlen_q = 0;
  bool rotary_interleaved = true;
  int num_splits = 0;  // CUDA: key splits per sequence (1 = none); 0 = chosen from the shape
  bool check_index_values = true;
};

// Attention over the union of two disjoint key sets, from the attention over each (split-KV decoding, cascade /
// prefix-shared attention, ring attention): out_a, lse_a over key set A and out_b, lse_b over B give
//   lse = log(exp(lse_a) + exp(lse_b)),   out = exp(lse_a - lse) · out_a + exp(lse_b - lse) · out_b
// for every (row, head). A side whose LSE is -inf (it saw no key) gets weight 0 and its out is not read (it may hold
// anything); a row neither side saw gets out 0 and lse -inf; a NaN LSE on either side makes the row NaN.
//   out_a, out_b, out  [b, s, h, d_v] (or [total, h, d_v]), last dim contiguous; out_a and out in one of float32,
//                      float16, bfloat16, out_b in any of them
//   lse_a, lse_b, lse  fp32 [b, h, s] (or [h, total]), last dim contiguous; lse optional (undefined: not written)
// out may be the same view as out_a or out_b, and lse as lse_a or lse_b (accumulating in place); any other
// overlap between an output and an input is rejected. Arithmetic in fp32. CPU or CUDA tensors (all on one device).
struct MergeArgs {
  TensorView out_a, lse_a, out_b, lse_b, out, lse;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors; nullptr = the default stream
  int num_threads = 0;     // CPU: 0 = all hardware threads
};
Status merge_attention_states(const MergeArgs& args);
Status make_merge_params(const MergeArgs& args, MergeParams* params);
Status run_merge(const MergeParams& params);

// What the dispatcher would run for a call, and why.
struct BackendChoice {
  Backend backend = Backend::cpu_flash;
  Status status;       // not ok: no backend can run this call (message says why)
  std::string reason;  // one line: why this backend (and why faster ones were passed over)
};

Status attention_forward(const ForwardArgs& args, const AttentionOptions& options = {});
Status attention_backward(const BackwardArgs& args, const AttentionOptions& options = {});
// Appends (k_new / v_new, with rotary) and attends over the cache. `options.deterministic` does not apply.
Status attention_with_kvcache(const KVCacheArgs& args, const AttentionOptions& options = {});

// Validation alone: fills `params` on success. Exposed for engines that launch many times with one layout.
Status make_forward_params(const ForwardArgs& args, const AttentionOptions& options, FwdParams* params);
Status make_backward_params(const BackwardArgs& args, const AttentionOptions& options, BwdParams* params);
Status make_kvcache_params(const KVCacheArgs& args, const AttentionOptions& options, KVCacheParams* params);

// The backend choice for already validated params (`backward` selects for the backward pass, judged from the
// forward's params: dout and the gradients laid out like out, q, k, v; `deterministic` as the backward's
// option), and for a backward's own params.
BackendChoice choose_backend(const FwdParams& params, Backend requested, bool backward, bool deterministic = false);
BackendChoice choose_backend(const BwdParams& params, Backend requested);

// Run validated params on a backend (automatic allowed). No validation beyond backend support.
Status run_forward(const FwdParams& params, Backend backend = Backend::automatic);
Status run_backward(const BwdParams& params, Backend backend = Backend::automatic);
Status run_kvcache(const KVCacheParams& params, Backend backend = Backend::automatic);

// The CUDA backends take their scratch memory (the backward's workspace, O(b·h·s·d) floats; a few bytes for
// the Hopper forward) from one pool per device that the library keeps between calls, so repeated calls do not
// map memory again; the pool holds at most the largest workspace used so far. This waits for each device's
// work and returns the pools' unused memory to the driver (like torch.cuda.empty_cache()). Success without
// CUDA.
Status release_cached_memory();

// Build information.
bool built_with_cuda();
int cuda_device_count();            // 0 without CUDA or without a device
int cuda_compute_capability(int device_index);  // major * 10 + minor, or 0
const char* version();
// The instruction-set level the cpu_flash kernels run at in this process: "avx512", "avx2" or "baseline" (chosen
// once from the CPU, capped by the environment variable FLASHATTN_CPU_ISA), "native" in a FLASHATTN_NATIVE build,
// "none" when FLASHATTN_CPU_ISA names a level the build lacks (cpu_flash calls then fail saying so).
const char* cpu_isa();

}  // namespace flashattn
