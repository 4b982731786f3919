// The library's version, as the build configured it (CMakeLists.txt's project(tinyddp VERSION ...)),
// and the --help / --version answer of a program that takes no flags.
#pragma once

#include <optional>

namespace tinyddp {

// "0.1.0"
const char* version();

// For a program that takes no flags (examples/sine_fit): --help prints `about`, --version prints
// "<program> (tinyddp 0.1.0)", and both return 0; anything else is named as unknown on stderr and
// returns 2, the usage-error code of every tinyddp program. Nothing given: returns nothing, go on.
std::optional<int> answer_without_flags(int argc, char** argv, const char* about);

}  // namespace tinyddp
