#include <doctest/doctest.h>

#include "core/cuda_runtime.h"
#include "core/philox.h"
#include "core/random.h"
#include "core/tensor.h"

using namespace tinyddp;

TEST_CASE("a view shares memory with its base") {
  Tensor base = Tensor::zeros({4, 3});
  Tensor row2 = base.view(6, {3});
  row2.data<float>()[1] = 5.f;
  CHECK(base.item<float>(7) == 5.f);
  CHECK(row2.shares_storage_with(base));
  CHECK_THROWS_WITH_AS(base.view(10, {3}), doctest::Contains("does not fit"), Error);
}

TEST_CASE("reading with the wrong C++ type is an error") {
  Tensor t = Tensor::zeros({2}, DType::i64);
  CHECK_THROWS_WITH_AS(t.data<float>(), doctest::Contains("accessed as f32"), Error);
}

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  using philox::Block;
  Block zero = philox::philox4x32_10(Block{{0, 0, 0, 0}}, 0, 0);
  CHECK(zero.v[0] == 0x6627e8d5u);
  CHECK(zero.v[1] == 0xe169c58du);
  CHECK(zero.v[2] == 0xbc57ac4cu);
  CHECK(zero.v[3] == 0x9b00dbd8u);
  Block ones = philox::philox4x32_10(Block{{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  CHECK(ones.v[0] == 0x408f276du);
  CHECK(ones.v[1] == 0x41c83b0eu);
  CHECK(ones.v[2] == 0xa20bc7c6u);
  CHECK(ones.v[3] == 0x6d5451fdu);
  Block pi = philox::philox4x32_10(Block{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(pi.v[0] == 0xd16cfe09u);
  CHECK(pi.v[1] == 0x94fdccebu);
  CHECK(pi.v[2] == 0x5001e420u);
  CHECK(pi.v[3] == 0x24126ea1u);
}

TEST_CASE("no CUDA device means a clear error, not a crash") {
  if (cuda_device_count() > 0) {
    MESSAGE("skipped: this machine has a CUDA device");
    return;
  }
  CHECK_THROWS_WITH_AS(Tensor::empty({2}, DType::f32, Device::cuda(0)), doctest::Contains("cuda:0 was requested"), Error);
}
