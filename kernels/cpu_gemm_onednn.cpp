// kernels::gemm on the CPU through oneDNN's dnnl_sgemm, on CPUs where it is the faster library
// (kernels/cpu_gemm.h says which those are).
//
// Debian's oneDNN runs its threads on OpenMP (libgomp), so its thread count is OpenMP's: set per
// calling thread with omp_set_num_threads, applied here before a call whenever it differs from what
// that thread last applied.
#ifdef TINYDDP_WITH_ONEDNN

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

#include <atomic>
#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu_gemm_libraries.h"

namespace tinyddp::kernels::detail {

namespace {

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

void apply_thread_count() {
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
    omp_set_num_threads(wanted);
    applied_threads = wanted;
  }
  if ((wanted != 0 ? wanted : omp_get_max_threads()) > 1) ran_thread_team.store(true, std::memory_order_relaxed);
}

}  // namespace

void onednn_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  apply_thread_count();
  // dnnl_sgemm is row-major, like the rest of tinyddp (unlike Fortran BLAS).
  dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                                    beta, c, ldc);
  TINYDDP_CHECK(status == dnnl_success, "gemm: oneDNN's dnnl_sgemm failed with status ", int(status), " for [", m,
                ", ", k, "] x [", k, ", ", n, "]; hint: run with TINYDDP_CPU_GEMM=openblas to use OpenBLAS instead");
}

void onednn_set_threads(int threads) { requested_threads.store(threads); }

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

bool onednn_has_avx512() {
  // The ISA levels are bit sets: avx512_core's bits are all present exactly on AVX-512 (F, CD, BW, DQ,
  // VL) cores and the levels above them (VNNI, BF16, AMX); avx2_vnni has other bits.
  const unsigned isa = unsigned(dnnl_get_effective_cpu_isa());
  return (isa & unsigned(dnnl_cpu_isa_avx512_core)) == unsigned(dnnl_cpu_isa_avx512_core);
}

}  // namespace tinyddp::kernels::detail

#endif  // TINYDDP_WITH_ONEDNN
