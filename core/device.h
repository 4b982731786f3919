// Device: where a tensor's memory lives, "cpu" or "cuda:N".
#pragma once

#include <string>

namespace tinyddp {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;  // the CUDA ordinal; always 0 for the CPU

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  // Parses "cpu", "cuda" (= cuda:0) or "cuda:N". Throws on anything else. Does not check that the
  // device exists: that happens when memory is first allocated on it (see require_cuda_device).
  static Device parse(const std::string& text);

  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  std::string str() const;

  friend bool operator==(const Device& a, const Device& b) { return a.kind == b.kind && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

}  // namespace tinyddp
