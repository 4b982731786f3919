// kernels::gemm on the CPU through oneDNN's dnnl_sgemm, on CPUs where it is the faster library
// (kernels/cpu_gemm.h says which those are).
//
// oneDNN is loaded (dlopen) the first time it is chosen, not linked: it is a 40 MB library that
// pulls in OpenMP and OpenCL, and a program that never uses it -- one on a CPU where OpenBLAS is the
// faster, or one whose machine lacks the library -- should neither carry it (3 MB more peak RSS for
// the seed job when linked) nor fail to start without it.
//
// Debian's oneDNN runs its threads on OpenMP (libgomp), so its thread count is OpenMP's: set per
// calling thread with omp_set_num_threads, applied here before a call whenever it differs from what
// that thread last applied.
#ifdef TINYDDP_WITH_ONEDNN

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>  // the types and the version this build was written against
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <utility>

#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"
#include "tinyddp/kernels/cpu_gemm_libraries.h"

namespace tinyddp::kernels::detail {

namespace {

#define TINYDDP_STRINGIFY2(x) #x
#define TINYDDP_STRINGIFY(x) TINYDDP_STRINGIFY2(x)
// The soname of the oneDNN this build's header belongs to: libdnnl.so.2 for 2.x.
constexpr const char* kLibrary = "libdnnl.so." TINYDDP_STRINGIFY(DNNL_VERSION_MAJOR);

// What is used of oneDNN and of the OpenMP runtime it brings.
struct OneDnn {
  decltype(&dnnl_sgemm) sgemm = nullptr;
  decltype(&dnnl_version) version = nullptr;
  decltype(&dnnl_get_effective_cpu_isa) effective_isa = nullptr;
  void (*omp_set_num_threads)(int) = nullptr;
  int (*omp_get_max_threads)() = nullptr;
  void* library = nullptr;  // the dlopen handle, for the other oneDNN calls (cpu_gemm_onednn_bf16.cpp)
  std::string error;        // why it is not there; empty when loaded
};

template <typename Function>
Function symbol(void* library, const char* name, std::string& error) {
  void* address = library ? dlsym(library, name) : nullptr;
  if (!address && error.empty()) error = std::string(name) + " not found: " + dlerror();
  return reinterpret_cast<Function>(address);
}

OneDnn load() {
  OneDnn loaded;
  // Kept for the life of the process (never dlclose'd: its threads may outlive any caller).
  void* dnnl = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!dnnl) {
    loaded.error = std::string("cannot load ") + kLibrary + ": " + dlerror();
    return loaded;
  }
  loaded.library = dnnl;
  // libdnnl needs libgomp, so it is loaded now: this finds it without loading anything.
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
  loaded.sgemm = symbol<decltype(&dnnl_sgemm)>(dnnl, "dnnl_sgemm", loaded.error);
  loaded.version = symbol<decltype(&dnnl_version)>(dnnl, "dnnl_version", loaded.error);
  loaded.effective_isa = symbol<decltype(&dnnl_get_effective_cpu_isa)>(dnnl, "dnnl_get_effective_cpu_isa",
                                                                       loaded.error);
  loaded.omp_set_num_threads = symbol<void (*)(int)>(gomp, "omp_set_num_threads", loaded.error);
  loaded.omp_get_max_threads = symbol<int (*)()>(gomp, "omp_get_max_threads", loaded.error);
  if (!gomp && loaded.error.empty()) loaded.error = std::string(kLibrary) + " is not threaded with libgomp.so.1";
  return loaded;
}

const OneDnn& onednn() {
  static const OneDnn loaded = load();
  return loaded;
}

// 0 until set_cpu_threads is called: OpenMP's default, one thread per core.
std::atomic<int> requested_threads{0};
thread_local int applied_threads = 0;

// libgomp is not fork-safe: a child forked after the parent ran a team of OpenMP threads hangs in its
// first parallel region, waiting for threads that fork() did not copy. Such a child runs oneDNN on
// its calling thread alone (a team of one never touches the pool).
std::atomic<bool> ran_thread_team{false};
std::atomic<bool> forked_after_thread_team{false};

void after_fork_in_child() {
  if (ran_thread_team.load()) forked_after_thread_team.store(true);
}

void apply_thread_count(const OneDnn& dnnl) {
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, after_fork_in_child); });
  int wanted = requested_threads.load(std::memory_order_relaxed);
  if (forked_after_thread_team.load(std::memory_order_relaxed) && wanted != 1) {
    static std::once_flag told;
    std::call_once(told, [] {
      log_line(LogLevel::warn, "gemm",
               "oneDNN runs on one thread in this process: it was forked after its parent ran OpenMP threads, "
               "which libgomp cannot carry into a child; start workers with exec (MultiDevice, tinyddp-run) for more");
    });
    wanted = 1;
  }
  if (wanted != 0 && wanted != applied_threads) {
    dnnl.omp_set_num_threads(wanted);
    applied_threads = wanted;
  }
  if ((wanted != 0 ? wanted : dnnl.omp_get_max_threads()) > 1) ran_thread_team.store(true, std::memory_order_relaxed);
}

}  // namespace

bool onednn_loadable(std::string* why_not) {
  const OneDnn& dnnl = onednn();
  if (why_not) *why_not = dnnl.error;
  return dnnl.error.empty();
}

void onednn_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const OneDnn& dnnl = onednn();
  TINYDDP_CHECK(dnnl.error.empty(), "gemm: oneDNN was chosen but ", dnnl.error,
                hint("apt-get install libdnnl2, or run with TINYDDP_CPU_GEMM=openblas"));
  apply_thread_count(dnnl);
  // dnnl_sgemm is row-major, like the rest of tinyddp (unlike Fortran BLAS).
  dnnl_status_t status = dnnl.sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                                    beta, c, ldc);
  TINYDDP_CHECK(status == dnnl_success, "gemm: oneDNN's dnnl_sgemm failed with status ", int(status), " for [", m, ", ",
                k, "] x [", k, ", ", n, "]", hint("run with TINYDDP_CPU_GEMM=openblas to use OpenBLAS instead"));
}

void onednn_set_threads(int threads) { requested_threads.store(threads); }

void onednn_apply_threads() { apply_thread_count(onednn()); }

void* onednn_library() { return onednn().error.empty() ? onednn().library : nullptr; }

std::string onednn_version() {
  const OneDnn& dnnl = onednn();
  if (!dnnl.error.empty()) return "oneDNN (not loaded)";
  const dnnl_version_t* v = dnnl.version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string onednn_isa_name() {
  // From the widest down: each ISA's flags include those of every ISA it extends.
  static const std::pair<dnnl_cpu_isa_t, const char*> names[] = {{dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
                                                                 {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
                                                                 {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
                                                                 {dnnl_cpu_isa_avx512_core, "avx512_core"},
                                                                 {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
                                                                 {dnnl_cpu_isa_avx2, "avx2"},
                                                                 {dnnl_cpu_isa_avx, "avx"},
                                                                 {dnnl_cpu_isa_sse41, "sse41"}};
  const unsigned isa = unsigned(onednn().effective_isa());
  for (const auto& [flags, name] : names)
    if ((isa & unsigned(flags)) == unsigned(flags)) return name;
  return "generic";
}

VectorClass onednn_vector_class() {
  const unsigned isa = unsigned(onednn().effective_isa());
  if ((isa & unsigned(dnnl_cpu_isa_avx512_core)) == unsigned(dnnl_cpu_isa_avx512_core)) return VectorClass::avx512;
  if ((isa & unsigned(dnnl_cpu_isa_avx2)) == unsigned(dnnl_cpu_isa_avx2)) return VectorClass::avx2;
  return VectorClass::narrower;
}

}  // namespace tinyddp::kernels::detail

#endif  // TINYDDP_WITH_ONEDNN
