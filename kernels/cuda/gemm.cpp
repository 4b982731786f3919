// GEMM on the GPU through cuBLAS.
//
// cuBLAS is column-major (Fortran order); tinyddp's tensors are row-major. A row-major matrix read as
// column-major is its transpose, so instead of transposing anything we ask cuBLAS for the transpose of
// the result: C^T = op(B)^T op(A)^T. With every matrix seen "as stored", that is cublasSgemm with the
// operands swapped (B first), m and n swapped, and the same transpose flags.
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "tinyddp/core/cuda_check.h"
#include "tinyddp/kernels/cuda/cublas_check.h"
#include "tinyddp/kernels/cuda/cuda_kernels.h"

namespace tinyddp::kernels::cuda {

namespace {

// One cuBLAS handle per device, created the first time that device multiplies. A handle holds
// workspace memory on its device and is expensive to create (milliseconds), so it lives for the rest
// of the process. It is deliberately never destroyed: at exit the CUDA runtime may already be shut
// down, and cublasDestroy would then fail inside a static destructor.
cublasHandle_t handle_for(int device) {
  static std::mutex mutex;
  static std::vector<cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  if (handles.empty()) {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    handles.resize(size_t(count), nullptr);
  }
  TINYDDP_CHECK(device >= 0 && size_t(device) < handles.size(), "gemm: cuda:", device, " does not exist (",
                handles.size(), " CUDA device(s))", hint("use a tensor on an existing device"));
  if (handles[size_t(device)] == nullptr) {
    CUDA_CHECK(cudaSetDevice(device));
    CUBLAS_CHECK(cublasCreate(&handles[size_t(device)]));
  }
  return handles[size_t(device)];
}

}  // namespace

void gemm_mixed(int device, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                const void* a, int64_t lda, const void* b, int64_t ldb, DType operands, float beta, float* c,
                int64_t ldc) {
  TINYDDP_CHECK(operands == DType::bf16 || operands == DType::f16,
                "gemm: the operands of a mixed-precision GEMM "
                "must be bf16 or f16 (dtype ",
                int(operands), ")", hint("f32 operands go through gemm"));
  const cudaDataType_t type = operands == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  cublasHandle_t handle = handle_for(device);
  CUDA_CHECK(cudaSetDevice(device));
  // The same operand swap as gemm below; f32 alpha, beta and c with CUBLAS_COMPUTE_32F: every product
  // of narrow values is summed in f32 (tensor cores from Volta (f16) and Ampere (bf16) on).
  CUBLAS_CHECK(cublasGemmEx(handle, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            int(n), int(m), int(k), &alpha, b, type, int(ldb), a, type, int(lda), &beta, c, CUDA_R_32F,
                            int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm(int device, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cublasHandle_t handle = handle_for(device);
  CUDA_CHECK(cudaSetDevice(device));
  // The handle runs on the default stream (stream 0), in order with tinyddp's kernels on this device.
  CUBLAS_CHECK(cublasSgemm(handle, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                           int(n), int(m), int(k), &alpha, b, int(ldb), a, int(lda), &beta, c, int(ldc)));
}

}  // namespace tinyddp::kernels::cuda
