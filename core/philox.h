// Philox4x32-10: a counter-based random number generator (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC 2011).
//
// Why counter-based: the n-th random number is a pure function of (key, n). There is no sequential
// state to carry, so a CPU loop and a CUDA kernel with one thread per element produce the very same
// numbers for one seed, and so the same initial weights on every device.
#pragma once

#include <cstdint>

#include "tinyddp/core/hd.h"

namespace tinyddp::philox {

struct Block {
  uint32_t v[4];
};

TINYDDP_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t product = uint64_t(a) * uint64_t(b);
  hi = uint32_t(product >> 32);
  lo = uint32_t(product);
}

// Ten rounds of the Philox S-box over a 128-bit counter with a 64-bit key.
TINYDDP_HD Block philox4x32_10(Block counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule (golden ratio, sqrt(3)-1)
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, counter.v[0], hi0, lo0);
    mulhilo(kMul1, counter.v[2], hi1, lo1);
    counter = Block{{hi1 ^ counter.v[1] ^ key0, lo1, hi0 ^ counter.v[3] ^ key1, lo0}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// The 32 random bits for element `index` of the stream (seed, offset): four elements share one block.
TINYDDP_HD uint32_t bits(uint64_t seed, uint64_t offset, uint64_t index) {
  uint64_t block = offset + index / 4;
  Block counter{{uint32_t(block), uint32_t(block >> 32), 0u, 0u}};
  return philox4x32_10(counter, uint32_t(seed), uint32_t(seed >> 32)).v[index % 4];
}

// A float in [0, 1) from the top 24 bits (all a float's mantissa can hold exactly).
TINYDDP_HD float to_unit_float(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }

TINYDDP_HD float uniform(uint64_t seed, uint64_t offset, uint64_t index, float lo, float hi) {
  return lo + (hi - lo) * to_unit_float(bits(seed, offset, index));
}

}  // namespace tinyddp::philox
