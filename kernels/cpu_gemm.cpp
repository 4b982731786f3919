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

const char* vector_class_name(VectorClass vectors) {
  switch (vectors) {
    case VectorClass::avx512: return "AVX-512";
    case VectorClass::avx2: return "AVX2";
    default: return "narrower than AVX2";
  }
}

}  // namespace detail

namespace {

constexpr const char* kChoiceVariable = "TINYDDP_CPU_GEMM";

// Products of fewer multiply-adds than this stay on OpenBLAS when oneDNN is the machine's choice (not
// when it is asked for): 64 x 64 x 64 take about 5 us at 100 GFLOP/s, where what a call costs, not
// the kernel, decides.
constexpr int64_t kOneDnnMinimumWork = int64_t(64) * 64 * 64;

// The state of the choice. `undecided` until first needed; `onednn_candidate` while only loading
// oneDNN can tell (small products run on OpenBLAS meanwhile); then one of the two libraries.
enum class State { undecided = -1, openblas = int(CpuGemm::openblas), onednn = int(CpuGemm::onednn), onednn_candidate };

struct Choice {
  State state;
  std::string why;
  int64_t onednn_minimum_work = 0;
};

std::atomic<int> state{int(State::undecided)};
std::atomic<int64_t> onednn_minimum_work{0};
std::mutex choice_mutex;
std::string chosen_why;  // guarded by choice_mutex

void check_available(CpuGemm gemm, const std::string& asked_by) {
  if (gemm == CpuGemm::openblas) return;
#ifdef TINYDDP_WITH_ONEDNN
  std::string why_not;
  TINYDDP_CHECK(detail::onednn_loadable(&why_not), asked_by, " asks for oneDNN, which this machine cannot load (",
                why_not, ")", hint("apt-get install libdnnl2, or use OpenBLAS"));
#else
  TINYDDP_FAIL(asked_by, " asks for oneDNN, which this build does not have (it has OpenBLAS only)",
               hint("install libdnnl-dev (make deps) and configure with -DTINYDDP_ONEDNN=ON"));
#endif
}

std::string openblas_runs() { return "OpenBLAS runs its " + detail::openblas_core_name() + " kernels"; }

// The part of the choice that loads nothing: the user's, or OpenBLAS where oneDNN cannot beat it.
Choice first_choice() {
  if (std::optional<CpuGemm> asked = env::choice<CpuGemm>(kChoiceVariable, {{"openblas", CpuGemm::openblas},
                                                                            {"onednn", CpuGemm::onednn}})) {
    const std::string asked_by = std::string(kChoiceVariable) + "=" + *env::text(kChoiceVariable);
    check_available(*asked, asked_by);
    return {State(*asked), asked_by};
  }
#ifdef TINYDDP_WITH_ONEDNN
  // Without AVX-512 oneDNN runs AVX2 at best, which wins only where OpenBLAS runs narrower.
  if (!detail::cpu_has_avx512_core() && detail::openblas_vector_class() >= detail::VectorClass::avx2)
    return {State::openblas, openblas_runs() + " and this CPU has no AVX-512, where OpenBLAS is the faster"};
  return {State::onednn_candidate, "", kOneDnnMinimumWork};
#else
  return {State::openblas, "this build has no oneDNN"};
#endif
}

// The rest, which loads oneDNN to ask which kernels it runs.
Choice final_choice() {
#ifdef TINYDDP_WITH_ONEDNN
  std::string why_not;
  if (!detail::onednn_loadable(&why_not)) {
    log_line(LogLevel::warn, "gemm", "OpenBLAS instead of oneDNN: " + why_not);
    return {State::openblas, "oneDNN cannot be loaded: " + why_not};
  }
  const detail::VectorClass onednn = detail::onednn_vector_class(), openblas = detail::openblas_vector_class();
  const std::string both = cpu_gemm_kernels() + " (" + detail::vector_class_name(openblas) + ")";
  if (onednn == detail::VectorClass::avx512 || onednn > openblas)
    return {State::onednn, both + "; products under 64x64x64 on OpenBLAS", kOneDnnMinimumWork};
  return {State::openblas, both + ": at the same width OpenBLAS is the faster"};
#else
  return first_choice();
#endif
}

void set_choice(const Choice& choice) {  // with choice_mutex held
  chosen_why = choice.why;
  onednn_minimum_work.store(choice.onednn_minimum_work);
  state.store(int(choice.state), std::memory_order_release);
  // Said under TINYDDP_DEBUG=INFO, beside the other facts of a run's setup; quiet otherwise.
  if (choice.state != State::onednn_candidate && debug_level() != DebugLevel::off) {
    const CpuGemm gemm = CpuGemm(choice.state);
    log_line(LogLevel::info, "gemm", std::string("CPU GEMM: ") + cpu_gemm_name(gemm) + " (" + choice.why + ")");
  }
}

// The choice, taken as far as `load_onednn` allows: without it, a candidate stays a candidate.
State resolve(bool load_onednn) {
  State now = State(state.load(std::memory_order_acquire));
  if (now == State::openblas || now == State::onednn || (now == State::onednn_candidate && !load_onednn)) return now;
  std::lock_guard<std::mutex> lock(choice_mutex);
  if (State(state.load()) == State::undecided) set_choice(first_choice());
  if (State(state.load()) == State::onednn_candidate && load_onednn) set_choice(final_choice());
  return State(state.load());
}

}  // namespace

namespace detail {

bool use_onednn_for(int64_t m, int64_t n, int64_t k) {
  const int64_t work = m * n * k;
  State now = resolve(false);
  if (now == State::openblas) return false;
  if (work < onednn_minimum_work.load(std::memory_order_relaxed)) return false;
  if (now == State::onednn_candidate) now = resolve(true);
  return now == State::onednn;
}

}  // namespace detail

const char* cpu_gemm_name(CpuGemm gemm) { return gemm == CpuGemm::onednn ? "oneDNN" : "OpenBLAS"; }

std::vector<CpuGemm> available_cpu_gemms() {
#ifdef TINYDDP_WITH_ONEDNN
  if (detail::onednn_loadable()) return {CpuGemm::openblas, CpuGemm::onednn};
#endif
  return {CpuGemm::openblas};
}

CpuGemm cpu_gemm() { return CpuGemm(resolve(true)); }

std::string cpu_gemm_kernels() {
#ifdef TINYDDP_WITH_ONEDNN
  std::string why_not;
  if (detail::onednn_loadable(&why_not))
    return "oneDNN runs " + detail::onednn_isa_name() + " kernels here, " + openblas_runs();
  return openblas_runs() + "; oneDNN cannot be loaded: " + why_not;
#else
  return openblas_runs() + "; this build has no oneDNN";
#endif
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
  set_choice({State(gemm), "set_cpu_gemm"});
}

void set_cpu_threads(int threads) {
  TINYDDP_CHECK(threads >= 1, "set_cpu_threads(", threads, "): at least one thread is needed",
                hint("pass 1 to run "
                     "BLAS on the calling thread only"));
  // With several DDP processes on one host, each library spawning one thread per core would
  // oversubscribe the cores many times over; one thread per process is what torch.distributed users
  // set too. Both libraries are told, so a later set_cpu_gemm keeps the count.
  detail::openblas_set_threads(threads);
#ifdef TINYDDP_WITH_ONEDNN
  detail::onednn_set_threads(threads);
#endif
}

}  // namespace tinyddp::kernels
