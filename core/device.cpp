#include "core/device.h"

#include <cctype>

#include "core/error.h"

namespace tinyddp {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda" || text == "gpu") return cuda(0);
  for (const std::string prefix : {"cuda:", "gpu:"}) {
    if (text.rfind(prefix, 0) != 0) continue;
    std::string digits = text.substr(prefix.size());
    bool numeric = !digits.empty() && digits.size() < 6;
    for (char c : digits) numeric = numeric && std::isdigit(static_cast<unsigned char>(c));
    TINYDDP_CHECK(numeric, "bad device \"", text, "\": the part after \"", prefix, "\" must be a device number; hint: write cuda:0");
    return cuda(std::stoi(digits));
  }
  TINYDDP_FAIL("unknown device \"", text, "\"; hint: use cpu, cuda or cuda:N");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace tinyddp
