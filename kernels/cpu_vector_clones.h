// Builds a CPU loop twice, for AVX2 and for the baseline x86-64 (SSE2), and picks one at load time.
//
// The library is compiled for any x86-64 (no -march=native: one binary runs on every host of a
// cluster), which limits the vectoriser to 4-wide SSE. For the loops that do real work per element
// (Adam's square root and two divisions), 8-wide AVX2 halves the instruction count. "avx2" alone does
// not enable FMA, so the compiler cannot fuse a*b + c into one rounding: both clones give bit-identical
// results, the same as the CUDA kernel's arithmetic. On other architectures the macro is empty.
// Internal to kernels/*.cpp.
#pragma once

// Not under ThreadSanitizer: the clone is picked by an ifunc resolver that the dynamic loader runs
// before the TSan runtime is up, and the instrumented resolver crashes every program at load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(__SANITIZE_THREAD__)
#define TINYDDP_CPU_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TINYDDP_CPU_VECTOR_CLONES
#endif
