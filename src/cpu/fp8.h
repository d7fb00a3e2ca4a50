// float8_e4m3fn inputs on the CPU backends (fp8.cpp): dequantised with their descale factors, then the usual
// fp32 path, the output rounded to its 16-bit dtype. It is every FP8 test's oracle path, so it stays exact: an
// e4m3 value times an fp32 descale is one fp32 product, the same rounding any FP8 kernel's scaling makes.
#pragma once

#include "backend.h"

namespace flashattn::detail {

// Runs `run` (a CPU backend's fp32 forward) on p's e4m3 Q, K, V dequantised into scratch, then writes O in
// p.out_dtype; LSE as `run` writes it.
Status cpu_fp8_forward(const FwdParams& p, ForwardFn run);

// Runs `run` (a CPU backend's fp32 backward) on p's e4m3 Q, K, V, dO dequantised (dO with do_descale, grouped like
// Q's) and O widened to fp32, then writes dQ, dK, dV in p.out_dtype: the gradients of the dequantised inputs.
using BackwardFn = Status (*)(const BwdParams&);
Status cpu_fp8_backward(const BwdParams& p, BackwardFn run);

}  // namespace flashattn::detail
