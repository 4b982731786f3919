// The choice of CPU GEMM library (kernels/cpu_gemm.h) and the CPU thread count of both libraries.
#include "tinyddp/kernels/cpu_gemm.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"
#include "tinyddp/kernels/cpu_gemm_libraries.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::kernels {

namespace detail {

bool cpu_has_avx512_core() {
  // gcc's checks include the OS's: a feature counts only when XGETBV says its registers are saved.
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

}  // namespace detail

namespace {

constexpr const char* kChoiceVariable = "TINYDDP_CPU_GEMM";

// When oneDNN is the machine's choice (not when it is asked for), products of fewer multiply-adds
// than this stay on OpenBLAS: 64 x 64 x 64 take about 5 us at 100 GFLOP/s, where what a call costs,
// not the kernel, decides; and a program whose products are all that small -- the seed job's
// Linear(10, 2) -- never loads oneDNN, which costs 7 MB of peak RSS (7.4 -> 14.3 MB for the seed job).
constexpr int64_t kOneDnnMinimumWork = int64_t(64) * 64 * 64;

struct Choice {
  CpuGemm gemm;
  std::string why;
  int64_t onednn_minimum_work = 0;
};

// The choice, made once on first use (chosen is -1 until then), and what may change it later.
std::atomic<int> chosen{-1};
std::atomic<int64_t> onednn_minimum_work{0};
std::mutex choice_mutex;
std::string chosen_why;  // guarded by choice_mutex

void check_available(CpuGemm gemm, const std::string& asked_by) {
  if (gemm == CpuGemm::openblas) return;
#ifdef TINYDDP_WITH_ONEDNN
  std::string why_not;
  TINYDDP_CHECK(detail::onednn_loadable(&why_not), asked_by, " asks for oneDNN, which this machine cannot load (",
                why_not, "); hint: apt-get install libdnnl2, or use OpenBLAS");
#else
  TINYDDP_FAIL(asked_by, " asks for oneDNN, which this build does not have (it has OpenBLAS only)",
               "; hint: install libdnnl-dev (make deps) and configure with -DTINYDDP_ONEDNN=ON");
#endif
}

Choice choose_for_this_machine() {
  if (std::optional<CpuGemm> asked = env::choice<CpuGemm>(kChoiceVariable, {{"openblas", CpuGemm::openblas},
                                                                            {"onednn", CpuGemm::onednn}})) {
    const CpuGemm gemm = *asked;
    const std::string asked_by = std::string(kChoiceVariable) + "=" + *env::text(kChoiceVariable);
    check_available(gemm, asked_by);
    return {gemm, asked_by};
  }
  if (!detail::cpu_has_avx512_core()) return {CpuGemm::openblas, "this CPU has no AVX-512, where OpenBLAS is the faster"};
#ifdef TINYDDP_WITH_ONEDNN
  // Not loaded yet: that waits for the first product large enough (use_onednn_for).
  return {CpuGemm::onednn, "this CPU has AVX-512; products under 64x64x64 on OpenBLAS", kOneDnnMinimumWork};
#else
  return {CpuGemm::openblas, "this CPU has AVX-512, but this build has no oneDNN"};
#endif
}

void set_choice(const Choice& choice) {  // with choice_mutex held
  chosen_why = choice.why;
  onednn_minimum_work.store(choice.onednn_minimum_work);
  chosen.store(int(choice.gemm), std::memory_order_release);
}

}  // namespace

namespace detail {

bool use_onednn_for(int64_t m, int64_t n, int64_t k) {
#ifdef TINYDDP_WITH_ONEDNN
  if (cpu_gemm() != CpuGemm::onednn || m * n * k < onednn_minimum_work.load(std::memory_order_relaxed)) return false;
  std::string why_not;
  if (onednn_loadable(&why_not)) return true;
  // Chosen for the machine, but the machine lacks the library: the program runs on, on the fallback.
  std::lock_guard<std::mutex> lock(choice_mutex);
  if (chosen.load() == int(CpuGemm::onednn)) {
    set_choice({CpuGemm::openblas, "this CPU has AVX-512, but " + why_not});
    log_line(LogLevel::warn, "gemm", "OpenBLAS instead of oneDNN: " + why_not);
  }
  return false;
#else
  (void)m, (void)n, (void)k;
  return false;
#endif
}

}  // namespace detail

const char* cpu_gemm_name(CpuGemm gemm) { return gemm == CpuGemm::onednn ? "oneDNN" : "OpenBLAS"; }

std::vector<CpuGemm> available_cpu_gemms() {
#ifdef TINYDDP_WITH_ONEDNN
  if (detail::onednn_loadable()) return {CpuGemm::openblas, CpuGemm::onednn};
#endif
  return {CpuGemm::openblas};
}

CpuGemm cpu_gemm() {
  if (int gemm = chosen.load(std::memory_order_acquire); gemm >= 0) return CpuGemm(gemm);
  std::lock_guard<std::mutex> lock(choice_mutex);
  if (chosen.load() < 0) set_choice(choose_for_this_machine());
  return CpuGemm(chosen.load());
}

std::string cpu_gemm_description() {
  const CpuGemm gemm = cpu_gemm();
  std::lock_guard<std::mutex> lock(choice_mutex);
#ifdef TINYDDP_WITH_ONEDNN
  if (gemm == CpuGemm::onednn) return detail::onednn_version() + " (" + chosen_why + ")";
#endif
  (void)gemm;
  return detail::openblas_version() + " (" + chosen_why + ")";
}

void set_cpu_gemm(CpuGemm gemm) {
  check_available(gemm, "set_cpu_gemm");
  std::lock_guard<std::mutex> lock(choice_mutex);
  set_choice({gemm, "set_cpu_gemm"});
}

void set_cpu_threads(int threads) {
  TINYDDP_CHECK(threads >= 1, "set_cpu_threads(", threads, "): at least one thread is needed; hint: pass 1 to run "
                "BLAS on the calling thread only");
  // With several DDP processes on one host, each library spawning one thread per core would
  // oversubscribe the cores many times over; one thread per process is what torch.distributed users
  // set too. Both libraries are told, so a later set_cpu_gemm keeps the count.
  detail::openblas_set_threads(threads);
#ifdef TINYDDP_WITH_ONEDNN
  detail::onednn_set_threads(threads);
#endif
}

}  // namespace tinyddp::kernels
