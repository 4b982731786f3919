// TINYDDP_HD marks a function that runs on both the CPU and the GPU.
//
// Every piece of per-element math (an Adam update, a GELU, a Philox round) is written once with
// this marker. g++ sees a plain inline function; nvcc sees `__host__ __device__`. The CPU tests
// therefore check exactly the arithmetic that the CUDA kernels execute.
#pragma once

#if defined(__CUDACC__)
#define TINYDDP_HD __host__ __device__ __forceinline__
#else
#define TINYDDP_HD inline
#endif
