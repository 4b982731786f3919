// The CPU GEMM library tinyddp chooses, as gemm_bench --choice reports it, under every cap of the two
// libraries this CPU can run (kernels/cpu_gemm.h has the rule). The caps are the libraries' own
// variables, read when they load, so each case is a fresh process. The rule's inputs are what each
// library says it runs -- OpenBLAS's kernel family, oneDNN's ISA -- and the expected answer follows
// from the caps alone: a capped library runs what the cap names.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "test/bench/perf_programs.h"
#include "test/test_skip.h"

using namespace tinyddp::testing;

namespace {

struct Case {
  const char* openblas_core;  // OPENBLAS_CORETYPE
  const char* onednn_isa;     // ONEDNN_MAX_CPU_ISA
  const char* asked;          // TINYDDP_CPU_GEMM ("" for the machine's choice)
  const char* expected;       // the library named first in the report
  bool needs_avx512;          // the caps need a CPU with AVX-512 (else AVX2 and FMA)
  const char* why;
};

const Case kCases[] = {
    {"Prescott", "AVX2", "", "oneDNN", false, "OpenBLAS on its generic kernel loses to oneDNN's AVX2"},
    {"Haswell", "AVX2", "", "OpenBLAS", false, "both on AVX2: OpenBLAS"},
    {"Haswell", "AVX512_CORE", "", "oneDNN", true, "oneDNN on AVX-512 beats OpenBLAS on AVX2"},
    {"SkylakeX", "AVX512_CORE", "", "oneDNN", true, "both on AVX-512: oneDNN"},
    {"Prescott", "AVX2", "openblas", "OpenBLAS", false, "asked for by name, whatever the rule says"},
    {"Haswell", "AVX2", "onednn", "oneDNN", false, "asked for by name, whatever the rule says"},
};

bool cpu_runs(const Case& c) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
  return !c.needs_avx512 || (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"));
}

ChildOutcome choice_under(const Case& c, const std::vector<std::string>& more_env = {}) {
  std::vector<std::string> env = {std::string("OPENBLAS_CORETYPE=") + c.openblas_core,
                                  std::string("ONEDNN_MAX_CPU_ISA=") + c.onednn_isa,
                                  std::string("TINYDDP_CPU_GEMM=") + c.asked};
  env.insert(env.end(), more_env.begin(), more_env.end());
  return finish_child(spawn_program({bin_path("gemm_bench"), "--choice"}, env), std::chrono::seconds(60));
}

}  // namespace

TEST_CASE("the CPU GEMM follows what each library reports it runs, under every cap this CPU can run") {
  if (!built("gemm_bench") || !__builtin_cpu_supports("avx2")) {
    TINYDDP_SKIP("needs bench/gemm_bench built and a CPU with AVX2");
  }
  int ran = 0;
  for (const Case& c : kCases) {
    CAPTURE(c.openblas_core);
    CAPTURE(c.onednn_isa);
    CAPTURE(c.asked);
    CAPTURE(c.why);
    if (!cpu_runs(c)) continue;
    ChildOutcome outcome = choice_under(c);
    REQUIRE_MESSAGE(outcome.ok(), outcome.describe());
    if (outcome.report.find("this build has no oneDNN") != std::string::npos) {
      TINYDDP_SKIP("this build has no oneDNN");
    }
    const std::string prefix = "tinyddp's choice here: ";
    const size_t at = outcome.report.find(prefix);
    REQUIRE_MESSAGE(at != std::string::npos, outcome.report);
    const size_t begin = at + prefix.size();
    const std::string line = outcome.report.substr(begin, outcome.report.find('\n', begin) - begin);
    CHECK_MESSAGE(line.rfind(c.expected, 0) == 0, line);
    // The reason names what the capped libraries run, so a user sees why.
    if (*c.asked == '\0')
      CHECK_MESSAGE(line.find(std::string("OpenBLAS runs its ") + c.openblas_core) != std::string::npos, line);
    ++ran;
  }
  CHECK(ran >= 4);  // every AVX2 host runs the four AVX2 cases
}

TEST_CASE("TINYDDP_DEBUG=INFO logs the CPU GEMM choice and its reason") {
  if (!built("gemm_bench") || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    TINYDDP_SKIP("needs bench/gemm_bench built and a CPU with AVX2");
  }
  ChildOutcome outcome = choice_under(kCases[1], {"TINYDDP_DEBUG=INFO"});
  REQUIRE_MESSAGE(outcome.ok(), outcome.describe());
  CHECK_MESSAGE(outcome.report.find("CPU GEMM: OpenBLAS (") != std::string::npos, outcome.report);
}
