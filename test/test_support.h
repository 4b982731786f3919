// Helpers shared by the test suites: fixture paths and tolerance checks of the form atol + rtol*|ref|.
#pragma once

#include <doctest/doctest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tinyddp/core/tensor.h"

namespace tinyddp::testing {

inline std::string fixture(const std::string& name) { return std::string(TINYDDP_TEST_FIXTURES) + "/" + name; }

// The UCI digits: ../shared/data beside the checkout, or data/ inside it (make data); "" when neither.
inline std::string digits_data() {
  for (std::string path :
       {std::string(TINYDDP_SHARED_DATA) + "/digits.csv.gz", std::string(TINYDDP_SOURCE_DIR) + "/data/digits.csv.gz"})
    if (std::filesystem::exists(path)) return path;
  return "";
}

// Checks |got - ref| <= atol + rtol*|ref| element by element, reporting the first offender by index.
inline void check_close(const std::vector<float>& got, const std::vector<float>& ref, double atol, double rtol,
                        const std::string& what) {
  REQUIRE_MESSAGE(got.size() == ref.size(), what << ": " << got.size() << " values, reference has " << ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = atol + rtol * std::fabs(double(ref[i]));
    if (!(std::fabs(double(got[i]) - double(ref[i])) <= tol)) {
      FAIL_CHECK(what << "[" << i << "] = " << got[i] << ", reference " << ref[i] << " (tolerance " << tol << ")");
      return;
    }
  }
}

inline void check_close(const Tensor& got, const Tensor& ref, double atol, double rtol, const std::string& what) {
  REQUIRE_MESSAGE(got.shape() == ref.shape(),
                  what << ": shape " << shape_str(got.shape()) << " vs reference " << shape_str(ref.shape()));
  check_close(got.to_vector<float>(), ref.to_vector<float>(), atol, rtol, what);
}

// Checks that got and ref hold the same floats bit for bit (for two computations that perform the same
// roundings in the same order, so that no tolerance can hide a real difference), reporting the first
// element that differs and how many do.
inline void check_identical(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == ref.size(), what << ": " << got.size() << " values, reference has " << ref.size());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  if (differ != 0)
    FAIL_CHECK(what << ": " << differ << " of " << got.size() << " values differ from the reference, the first at ["
                    << first << "]: " << got[first] << " vs " << ref[first] << " (" << got[first] - ref[first] << ")");
}

// The unit roundoff of float32, u = 2^-24, and gamma(n) = n u / (1 - n u): a sum of n products, added
// in any order (blocked, vectorised, split across threads, with fused multiply-adds or without), lies
// within gamma(n) times the sum of the terms' magnitudes of the exact sum (Higham, Accuracy and
// Stability of Numerical Algorithms, 2nd ed., sections 3.1 and 3.5).
constexpr double kFloatRoundoff = 0x1p-24;
inline double gamma_n(int64_t n) { return double(n) * kFloatRoundoff / (1 - double(n) * kFloatRoundoff); }

// For c = alpha op(a) op(b) + beta c0 computed in float32 by any GEMM, element by element, the bound
// on its distance from the exact value: gamma(k + 2) (|alpha| sum_l |op(a)_il| |op(b)_lj| + |beta c0_ij|)
// (k products, then alpha's product and beta c0's addition). c0 may be empty when beta is 0, or
// hold one value per column (a bias, broadcast down the rows).
inline std::vector<double> gemm_rounding_bound(const Tensor& a, bool ta, const Tensor& b, bool tb, double alpha = 1,
                                               double beta = 0, const std::vector<float>& c0 = {}) {
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1);
  const int64_t n = tb ? b.size(0) : b.size(1);
  REQUIRE((tb ? b.size(1) : b.size(0)) == k);
  const std::vector<float> va = a.to_vector<float>(), vb = b.to_vector<float>();
  auto at = [&](int64_t i, int64_t l) { return double(va[size_t(ta ? l * m + i : i * k + l)]); };
  auto bt = [&](int64_t l, int64_t j) { return double(vb[size_t(tb ? j * k + l : l * n + j)]); };
  std::vector<double> bound(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double magnitude = 0;
      for (int64_t l = 0; l < k; ++l) magnitude += std::fabs(at(i, l) * bt(l, j));
      double c = 0;
      if (c0.size() == size_t(m * n))
        c = c0[size_t(i * n + j)];
      else if (c0.size() == size_t(n))
        c = c0[size_t(j)];
      bound[size_t(i * n + j)] = gamma_n(k + 2) * (std::fabs(alpha) * magnitude + std::fabs(beta * c));
    }
  return bound;
}

// Checks |got - ref| <= bound element by element, reporting the first offender and how many there are.
inline void check_within(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& bound,
                         const std::string& what) {
  REQUIRE_MESSAGE(got.size() == ref.size(), what << ": " << got.size() << " values, reference has " << ref.size());
  REQUIRE(bound.size() == got.size());
  size_t outside = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - double(ref[i])) <= bound[i]) && outside++ == 0)
      FAIL_CHECK(what << "[" << i << "] = " << got[i] << ", reference " << ref[i] << " (bound " << bound[i] << ")");
  CHECK_MESSAGE(outside == 0, what << ": " << outside << " of " << got.size() << " values outside their bound");
}

// A fresh directory under the system's temp folder, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "tinyddp_test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Sets (or, with nullptr, unsets) an environment variable for one scope and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Everything this process writes to stderr (fd 2: log lines, error reports) while it lives; text()
// ends the capture and returns what was written.
class CapturedStderr {
 public:
  CapturedStderr() : file_(std::tmpfile()) {
    REQUIRE(file_ != nullptr);
    std::fflush(stderr);
    saved_ = ::dup(2);
    ::dup2(::fileno(file_), 2);
  }
  ~CapturedStderr() {
    restore();
    std::fclose(file_);
  }
  CapturedStderr(const CapturedStderr&) = delete;
  CapturedStderr& operator=(const CapturedStderr&) = delete;
  std::string text() {
    restore();
    std::rewind(file_);
    std::string out;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file_)) > 0;) out.append(buffer, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_ = -1;
};

// The CPUs a list as /proc/<pid>/status's Cpus_allowed_list writes it ("0-2,5") names.
inline std::set<int> cpu_list(const std::string& text) {
  std::set<int> cpus;
  std::stringstream in(text);
  std::string range;
  while (std::getline(in, range, ',')) {
    const size_t dash = range.find('-');
    const int first = std::stoi(range.substr(0, dash)),
              last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
    for (int c = first; c <= last; ++c) cpus.insert(c);
  }
  return cpus;
}

}  // namespace tinyddp::testing
