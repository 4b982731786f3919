#include "tinyddp/core/random.h"

#include <numeric>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/philox.h"

namespace tinyddp {

float Generator::next_float() { return philox::to_unit_float(philox::bits(seed_, advance(1), 0)); }

uint64_t Generator::next_below(uint64_t n) {
  TINYDDP_CHECK(n > 0, "next_below(0): the range is empty");
  // 64 random bits, reduced by rejection so every value in [0, n) is equally likely.
  uint64_t start = advance(2);
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (uint64_t attempt = 0;; ++attempt) {
    uint64_t x = (uint64_t(philox::bits(seed_, start, 4 * attempt)) << 32) |
                 philox::bits(seed_, start, 4 * attempt + 1);
    if (x < limit) return x % n;
    start = advance(2);
  }
}

void fill_uniform(Tensor& t, float lo, float hi, Generator& gen) {
  TINYDDP_CHECK(t.dtype() == DType::f32, "fill_uniform fills f32 tensors, got ", t.describe());
  uint64_t offset = gen.advance(uint64_t(t.numel()));
  if (t.device().is_cuda()) {
    cuda_api().fill_uniform(t.data<float>(), t.numel(), gen.seed(), offset, lo, hi, t.device().index);
    return;
  }
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = philox::uniform(gen.seed(), offset, uint64_t(i), lo, hi);
}

std::vector<int64_t> random_permutation(int64_t n, Generator& gen) {
  std::vector<int64_t> order(size_t(n < 0 ? 0 : n));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[gen.next_below(uint64_t(i) + 1)]);
  return order;
}

}  // namespace tinyddp
