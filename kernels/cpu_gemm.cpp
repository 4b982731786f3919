// The choice of CPU GEMM library (kernels/cpu_gemm.h) and the CPU thread count of both libraries.
#include "kernels/cpu_gemm.h"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "kernels/cpu_gemm_libraries.h"
#include "kernels/ops.h"

namespace tinyddp::kernels {

namespace {

constexpr const char* kChoiceVariable = "TINYDDP_CPU_GEMM";

struct Choice {
  CpuGemm gemm;
  std::string why;
};

std::string available_names() {
  std::string names;
  for (CpuGemm gemm : available_cpu_gemms()) names += std::string(names.empty() ? "" : ", ") + cpu_gemm_name(gemm);
  return names;
}

void check_available(CpuGemm gemm, const std::string& asked_by) {
  bool built = false;
  for (CpuGemm have : available_cpu_gemms()) built = built || have == gemm;
  TINYDDP_CHECK(built, asked_by, " asks for ", cpu_gemm_name(gemm), ", which this build does not have (it has ",
                available_names(), "); hint: install libdnnl-dev (make deps) and configure with -DTINYDDP_ONEDNN=ON");
}

Choice choose_for_this_machine() {
  if (const char* value = std::getenv(kChoiceVariable); value && *value) {
    std::string name = value;
    for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    const std::string asked_by = std::string(kChoiceVariable) + "=" + value;
    TINYDDP_CHECK(name == "openblas" || name == "onednn", asked_by, " names no CPU GEMM",
                  "; hint: set it to openblas or onednn, or unset it to let tinyddp choose");
    const CpuGemm gemm = name == "onednn" ? CpuGemm::onednn : CpuGemm::openblas;
    check_available(gemm, asked_by);
    return {gemm, asked_by};
  }
#ifdef TINYDDP_WITH_ONEDNN
  if (detail::onednn_has_avx512()) return {CpuGemm::onednn, "this CPU has AVX-512"};
  return {CpuGemm::openblas, "this CPU has no AVX-512, where OpenBLAS is the faster"};
#else
  return {CpuGemm::openblas, "the only CPU GEMM of this build"};
#endif
}

// The choice, made once on first use; -1 until then.
std::atomic<int> chosen{-1};
std::mutex choice_mutex;
std::string chosen_why;  // guarded by choice_mutex

}  // namespace

const char* cpu_gemm_name(CpuGemm gemm) { return gemm == CpuGemm::onednn ? "oneDNN" : "OpenBLAS"; }

std::vector<CpuGemm> available_cpu_gemms() {
#ifdef TINYDDP_WITH_ONEDNN
  return {CpuGemm::openblas, CpuGemm::onednn};
#else
  return {CpuGemm::openblas};
#endif
}

CpuGemm cpu_gemm() {
  if (int gemm = chosen.load(std::memory_order_acquire); gemm >= 0) return CpuGemm(gemm);
  std::lock_guard<std::mutex> lock(choice_mutex);
  if (chosen.load() < 0) {
    Choice choice = choose_for_this_machine();
    chosen_why = choice.why;
    chosen.store(int(choice.gemm), std::memory_order_release);
  }
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
  chosen_why = "set_cpu_gemm";
  chosen.store(int(gemm), std::memory_order_release);
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
