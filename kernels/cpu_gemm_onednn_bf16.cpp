// kernels::gemm with bf16 operands on CPUs with bf16 units: oneDNN's matmul primitive, bf16 source
// and weights, f32 destination (products summed in f32 by AVX512-BF16's vdpbf16ps or AMX's tiles).
//
// oneDNN 2.6 has no bf16 counterpart of dnnl_sgemm in its C API, so this builds a matmul primitive
// for each distinct product (shape, strides, alpha, beta) and keeps it per thread until the thread
// ends: a training step repeats the same few products, and creating one costs far more than running
// a small one. The transposes are strides, as dnnl_sgemm's 'T' is: no operand is copied. alpha is the
// primitive's output scale, beta a sum post-op (c = alpha op(a) op(b) + beta c, as BLAS defines it).
//
// Looked up, on first use, in the libdnnl that kernels/cpu_gemm_onednn.cpp loaded.
#ifdef TINYDDP_WITH_ONEDNN

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <map>
#include <mutex>
#include <tuple>

#include "tinyddp/core/error.h"
#include "tinyddp/kernels/cpu_gemm_libraries.h"

namespace tinyddp::kernels::detail {

namespace {

struct Matmul {
  decltype(&dnnl_engine_create) engine_create = nullptr;
  decltype(&dnnl_stream_create) stream_create = nullptr;
  decltype(&dnnl_stream_wait) stream_wait = nullptr;
  decltype(&dnnl_stream_destroy) stream_destroy = nullptr;
  decltype(&dnnl_memory_desc_init_by_strides) memory_desc_init_by_strides = nullptr;
  decltype(&dnnl_matmul_desc_init) matmul_desc_init = nullptr;
  decltype(&dnnl_primitive_attr_create) attr_create = nullptr;
  decltype(&dnnl_primitive_attr_destroy) attr_destroy = nullptr;
  decltype(&dnnl_primitive_attr_set_output_scales) attr_set_output_scales = nullptr;
  decltype(&dnnl_primitive_attr_set_post_ops) attr_set_post_ops = nullptr;
  decltype(&dnnl_post_ops_create) post_ops_create = nullptr;
  decltype(&dnnl_post_ops_destroy) post_ops_destroy = nullptr;
  decltype(&dnnl_post_ops_append_sum) post_ops_append_sum = nullptr;
  decltype(&dnnl_primitive_desc_create) primitive_desc_create = nullptr;
  decltype(&dnnl_primitive_desc_destroy) primitive_desc_destroy = nullptr;
  decltype(&dnnl_primitive_create) primitive_create = nullptr;
  decltype(&dnnl_primitive_execute) primitive_execute = nullptr;
  decltype(&dnnl_primitive_destroy) primitive_destroy = nullptr;
  decltype(&dnnl_memory_create) memory_create = nullptr;
  decltype(&dnnl_memory_destroy) memory_destroy = nullptr;
  dnnl_engine_t engine = nullptr;
  std::string error;  // why it cannot be used; empty when it can
};

template <typename Function>
void find(void* library, const char* name, Function& function, std::string& error) {
  function = reinterpret_cast<Function>(library ? dlsym(library, name) : nullptr);
  if (!function && error.empty()) error = std::string(name) + " not found in libdnnl";
}

// The primitive for one product, kept for the life of the thread that made it.
struct Product {
  dnnl_memory_desc_t a, b, c;
  dnnl_primitive_t primitive = nullptr;
};
using ProductKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

// Describes op(a) [m, k], op(b) [k, n] and c [m, n] as stored: a transpose is a swap of strides.
void describe(const Matmul& dnnl, bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
              int64_t ldc, Product& p) {
  dnnl_dims_t a_dims = {m, k}, b_dims = {k, n}, c_dims = {m, n};
  dnnl_dims_t a_strides = {ta ? 1 : lda, ta ? lda : 1}, b_strides = {tb ? 1 : ldb, tb ? ldb : 1}, c_strides = {ldc, 1};
  dnnl.memory_desc_init_by_strides(&p.a, 2, a_dims, dnnl_bf16, a_strides);
  dnnl.memory_desc_init_by_strides(&p.b, 2, b_dims, dnnl_bf16, b_strides);
  dnnl.memory_desc_init_by_strides(&p.c, 2, c_dims, dnnl_f32, c_strides);
}

// A primitive descriptor for the product, or the status oneDNN refused it with.
dnnl_status_t create_descriptor(const Matmul& dnnl, Product& p, float alpha, float beta, dnnl_primitive_desc_t* pd) {
  dnnl_matmul_desc_t desc;
  dnnl_status_t status = dnnl.matmul_desc_init(&desc, &p.a, &p.b, nullptr, &p.c);
  if (status != dnnl_success) return status;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post_ops = nullptr;
  dnnl.attr_create(&attr);
  if (alpha != 1.f) dnnl.attr_set_output_scales(attr, 1, 0, &alpha);
  if (beta != 0.f) {
    dnnl.post_ops_create(&post_ops);
    dnnl.post_ops_append_sum(post_ops, beta);
    dnnl.attr_set_post_ops(attr, post_ops);
  }
  status = dnnl.primitive_desc_create(pd, &desc, attr, dnnl.engine, nullptr);
  if (post_ops) dnnl.post_ops_destroy(post_ops);
  dnnl.attr_destroy(attr);
  return status;
}

Matmul load() {
  Matmul dnnl;
  std::string why_not;
  if (!onednn_loadable(&why_not)) {
    dnnl.error = why_not;
    return dnnl;
  }
  void* library = onednn_library();
  find(library, "dnnl_engine_create", dnnl.engine_create, dnnl.error);
  find(library, "dnnl_stream_create", dnnl.stream_create, dnnl.error);
  find(library, "dnnl_stream_wait", dnnl.stream_wait, dnnl.error);
  find(library, "dnnl_stream_destroy", dnnl.stream_destroy, dnnl.error);
  find(library, "dnnl_memory_desc_init_by_strides", dnnl.memory_desc_init_by_strides, dnnl.error);
  find(library, "dnnl_matmul_desc_init", dnnl.matmul_desc_init, dnnl.error);
  find(library, "dnnl_primitive_attr_create", dnnl.attr_create, dnnl.error);
  find(library, "dnnl_primitive_attr_destroy", dnnl.attr_destroy, dnnl.error);
  find(library, "dnnl_primitive_attr_set_output_scales", dnnl.attr_set_output_scales, dnnl.error);
  find(library, "dnnl_primitive_attr_set_post_ops", dnnl.attr_set_post_ops, dnnl.error);
  find(library, "dnnl_post_ops_create", dnnl.post_ops_create, dnnl.error);
  find(library, "dnnl_post_ops_destroy", dnnl.post_ops_destroy, dnnl.error);
  find(library, "dnnl_post_ops_append_sum", dnnl.post_ops_append_sum, dnnl.error);
  find(library, "dnnl_primitive_desc_create", dnnl.primitive_desc_create, dnnl.error);
  find(library, "dnnl_primitive_desc_destroy", dnnl.primitive_desc_destroy, dnnl.error);
  find(library, "dnnl_primitive_create", dnnl.primitive_create, dnnl.error);
  find(library, "dnnl_primitive_execute", dnnl.primitive_execute, dnnl.error);
  find(library, "dnnl_primitive_destroy", dnnl.primitive_destroy, dnnl.error);
  find(library, "dnnl_memory_create", dnnl.memory_create, dnnl.error);
  find(library, "dnnl_memory_destroy", dnnl.memory_destroy, dnnl.error);
  if (!dnnl.error.empty()) return dnnl;
  if (dnnl.engine_create(&dnnl.engine, dnnl_cpu, 0) != dnnl_success) {
    dnnl.error = "oneDNN could not create its CPU engine";
    return dnnl;
  }
  // Whether this CPU has the matmul at all: the product of Linear's forward at a typical size.
  Product probe;
  describe(dnnl, false, true, 256, 1024, 1024, 1024, 1024, 1024, probe);
  dnnl_primitive_desc_t pd = nullptr;
  const dnnl_status_t status = create_descriptor(dnnl, probe, 1.f, 0.f, &pd);
  if (status == dnnl_success)
    dnnl.primitive_desc_destroy(pd);
  else
    dnnl.error = "oneDNN has no bf16 matmul for this CPU (status " + std::to_string(int(status)) + ")";
  return dnnl;
}

const Matmul& matmul() {
  static const Matmul loaded = load();
  return loaded;
}

// A thread's stream and its primitives, one per distinct product, destroyed when the thread ends
// (for the main thread: at exit, before oneDNN's own statics go).
struct ThreadProducts {
  dnnl_stream_t stream = nullptr;
  std::map<ProductKey, Product> products;

  ThreadProducts() = default;
  ThreadProducts(const ThreadProducts&) = delete;
  ThreadProducts& operator=(const ThreadProducts&) = delete;
  ~ThreadProducts() {
    const Matmul& dnnl = matmul();
    for (auto& [key, product] : products) dnnl.primitive_destroy(product.primitive);
    if (stream) dnnl.stream_destroy(stream);
  }
};

}  // namespace

bool onednn_bf16_matmul_available(std::string* why_not) {
  const Matmul& dnnl = matmul();
  if (why_not) *why_not = dnnl.error;
  return dnnl.error.empty();
}

void onednn_bf16_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                      int64_t ldc) {
  const Matmul& dnnl = matmul();
  TINYDDP_CHECK(dnnl.error.empty(), "gemm: bf16 operands on oneDNN, but ", dnnl.error,
                hint("run with --precision fp32, or let the bf16 operands be rounded f32 (kernels/mixed_gemm.h)"));
  onednn_apply_threads();
  thread_local ThreadProducts thread;
  dnnl_stream_t& stream = thread.stream;
  std::map<ProductKey, Product>& products = thread.products;
  if (!stream)
    TINYDDP_CHECK(dnnl.stream_create(&stream, dnnl.engine, dnnl_stream_default_flags) == dnnl_success,
                  "gemm: oneDNN could not create a CPU stream", hint("run with --precision fp32"));
  const ProductKey key{transpose_a, transpose_b, m, n, k, lda, ldb, ldc, alpha, beta};
  auto found = products.find(key);
  if (found == products.end()) {
    Product p;
    describe(dnnl, transpose_a, transpose_b, m, n, k, lda, ldb, ldc, p);
    dnnl_primitive_desc_t pd = nullptr;
    const dnnl_status_t status = create_descriptor(dnnl, p, alpha, beta, &pd);
    TINYDDP_CHECK(status == dnnl_success, "gemm: oneDNN refused the bf16 matmul [", m, ", ", k, "] x [", k, ", ", n,
                  "] (status ", int(status), ")", hint("run with --precision fp32"));
    const dnnl_status_t created = dnnl.primitive_create(&p.primitive, pd);
    dnnl.primitive_desc_destroy(pd);
    TINYDDP_CHECK(created == dnnl_success, "gemm: oneDNN could not create the bf16 matmul (status ", int(created), ")",
                  hint("run with --precision fp32"));
    found = products.emplace(key, p).first;
  }
  Product& p = found->second;
  dnnl_memory_t memories[3] = {nullptr, nullptr, nullptr};
  dnnl.memory_create(&memories[0], &p.a, dnnl.engine, const_cast<uint16_t*>(a));
  dnnl.memory_create(&memories[1], &p.b, dnnl.engine, const_cast<uint16_t*>(b));
  dnnl.memory_create(&memories[2], &p.c, dnnl.engine, c);
  const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, memories[0]},
                                   {DNNL_ARG_WEIGHTS, memories[1]},
                                   {DNNL_ARG_DST, memories[2]}};
  dnnl_status_t status = dnnl.primitive_execute(p.primitive, stream, 3, args);
  if (status == dnnl_success) status = dnnl.stream_wait(stream);
  for (dnnl_memory_t memory : memories) dnnl.memory_destroy(memory);
  TINYDDP_CHECK(status == dnnl_success, "gemm: oneDNN's bf16 matmul failed with status ", int(status), " for [", m,
                ", ", k, "] x [", k, ", ", n, "]", hint("run with --precision fp32"));
}

}  // namespace tinyddp::kernels::detail

#endif  // TINYDDP_WITH_ONEDNN
