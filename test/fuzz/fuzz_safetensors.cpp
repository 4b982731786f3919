// libFuzzer entry point for the safetensors reader: any byte string must be either parsed or refused
// with a tinyddp::Error -- never a crash, a hang, an out-of-bounds read or another exception.
//
// Built with clang's libFuzzer (ASan + UBSan) as bin/fuzz_safetensors_libfuzzer wherever clang is
// found (test/fuzz/CMakeLists.txt); `make test` runs it for 5 s with the committed fixtures as seeds.
// Run it longer by hand (new inputs go to the first folder; the fixtures are only read):
//   build/bin/fuzz_safetensors_libfuzzer -max_total_time=600 build/test/fuzz/corpus_safetensors test/fixtures
//
// test/core/test_safetensors.cpp includes this file and feeds it a few thousand seeded mutations of a
// valid file on every `make test`, so the entry point is exercised (and under `make test-asan`,
// sanitised) even where nobody runs the fuzzer.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tinyddp/core/error.h"
#include "tinyddp/core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tinyddp::parse_safetensors(std::string(reinterpret_cast<const char*>(data), size), "fuzz input");
  } catch (const tinyddp::Error&) {
    // Refusing a malformed file with a clear error is the expected outcome for most inputs. Any other
    // exception escapes on purpose: the fuzzer (or the test) reports it as a finding.
  }
  return 0;
}
