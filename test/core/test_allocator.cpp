// Where CPU tensors' bytes lie: 64-byte aligned, and from 2 MiB on whole huge pages the kernel is
// asked to back as such (core/allocator.h).
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "tinyddp/core/tensor.h"
#include "test/test_support.h"

using namespace tinyddp;

namespace {

constexpr uintptr_t kHugePage = uintptr_t(2) << 20;

// The kernel's transparent huge page mode, as /sys shows it ("always", "madvise", "never"), or "".
std::string huge_page_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string all;
  std::getline(in, all);
  const size_t open = all.find('['), close = all.find(']');
  return open == std::string::npos || close == std::string::npos ? "" : all.substr(open + 1, close - open - 1);
}

// The "THPeligible:" value of the mapping that holds `address` in /proc/self/smaps, or -1 when the
// kernel does not say.
int huge_page_eligible(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {  // a mapping's first line: "begin-end perms ..."
      inside = begin <= at && at < end;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

}  // namespace

TEST_CASE("a CPU tensor of 2 MiB or more starts on a huge page and the kernel may back it with huge pages") {
  Tensor large = Tensor::zeros({3 << 18});  // 3 MiB of float32
  CHECK(reinterpret_cast<uintptr_t>(large.raw_data()) % kHugePage == 0);

  Tensor small = Tensor::zeros({1 << 18});  // 1 MiB: ordinary pages, a cache line's alignment
  CHECK(reinterpret_cast<uintptr_t>(small.raw_data()) % 64 == 0);

  const std::string mode = huge_page_mode();
  const int eligible = huge_page_eligible(large.raw_data());
  if (eligible < 0 || mode.empty()) {
    MESSAGE("this kernel does not say whether a mapping may take huge pages; checked the alignment only");
    return;
  }
  // "madvise" takes the allocator's advice; "always" needs none; "never" refuses both.
  CHECK(eligible == (mode == "never" ? 0 : 1));
}
