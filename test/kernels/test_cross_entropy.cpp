// Fused softmax + cross-entropy and count_correct against F.cross_entropy, its autograd gradient and
// (argmax == label).sum(), on logits that overflow a naive softmax (+-50, +-1000).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "tinyddp/kernels/ops.h"
#include "kernel_fixtures.h"

using namespace tinyddp;
using namespace tinyddp::testing;

TEST_CASE("softmax_cross_entropy: loss and gradient match PyTorch, large logits included") {
  SafetensorsFile f = kernel_fixture("cross_entropy");
  for (const char* which : {"small", "wide"}) {
    CAPTURE(which);
    const std::string c = which;
    const Tensor& logits = f.get(c + ".logits");
    Tensor dlogits = Tensor::empty(logits.shape());
    kernels::fill(dlogits, std::numeric_limits<float>::quiet_NaN());  // every element must be written
    float loss = kernels::softmax_cross_entropy(logits, f.get(c + ".labels"), &dlogits);
    CHECK(std::isfinite(loss));
    check_close({loss}, {f.get(c + ".loss").item<float>()}, 1e-5, 1e-5, c + " loss");
    check_close(dlogits, f.get(c + ".dlogits"), 1e-7, 1e-4, c + " dlogits");

    // Without a gradient buffer: the same loss.
    float loss_only = kernels::softmax_cross_entropy(logits, f.get(c + ".labels"), nullptr);
    CHECK(loss_only == loss);
  }
}

TEST_CASE("softmax_cross_entropy: one hopeless row costs exactly its logit gap") {
  // Row [-50, 50] with label 0: loss = logsumexp - x[0] = 50 + log(1 + e^-100) + 50 = 100 in float.
  Tensor logits = Tensor::from_vector<float>({-50.f, 50.f}, {1, 2});
  Tensor labels = Tensor::from_vector<int64_t>({0}, {1});
  Tensor d = Tensor::empty({1, 2});
  CHECK(kernels::softmax_cross_entropy(logits, labels, &d) == doctest::Approx(100.0).epsilon(1e-6));
  check_close(d.to_vector<float>(), {-1.f, 1.f}, 1e-7, 0, "softmax - onehot");
}

TEST_CASE("a label outside [0, C) is an error naming the row and the label") {
  Tensor logits = Tensor::zeros({4, 3});
  Tensor labels = Tensor::from_vector<int64_t>({0, 2, 3, -1}, {4});
  Tensor d = Tensor::zeros({4, 3});
  CHECK_THROWS_WITH_AS(kernels::softmax_cross_entropy(logits, labels, &d),
                       doctest::Contains("labels[2] = 3 is not a class index in [0, 3)"), Error);
  // Nothing was written: the labels are checked before the first row is.
  check_close(d.to_vector<float>(), std::vector<float>(12, 0.f), 0, 0, "dlogits after a refused batch");
  Tensor negative = Tensor::from_vector<int64_t>({0, -1, 1, 1}, {4});
  CHECK_THROWS_WITH_AS(kernels::softmax_cross_entropy(logits, negative, nullptr), doctest::Contains("labels[1] = -1"),
                       Error);
  CHECK_THROWS_WITH_AS(kernels::count_correct(logits, labels), doctest::Contains("count_correct: labels[2] = 3"),
                       Error);
}

TEST_CASE("softmax_cross_entropy checks its arguments") {
  Tensor logits = Tensor::zeros({4, 3});
  Tensor labels_f32 = Tensor::zeros({4});
  CHECK_THROWS_WITH_AS(kernels::softmax_cross_entropy(logits, labels_f32, nullptr),
                       doctest::Contains("argument `labels` is f32[4] on cpu but must be i64"), Error);
  Tensor short_labels = Tensor::zeros({3}, DType::i64);
  CHECK_THROWS_WITH_AS(kernels::softmax_cross_entropy(logits, short_labels, nullptr),
                       doctest::Contains("one label per row"), Error);
  Tensor labels = Tensor::zeros({4}, DType::i64), d = Tensor::zeros({3, 4});
  CHECK_THROWS_WITH_AS(kernels::softmax_cross_entropy(logits, labels, &d), doctest::Contains("argument `dlogits`"),
                       Error);
  Tensor empty_logits = Tensor::zeros({0, 3}), no_labels = Tensor::zeros({0}, DType::i64);
  CHECK_THROWS_WITH_AS(kernels::softmax_cross_entropy(empty_logits, no_labels, nullptr),
                       doctest::Contains("has no rows"), Error);
}

TEST_CASE("count_correct matches (argmax == label).sum(), ties going to the first maximum") {
  SafetensorsFile f = kernel_fixture("cross_entropy");
  for (const char* which : {"small", "wide"}) {
    CAPTURE(which);
    const std::string c = which;
    CHECK(kernels::count_correct(f.get(c + ".logits"), f.get(c + ".labels")) == f.get(c + ".correct").item<int64_t>());
  }
  // A row of equal logits: argmax is 0, so label 0 is right and label 1 is not.
  Tensor tie = Tensor::from_vector<float>({1.f, 1.f, 1.f, 1.f, 1.f, 1.f}, {2, 3});
  CHECK(kernels::count_correct(tie, Tensor::from_vector<int64_t>({0, 1}, {2})) == 1);
  CHECK(kernels::count_correct(Tensor::zeros({0, 3}), Tensor::zeros({0}, DType::i64)) == 0);
}

TEST_CASE("softmax_cross_entropy may write the gradient over the logits") {
  SafetensorsFile f = kernel_fixture("cross_entropy");
  Tensor t = f.get("small.logits").clone();
  float loss = kernels::softmax_cross_entropy(t, f.get("small.labels"), &t);
  check_close({loss}, {f.get("small.loss").item<float>()}, 1e-5, 1e-5, "loss, in place");
  check_close(t, f.get("small.dlogits"), 1e-7, 1e-4, "dlogits over logits");
}
