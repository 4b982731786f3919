// Hash: FNV-1a, 64 bits. A short stable digest of a string that every process of a job computes
// alike (no seed, no per-process randomness, unlike std::hash): the transports put it in
// handshakes and shared-memory names so that a connection or segment of another group or job is
// recognised and refused. Not a cryptographic hash.
#pragma once

#include <cstdint>
#include <string_view>

namespace tinyddp {

constexpr uint64_t fnv1a(std::string_view text) {
  uint64_t h = 14695981039346656037ull;                         // the FNV-1a offset basis
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;  // the FNV prime
  return h;
}

}  // namespace tinyddp
