// Options of `flashattn run`, parsed from argv. Every option maps onto one field of the public API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

namespace flashattn::cli {

struct RunOptions {
  int64_t batch = -1;  // -1: a default chosen for the device
  int64_t seqlen_q = -1, seqlen_k = -1;
  int64_t heads = -1, heads_kv = -1;
  int64_t head_dim = -1, head_dim_v = -1;
  std::vector<int64_t> varlen_q, varlen_k;  // per-sequence lengths; non-empty selects the varlen API
  std::string dtype;                        // "" = bf16 on CUDA, fp32 on the CPU
  std::string layout = "bshd";              // storage order of Q/K/V/O: bshd or bhsd
  std::string device = "auto";              // auto, cpu, cuda
  AttentionOptions attn;
  bool backward = false;
  int warmup = -1, iters = -1;  // -1: defaults for the device
  int check_rows = 8;           // sampled query rows compared with the double-precision reference; 0 = none
  uint64_t seed = 0;
  bool json = false;
};

// Parses `flashattn run` arguments (argv after "run"). Returns false with `error` set on a bad option.
bool parse_run_options(const std::vector<std::string>& args, RunOptions* out, std::string* error);

const char* run_usage();
const char* main_usage();

}  // namespace flashattn::cli
