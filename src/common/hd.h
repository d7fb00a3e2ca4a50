// One macro so that the pieces shared by CPU and CUDA code (mask, online-softmax state) compile in both.
#pragma once

#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif
