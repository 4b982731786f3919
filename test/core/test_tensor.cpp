#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/philox.h"
#include "tinyddp/core/random.h"
#include "tinyddp/core/tensor.h"
#include "test/test_skip.h"

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
  Block pi = philox::philox4x32_10(Block{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                                   0x299f31d0u);
  CHECK(pi.v[0] == 0xd16cfe09u);
  CHECK(pi.v[1] == 0x94fdccebu);
  CHECK(pi.v[2] == 0x5001e420u);
  CHECK(pi.v[3] == 0x24126ea1u);
}

TEST_CASE("no CUDA device means a clear error, not a crash") {
  if (cuda_device_count() > 0) {
    TINYDDP_SKIP("this machine has a CUDA device");
  }
  CHECK_THROWS_WITH_AS(Tensor::empty({2}, DType::f32, Device::cuda(0)), doctest::Contains("cuda:0 was requested"),
                       Error);
}

TEST_CASE("to(dtype) converts as PyTorch's .to(dtype): toward zero into integers, modulo 2^bits between them") {
  Tensor f = Tensor::from_vector<float>({1.5f, -1.5f, 2.7f, -0.2f, 255.9f}, {5});
  CHECK(f.to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{1, -1, 2, 0, 255});
  Tensor positive = Tensor::from_vector<float>({1.5f, 2.7f, 255.9f}, {3});
  CHECK(positive.to(DType::u8).to_vector<uint8_t>() == std::vector<uint8_t>{1, 2, 255});
  // torch.tensor([300, -1, 256]).to(torch.uint8) == [44, 255, 0]
  Tensor i = Tensor::from_vector<int64_t>({300, -1, 256}, {3});
  CHECK(i.to(DType::u8).to_vector<uint8_t>() == std::vector<uint8_t>{44, 255, 0});
  // Into a floating type: the nearest value, as float(x) rounds it.
  Tensor d = Tensor::from_vector<double>({0.1, 1e300, -3.0}, {3});
  std::vector<float> as_float = d.to(DType::f32).to_vector<float>();
  CHECK(as_float[0] == 0.1f);
  CHECK(std::isinf(as_float[1]));
  CHECK(as_float[2] == -3.f);
  CHECK(Tensor::from_vector<int32_t>({16777217}, {1}).to(DType::f32).item<float>() == 16777216.f);
  // The shape goes along; the same dtype hands back the same memory, as to(device) does.
  Tensor m = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(m.to(DType::f64).shape() == Shape{2, 3});
  CHECK(m.to(DType::f64).dtype() == DType::f64);
  CHECK(m.to(DType::f32).shares_storage_with(m));
  CHECK(Tensor::empty({0, 3}).to(DType::i64).shape() == Shape{0, 3});
}

TEST_CASE("to(dtype) refuses a value the integer type cannot hold, naming the element") {
  Tensor nan = Tensor::from_vector<float>({1.f, std::nanf(""), 2.f}, {3});
  CHECK_THROWS_WITH_AS(nan.to(DType::i32),
                       doctest::Contains("element 1 of f32[3] on cpu is nan, which i32 cannot hold"), Error);
  CHECK_THROWS_WITH_AS(Tensor::from_vector<float>({3e9f}, {1}).to(DType::i32), doctest::Contains("cannot hold"), Error);
  CHECK_THROWS_WITH_AS(Tensor::from_vector<double>({-1.0}, {1}).to(DType::u8), doctest::Contains("u8 cannot hold"),
                       Error);
  // The edges themselves fit: -2^31 and just under 2^31 into i32, -0.9 (which becomes 0) into u8.
  Tensor edges = Tensor::from_vector<double>({-2147483648.0, 2147483647.9}, {2});
  CHECK(edges.to(DType::i32).to_vector<int32_t>() == std::vector<int32_t>{-2147483647 - 1, 2147483647});
  CHECK(Tensor::from_vector<double>({-0.9}, {1}).to(DType::u8).item<uint8_t>() == 0);
  CHECK_THROWS_WITH_AS(Tensor().to(DType::f32), doctest::Contains("undefined tensor"), Error);
}

TEST_CASE("to(dtype) of a CUDA tensor stays on its device") {
  if (cuda_device_count() == 0) {
    TINYDDP_SKIP("no CUDA device (the conversion itself runs on the CPU and is tested above)");
  }
  Tensor g = Tensor::from_vector<float>({1.5f, -2.5f}, {2}).to(Device::cuda(0));
  Tensor converted = g.to(DType::i64);
  CHECK(converted.device() == Device::cuda(0));
  CHECK(converted.to_vector<int64_t>() == std::vector<int64_t>{1, -2});
}
