// Helpers shared by the test suites: fixture paths and tolerance checks of the form atol + rtol*|ref|.
#pragma once

#include <doctest/doctest.h>

#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tinyddp/core/tensor.h"

namespace tinyddp::testing {

inline std::string fixture(const std::string& name) { return std::string(TINYDDP_TEST_FIXTURES) + "/" + name; }

// The UCI digits: ../shared/data beside the checkout, or data/ inside it (make data); "" when neither.
inline std::string digits_data() {
  for (std::string path : {std::string(TINYDDP_SHARED_DATA) + "/digits.csv.gz", std::string(TINYDDP_SOURCE_DIR) + "/data/digits.csv.gz"})
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
  REQUIRE_MESSAGE(got.shape() == ref.shape(), what << ": shape " << shape_str(got.shape()) << " vs reference "
                                                   << shape_str(ref.shape()));
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

}  // namespace tinyddp::testing
