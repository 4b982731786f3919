#include "tinyddp/nn/precision/precision.h"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>
#include <utility>

#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"
#include "tinyddp/kernels/ops.h"

namespace tinyddp::nn {

namespace {
thread_local Precision current = Precision::fp32;
}  // namespace

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    default: return "fp32";
  }
}

Precision parse_precision(std::string_view text, std::string_view where) {
  std::string word(text);
  std::transform(word.begin(), word.end(), word.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  // PyTorch's spellings too (torch.bfloat16, torch.float16 / torch.half, Lightning's "bf16-mixed").
  static const std::pair<const char*, Precision> words[] = {
      {"fp32", Precision::fp32}, {"float32", Precision::fp32},  {"f32", Precision::fp32},
      {"bf16", Precision::bf16}, {"bfloat16", Precision::bf16}, {"bf16-mixed", Precision::bf16},
      {"fp16", Precision::fp16}, {"float16", Precision::fp16},  {"half", Precision::fp16},
      {"f16", Precision::fp16},  {"16-mixed", Precision::fp16}};
  for (const auto& [name, precision] : words)
    if (word == name) return precision;
  TINYDDP_FAIL(where, " '", text, "' is not a precision",
               hint("use fp32 (every product in f32), bf16 (bf16 products, ",
                    "f32 sums and master weights) or fp16 (the same in IEEE half, with a loss scaler)"));
}

DType operand_dtype(Precision precision) {
  switch (precision) {
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
    default: return DType::f32;
  }
}

Precision current_precision() { return current; }

PrecisionScope::PrecisionScope(Precision precision) : previous_(current) { current = precision; }
PrecisionScope::~PrecisionScope() { current = previous_; }

std::string precision_units(Precision precision, Device device) {
  if (!is_mixed(precision)) return "fp32: every product in f32";
  return std::string(precision_name(precision)) +
         " mixed: " + kernels::mixed_gemm_units(operand_dtype(precision), device);
}

void announce_precision(Precision precision, Device device) {
  static std::mutex mutex;
  static std::set<std::pair<int, std::string>> told;
  std::lock_guard<std::mutex> lock(mutex);
  if (!told.insert({int(precision), device.str()}).second) return;
  log_line(LogLevel::info, "precision", precision_units(precision, device));
}

}  // namespace tinyddp::nn
