// Data: TensorDataset and the default batching, samplers, the CSV reader (every bad-input case and the
// real digits file), and the DataLoader's order, batching and background thread.
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/core/random.h"
#include "tinyddp/nn/data/csv.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/data/dataset.h"
#include "tinyddp/nn/data/sampler.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::nn;

namespace {

// Runs `body` on its own thread and waits at most `seconds` for it: a DataLoader that deadlocks fails
// the suite at once (with a message) instead of hanging it. Exceptions and failed REQUIREs come back.
template <typename Body>
void within_seconds(int seconds, Body&& body) {
  auto done = std::async(std::launch::async, std::forward<Body>(body));
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "test_data: a DataLoader test did not finish within %d s (deadlock?)\n", seconds);
    std::fflush(stderr);
    std::_Exit(3);  // a stuck thread cannot be joined; leave with a failure status
  }
  done.get();
}

using tinyddp::testing::TempDir;

// Sample i has inputs [i, i + 0.5] and target i, so a batch shows exactly which samples it holds.
std::shared_ptr<TensorDataset> indexed_dataset(int64_t n) {
  std::vector<float> features;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < n; ++i) {
    features.push_back(float(i));
    features.push_back(float(i) + 0.5f);
    targets.push_back(i);
  }
  return std::make_shared<TensorDataset>(Tensor::from_vector(features, {n, 2}), Tensor::from_vector(targets));
}

// A dataset built sample by sample (the default get_batch), which records how it is used: how many
// batches were built, on which thread, and it can throw at one index or work slowly.
class ProbeDataset : public Dataset {
 public:
  explicit ProbeDataset(int64_t n, int64_t fail_at = -1, int delay_ms = 0)
      : n_(n), fail_at_(fail_at), delay_ms_(delay_ms) {}
  int64_t size() const override { return n_; }
  Batch get(int64_t i) const override {
    TINYDDP_CHECK(i != fail_at_, "ProbeDataset: sample ", i, " is broken", hint("this is the test's planted fault"));
    return {Tensor::from_vector<float>({float(i), float(i) * 2, float(i) * 3}),
            Tensor::from_vector<int64_t>({i % 3}, {})};
  }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    if (std::this_thread::get_id() != creator_) built_off_creator_thread = true;
    if (delay_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    ++batches_built;
    return Dataset::get_batch(indices);
  }

  mutable std::atomic<int> batches_built{0};
  mutable std::atomic<bool> built_off_creator_thread{false};

 private:
  int64_t n_, fail_at_;
  int delay_ms_;
  std::thread::id creator_ = std::this_thread::get_id();
};

// All targets of a pass, batch after batch (the indexed dataset's targets are the sample indices).
std::vector<int64_t> visit_order(DataLoader& loader) {
  std::vector<int64_t> order;
  for (const Batch& batch : loader)
    for (int64_t t : batch.targets.to_vector<int64_t>()) order.push_back(t);
  return order;
}

std::string gzip_file(const std::string& path, const std::string& text) {
  gzFile out = gzopen(path.c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, text.data(), unsigned(text.size())) == int(text.size()));
  REQUIRE(gzclose(out) == Z_OK);
  return path;
}

// The error message parse_csv gives for `text`, or "" when it parses.
std::string csv_error(const std::string& text, const CsvOptions& options = {}) {
  try {
    parse_csv(text, "data.csv", options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- datasets -------------------------------------------------------------------------------------

TEST_CASE("TensorDataset returns samples and gathers batches by index") {
  auto data = indexed_dataset(10);
  CHECK(data->size() == 10);
  Batch sample = data->get(7);
  CHECK(sample.inputs.shape() == Shape{2});
  CHECK(sample.inputs.to_vector<float>() == std::vector<float>{7.f, 7.5f});
  CHECK(sample.targets.shape() == Shape{});
  CHECK(sample.targets.item<int64_t>() == 7);
  Batch batch = data->get_batch({9, 0, 4, 4});
  CHECK(batch.inputs.shape() == Shape{4, 2});
  CHECK(batch.inputs.to_vector<float>() == std::vector<float>{9.f, 9.5f, 0.f, 0.5f, 4.f, 4.5f, 4.f, 4.5f});
  CHECK(batch.targets.to_vector<int64_t>() == std::vector<int64_t>{9, 0, 4, 4});
  // Batches are copies: writing one does not change the dataset.
  batch.inputs.data<float>()[0] = -1.f;
  CHECK(data->get(9).inputs.item<float>(0) == 9.f);
  CHECK_THROWS_WITH_AS(data->get_batch({1, 10}), doctest::Contains("index 10 (position 1 of the batch) is outside"),
                       Error);
  CHECK_THROWS_WITH_AS(data->get_batch({-1}), doctest::Contains("index -1"), Error);
  CHECK_THROWS_WITH_AS(data->get(10), doctest::Contains("outside the dataset of 10 samples"), Error);
  CHECK_THROWS_WITH_AS(data->get_batch({}), doctest::Contains("empty"), Error);
}

TEST_CASE("TensorDataset with f32 [N, K] targets gathers whole rows") {
  Tensor features = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor targets = Tensor::from_vector<float>({10, 11, 12, 20, 21, 22, 30, 31, 32}, {3, 3});
  TensorDataset data(features, targets);
  Batch batch = data.get_batch({2, 0});
  CHECK(batch.targets.shape() == Shape{2, 3});
  CHECK(batch.targets.to_vector<float>() == std::vector<float>{30, 31, 32, 10, 11, 12});
  CHECK(data.get(1).targets.to_vector<float>() == std::vector<float>{20, 21, 22});
}

TEST_CASE("TensorDataset refuses tensors it cannot batch") {
  Tensor features = Tensor::zeros({4, 3});
  CHECK_THROWS_WITH_AS(TensorDataset(Tensor::zeros({4, 3}, DType::i64), Tensor::zeros({4}, DType::i64)),
                       doctest::Contains("features must be f32 [N, D]"), Error);
  CHECK_THROWS_WITH_AS(TensorDataset(Tensor::zeros({4}), Tensor::zeros({4}, DType::i64)),
                       doctest::Contains("features must be f32 [N, D]"), Error);
  CHECK_THROWS_WITH_AS(TensorDataset(features, Tensor::zeros({5}, DType::i64)),
                       doctest::Contains("do not have one row per sample"), Error);
  CHECK_THROWS_WITH_AS(TensorDataset(features, Tensor::zeros({4, 2}, DType::i64)),
                       doctest::Contains("class indices i64 [N]"), Error);
  CHECK_THROWS_WITH_AS(TensorDataset(features, Tensor::zeros({4}, DType::u8)),
                       doctest::Contains("class indices i64 [N]"), Error);
}

TEST_CASE("the default get_batch stacks samples exactly as TensorDataset's gather does") {
  // Two implementations of batching: sample-by-sample stacking and the one-pass gather.
  ProbeDataset probe(9);
  std::vector<float> features;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < 9; ++i) {
    Batch s = probe.get(i);
    for (float v : s.inputs.to_vector<float>()) features.push_back(v);
    targets.push_back(s.targets.item<int64_t>());
  }
  TensorDataset gathered(Tensor::from_vector(features, {9, 3}), Tensor::from_vector(targets));
  const std::vector<int64_t> indices{8, 3, 3, 0, 5};
  Batch a = probe.get_batch(indices), b = gathered.get_batch(indices);
  CHECK(bitwise_equal(a.inputs, b.inputs));
  CHECK(bitwise_equal(a.targets, b.targets));
  CHECK(a.inputs.shape() == Shape{5, 3});
  CHECK(a.targets.shape() == Shape{5});
}

TEST_CASE("the default get_batch refuses samples of different shapes") {
  class Ragged : public Dataset {
   public:
    int64_t size() const override { return 2; }
    Batch get(int64_t i) const override { return {Tensor::zeros({i + 1}), Tensor::from_vector<int64_t>({0}, {})}; }
  } ragged;
  CHECK_THROWS_WITH_AS(ragged.get_batch({0, 1}), doctest::Contains("sample 1 has inputs f32[2]"), Error);
}

// ---- samplers ---------------------------------------------------------------------------------------

TEST_CASE("SequentialSampler visits 0..n-1 every epoch") {
  SequentialSampler sampler(5);
  CHECK(sampler.size() == 5);
  CHECK(sampler.indices() == std::vector<int64_t>{0, 1, 2, 3, 4});
  sampler.set_epoch(3);
  CHECK(sampler.epoch() == 3);
  CHECK(sampler.indices() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(SequentialSampler(0).indices().empty());
  CHECK_THROWS_AS(SequentialSampler(-1), Error);
}

TEST_CASE("RandomSampler draws a permutation from seed + epoch") {
  RandomSampler sampler(100, 7);
  std::vector<int64_t> epoch0 = sampler.indices();
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(sorted == identity);  // every index exactly once
  CHECK(epoch0 != identity);
  CHECK(sampler.indices() == epoch0);  // asking again does not advance anything
  sampler.set_epoch(1);
  std::vector<int64_t> epoch1 = sampler.indices();
  CHECK(epoch1 != epoch0);
  // The documented rule, seed + epoch: seed 7 at epoch 1 is seed 8 at epoch 0.
  CHECK(RandomSampler(100, 8).indices() == epoch1);
  Generator generator(8);
  CHECK(random_permutation(100, generator) == epoch1);
  CHECK(RandomSampler(100, 9).indices() != epoch0);
}

// ---- CSV ------------------------------------------------------------------------------------------

TEST_CASE("parse_csv reads features and class labels, with the label column anywhere") {
  TensorDataset last = parse_csv("1,2,3,0\n4,5,6,2\n\n", "t.csv");
  CHECK(last.features().shape() == Shape{2, 3});
  CHECK(last.features().to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(last.targets().dtype() == DType::i64);
  CHECK(last.targets().to_vector<int64_t>() == std::vector<int64_t>{0, 2});

  TensorDataset first = parse_csv("1,2,3,0\r\n4,5,6,2\r\n", "t.csv", {.label_column = 0});
  CHECK(first.features().to_vector<float>() == std::vector<float>{2, 3, 0, 5, 6, 2});
  CHECK(first.targets().to_vector<int64_t>() == std::vector<int64_t>{1, 4});
  TensorDataset second_last = parse_csv("1,2,3,0\n4,5,6,2", "t.csv", {.label_column = -2});
  CHECK(second_last.targets().to_vector<int64_t>() == std::vector<int64_t>{3, 6});
}

TEST_CASE("parse_csv with num_classes refuses a label that is not a class, at its line") {
  CHECK(parse_csv("1,2,9\n3,4,0\n", "t.csv", {.num_classes = 10}).targets().to_vector<int64_t>() ==
        std::vector<int64_t>{9, 0});
  CHECK(csv_error("1,2,3\n4,5,10\n", {.num_classes = 10})
            .find("data.csv:2, column 3: the label 10 is not a class of this model (10 classes: 0 to 9); hint: ") !=
        std::string::npos);
  CHECK(
      csv_error("7.0,1,2\n", {.label_column = 0, .num_classes = 3}).find("data.csv:1, column 1: the label 7 is not") !=
      std::string::npos);
  CHECK(csv_error("1,2,300\n").empty());  // 0: no upper bound
  CHECK(csv_error("1,2,0\n", {.num_classes = -1}).find("num_classes is -1") != std::string::npos);
}

TEST_CASE("parse_csv options: header, delimiter, scale, real-valued labels, number spellings") {
  TensorDataset data = parse_csv("a;b;label\n 8 ; +16 ; 3.0 \n0;-4e0;1\n", "t.csv",
                                 {.has_header = true, .feature_scale = 1.f / 16, .delimiter = ';'});
  CHECK(data.features().to_vector<float>() == std::vector<float>{0.5f, 1.f, 0.f, -0.25f});
  CHECK(data.targets().to_vector<int64_t>() == std::vector<int64_t>{3, 1});  // "3.0" is the whole number 3

  TensorDataset tabs = parse_csv("1\t2\t0.25\n", "t.tsv", {.delimiter = '\t', .class_labels = false});
  CHECK(tabs.targets().dtype() == DType::f32);
  CHECK(tabs.targets().to_vector<float>() == std::vector<float>{0.25f});
  CHECK(tabs.features().to_vector<float>() == std::vector<float>{1, 2});
}

TEST_CASE("a bad field is reported with file, line, column and what was found") {
  std::string text;
  for (int line = 1; line <= 16; ++line) text += "1,2,3,1\n";
  text += "1,2,x,1\n";
  CHECK(csv_error(text).find("data.csv:17, column 3: expected a number, found \"x\"") != std::string::npos);
  CHECK(csv_error("1,,3,1\n").find("data.csv:1, column 2: expected a number, found an empty field") !=
        std::string::npos);
  CHECK(csv_error("1,2,3,1\n1,nan,3,1\n").find("data.csv:2, column 2: expected a finite number, found \"nan\"") !=
        std::string::npos);
  CHECK(csv_error("1,inf,3,1\n").find("expected a finite number, found \"inf\"") != std::string::npos);
  CHECK(csv_error("1,1e50,3,1\n").find("column 2: the number \"1e50\" does not fit in a 32-bit float") !=
        std::string::npos);
  CHECK(csv_error("1,2 3,3,1\n").find("found \"2 3\"") != std::string::npos);
  CHECK(csv_error("1,\"2\",3,1\n").find("found \"\"2\"\"") != std::string::npos);
  // A header that was not declared: the hint says so.
  CHECK(csv_error("x,y,label\n1,2,0\n").find("set CsvOptions::has_header") != std::string::npos);
  // Long fields are cut in the message.
  CHECK(csv_error("1," + std::string(100, 'z') + ",0\n").find("zzz...\"") != std::string::npos);
}

TEST_CASE("labels that are not class indices are refused") {
  CHECK(csv_error("1,2,3.5\n").find("data.csv:1, column 3: the label \"3.5\" is not an integer") != std::string::npos);
  CHECK(csv_error("1,2,0\n1,2,-1\n").find("data.csv:2, column 3: the label -1 is negative") != std::string::npos);
  CHECK(csv_error("1,2,cat\n1,2,0\n", {.has_header = false}).find("column 3: expected a class label, found \"cat\"") !=
        std::string::npos);
  CHECK(csv_error("1,2,1e300\n").find("is not an integer") != std::string::npos);
  // The same values are fine as real-valued targets.
  CHECK(csv_error("1,2,3.5\n1,2,-1\n", {.class_labels = false}).empty());
}

TEST_CASE("ragged, empty and header-only inputs are refused") {
  CHECK(csv_error("1,2,3,1\n1,2,3,1\n1,2,1\n").find("data.csv:3: found 3 columns, but line 1 has 4") !=
        std::string::npos);
  CHECK(csv_error("1,2,3,1\n1,2,3,1,9\n").find("found 5 columns, but line 1 has 4") != std::string::npos);
  CHECK(csv_error("a,b,c\n1,2\n", {.has_header = true}).find("data.csv:2: found 2 columns, but line 1 has 3") !=
        std::string::npos);
  CHECK(csv_error("").find("data.csv is empty") != std::string::npos);
  CHECK(csv_error("\n  \n\r\n").find("holds only blank lines") != std::string::npos);
  CHECK(csv_error("a,b,label\n", {.has_header = true}).find("holds a header but no data rows") != std::string::npos);
  CHECK(csv_error("1\n2\n").find("data.csv:1: found a single column") != std::string::npos);
  CHECK(csv_error("1,2,3\n", {.label_column = 3}).find("label_column 3 is outside the 3 columns") != std::string::npos);
  CHECK(csv_error("1,2,3\n", {.label_column = -4}).find("label_column -4 is outside") != std::string::npos);
  CHECK(csv_error("1.2.3\n", {.delimiter = '.'}).find("the delimiter '.' can be part of a number") !=
        std::string::npos);
}

TEST_CASE("inputs over the size limits are refused") {
  CHECK(csv_error("1,2,3\n4,5,6\n", {.max_bytes = 8}).find("holds 12 bytes of text, over the limit of 8") !=
        std::string::npos);
  CHECK(csv_error("1,2,3\n4,5,6,7,8,9,10\n", {.max_line_bytes = 10})
            .find("data.csv:2: the line is 14 bytes long, over the limit of 10") != std::string::npos);
  CHECK(csv_error("1,2,3,4,5\n", {.max_columns = 4}).find("data.csv:1: more than 4 columns") != std::string::npos);
  // Rows: the header is not one of them; exactly max_rows rows pass, one more is refused on its line.
  CHECK(csv_error("a,b\n1,0\n2,1\n", {.has_header = true, .max_rows = 2}).empty());
  CHECK(csv_error("a,b\n1,0\n\n2,1\n3,0\n", {.has_header = true, .max_rows = 2})
            .find("data.csv:5: more than 2 data rows") != std::string::npos);
  CHECK(csv_error("1,0\n", {.max_rows = 0}).find("the size limits must be positive") != std::string::npos);
  // A feature that is finite alone but not once scaled.
  CHECK(csv_error("3e38,0\n", {.feature_scale = 10.f})
            .find("data.csv:1, column 1: 3e+38 times feature_scale 10 overflows") != std::string::npos);
}

TEST_CASE("a gzip bomb is refused once max_bytes of text came out, not after inflating all of it") {
  TempDir dir;
  // 32 MiB of rows that gzip squeezes into a few tens of KiB.
  std::string rows;
  for (int i = 0; i < (8 << 20); ++i) rows += "0,0\n";
  gzip_file(dir.file("bomb.csv.gz"), rows);
  CHECK(std::filesystem::file_size(dir.file("bomb.csv.gz")) < (1u << 20));
  CHECK_THROWS_WITH_AS(read_csv(dir.file("bomb.csv.gz"), {.max_bytes = 1 << 20}),
                       doctest::Contains("holds more than 1048576 bytes of text (after decompression)"), Error);
}

TEST_CASE("read_csv reads plain and gzip files, and names the file in its errors") {
  TempDir dir;
  const std::string text = "0,1,2,1\n3,4,5,0\n";
  std::ofstream(dir.file("plain.csv")) << text;
  gzip_file(dir.file("packed.csv.gz"), text);
  for (const std::string name : {"plain.csv", "packed.csv.gz"}) {
    INFO(name);
    TensorDataset data = read_csv(dir.file(name));
    CHECK(data.features().to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
    CHECK(data.targets().to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  }
  gzip_file(dir.file("bad.csv.gz"), "1,2,3\n4,x,6\n");
  CHECK_THROWS_WITH_AS(read_csv(dir.file("bad.csv.gz")),
                       doctest::Contains("bad.csv.gz:2, column 2: expected a number, found \"x\""), Error);
  std::ofstream(dir.file("empty.csv")) << "";
  CHECK_THROWS_WITH_AS(read_csv(dir.file("empty.csv")), doctest::Contains("empty.csv is empty"), Error);
  CHECK_THROWS_WITH_AS(read_csv(dir.file("missing.csv")), doctest::Contains("cannot open"), Error);
  // A gzip stream cut short is an error, not a silently shorter dataset.
  std::string big;
  for (int i = 0; i < 5000; ++i) big += std::to_string(i) + "," + std::to_string(i * 7 % 13) + ",1\n";
  gzip_file(dir.file("cut.csv.gz"), big);
  std::filesystem::resize_file(dir.file("cut.csv.gz"), std::filesystem::file_size(dir.file("cut.csv.gz")) / 2);
  CHECK_THROWS_WITH_AS(read_csv(dir.file("cut.csv.gz")), doctest::Contains("cut.csv.gz failed"), Error);
  // The size limit applies to the decompressed text.
  CHECK_THROWS_WITH_AS(read_csv(dir.file("packed.csv.gz"), {.max_bytes = 10}),
                       doctest::Contains("holds more than 10 bytes"), Error);
}

TEST_CASE("the digits data set: 1797 rows, 64 features, labels 0..9, and pixel values as Python reads them") {
  const std::string path = testing::digits_data();
  if (path.empty()) {
    TINYDDP_SKIP("neither " TINYDDP_SHARED_DATA
                 "/digits.csv.gz nor data/digits.csv.gz is there (make data extracts it)");
  }
  TensorDataset digits = read_csv(path, {.feature_scale = 1.f / 16});
  REQUIRE(digits.features().shape() == Shape{1797, 64});
  REQUIRE(digits.targets().shape() == Shape{1797});
  // Reference values read with Python from the same file:
  //   rows = list(csv.reader(gzip.open("digits.csv.gz", "rt")));  rows[r][c]
  // rows[0][2] = 5, rows[0][3] = 13, rows[1][20] = 16, rows[1000][36] = 14, rows[1796][61] = 12,
  // labels rows[0][64] = 0, rows[16][64] = 6, rows[1796][64] = 8; the 64 pixel columns sum to 561718;
  // label counts 0..9: 178 182 177 183 181 182 181 179 174 180.
  auto pixel = [&](int64_t row, int64_t column) { return digits.features().item<float>(row * 64 + column); };
  CHECK(pixel(0, 2) == 5.f / 16);
  CHECK(pixel(0, 3) == 13.f / 16);
  CHECK(pixel(1, 20) == 16.f / 16);
  CHECK(pixel(1000, 36) == 14.f / 16);
  CHECK(pixel(1796, 61) == 12.f / 16);
  const std::vector<int64_t> labels = digits.targets().to_vector<int64_t>();
  CHECK(labels[0] == 0);
  CHECK(labels[16] == 6);
  CHECK(labels[1796] == 8);
  std::vector<int64_t> counts(10, 0);
  for (int64_t label : labels) {
    REQUIRE((label >= 0 && label <= 9));
    ++counts[size_t(label)];
  }
  CHECK(counts == std::vector<int64_t>{178, 182, 177, 183, 181, 182, 181, 179, 174, 180});
  double sum = 0;
  for (float v : digits.features().to_vector<float>()) sum += double(v) * 16;
  CHECK(sum == 561718.0);
}

// ---- DataLoader -----------------------------------------------------------------------------------

TEST_CASE("a shuffled DataLoader visits every index exactly once per epoch, in a seed- and epoch-given order") {
  within_seconds(60, [] {
    auto data = indexed_dataset(50);
    DataLoader loader(data, {.batch_size = 7, .shuffle = true, .seed = 3});
    CHECK(loader.size() == 8);
    std::vector<int64_t> epoch0 = visit_order(loader);
    std::vector<int64_t> sorted = epoch0;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> identity(50);
    std::iota(identity.begin(), identity.end(), 0);
    CHECK(sorted == identity);
    CHECK(epoch0 != identity);
    CHECK(visit_order(loader) == epoch0);  // a second pass over the same epoch: the same order

    DataLoader twin(data, {.batch_size = 7, .shuffle = true, .seed = 3});
    CHECK(visit_order(twin) == epoch0);  // the same seed, the same order, in another loader

    loader.set_epoch(1);
    std::vector<int64_t> epoch1 = visit_order(loader);
    CHECK(epoch1 != epoch0);
    std::sort(epoch1.begin(), epoch1.end());
    CHECK(epoch1 == identity);

    DataLoader other_seed(data, {.batch_size = 7, .shuffle = true, .seed = 4});
    CHECK(visit_order(other_seed) != epoch0);
  });
}

TEST_CASE("DataLoader batch shapes, the short last batch, drop_last and size()") {
  within_seconds(60, [] {
    auto data = indexed_dataset(10);
    DataLoader keep(data, {.batch_size = 4});
    CHECK(keep.size() == 3);
    std::vector<int64_t> rows;
    for (const Batch& batch : keep) {
      CHECK(batch.inputs.dim() == 2);
      CHECK(batch.inputs.size(1) == 2);
      CHECK(batch.targets.shape() == Shape{batch.inputs.size(0)});
      CHECK(batch.inputs.device().is_cpu());
      rows.push_back(batch.inputs.size(0));
    }
    CHECK(rows == std::vector<int64_t>{4, 4, 2});
    CHECK(visit_order(keep) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});  // no shuffle: in order

    DataLoader drop(data, {.batch_size = 4, .drop_last = true});
    CHECK(drop.size() == 2);
    CHECK(visit_order(drop) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
    DataLoader exact(data, {.batch_size = 5, .drop_last = true});
    CHECK(exact.size() == 2);
    CHECK(visit_order(exact).size() == 10);
    DataLoader too_big(data, {.batch_size = 11, .drop_last = true});
    CHECK(too_big.size() == 0);
    CHECK((too_big.begin() == too_big.end()));
    DataLoader one_batch(data, {.batch_size = 11});
    CHECK(one_batch.size() == 1);
    CHECK(visit_order(one_batch).size() == 10);
  });
}

TEST_CASE("batches are built on a background thread with prefetch, on the caller's without, and agree") {
  within_seconds(60, [] {
    auto with = std::make_shared<ProbeDataset>(23);
    auto without = std::make_shared<ProbeDataset>(23);
    DataLoader a(with, {.batch_size = 5, .shuffle = true, .seed = 1});
    DataLoader b(without, {.batch_size = 5, .shuffle = true, .seed = 1, .prefetch = false});
    std::vector<Batch> from_a, from_b;
    for (const Batch& batch : a) from_a.push_back(batch);
    for (const Batch& batch : b) from_b.push_back(batch);
    REQUIRE(from_a.size() == 5);
    REQUIRE(from_b.size() == 5);
    for (size_t i = 0; i < from_a.size(); ++i) {
      CHECK(bitwise_equal(from_a[i].inputs, from_b[i].inputs));
      CHECK(bitwise_equal(from_a[i].targets, from_b[i].targets));
    }
    CHECK(with->built_off_creator_thread);
    CHECK_FALSE(without->built_off_creator_thread);
  });
}

TEST_CASE("a custom sampler sets the order; combining one with shuffle, or batch_size 0, is refused") {
  class Reversed : public Sampler {
   public:
    std::vector<int64_t> indices() const override { return {4, 3, 2, 1, 0}; }
    int64_t size() const override { return 5; }
  };
  within_seconds(60, [] {
    auto data = indexed_dataset(5);
    DataLoader loader(data, {.batch_size = 2}, std::make_shared<Reversed>());
    CHECK(visit_order(loader) == std::vector<int64_t>{4, 3, 2, 1, 0});
    CHECK_THROWS_WITH_AS(DataLoader(data, {.shuffle = true}, std::make_shared<Reversed>()),
                         doctest::Contains("a sampler and shuffle = true were both given"), Error);
    CHECK_THROWS_WITH_AS(DataLoader(data, {.batch_size = 0}), doctest::Contains("batch_size 0 must be at least 1"),
                         Error);
    CHECK_THROWS_WITH_AS(DataLoader(nullptr), doctest::Contains("the dataset is null"), Error);
  });
}

TEST_CASE("an exception while building a batch reaches the consumer at that batch, with or without prefetch") {
  for (bool prefetch : {true, false}) {
    INFO("prefetch ", prefetch);
    within_seconds(60, [prefetch] {
      // Sample 25 throws: batches [0, 10) and [10, 20) arrive, the third fails.
      auto data = std::make_shared<ProbeDataset>(40, 25);
      DataLoader loader(data, {.batch_size = 10, .prefetch = prefetch});
      int delivered = 0;
      std::string error;
      try {
        for (const Batch& batch : loader) {
          CHECK(batch.inputs.size(0) == 10);
          ++delivered;
        }
      } catch (const Error& e) {
        error = e.what();
      }
      CHECK(delivered == 2);
      CHECK(error.find("ProbeDataset: sample 25 is broken") != std::string::npos);
      // The failure in the very first batch comes out of begin().
      auto first_bad = std::make_shared<ProbeDataset>(40, 0);
      DataLoader broken(first_bad, {.batch_size = 10, .prefetch = prefetch});
      CHECK_THROWS_WITH_AS(broken.begin(), doctest::Contains("sample 0 is broken"), Error);
      // The next pass starts afresh and fails again at the same place.
      CHECK_THROWS_AS(broken.begin(), Error);
    });
  }
}

TEST_CASE("leaving the loop early stops the worker; the queue holds at most two batches") {
  within_seconds(60, [] {
    auto data = std::make_shared<ProbeDataset>(100, -1, 1);
    DataLoader loader(data, {.batch_size = 1});
    int seen = 0;
    for (const Batch& batch : loader) {
      CHECK(batch.inputs.size(0) == 1);
      if (++seen == 2) break;
    }
    // The loop's iterator is gone: its worker was stopped and joined, so the count is final. At most
    // the two batches consumed, two queued and the one being built when the loop ended.
    const int built = data->batches_built;
    CHECK(built <= 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(data->batches_built == built);

    // A consumer that stalls: the worker fills the queue and waits instead of building everything.
    auto slow_consumer = std::make_shared<ProbeDataset>(100);
    DataLoader bounded(slow_consumer, {.batch_size = 1});
    auto it = bounded.begin();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(slow_consumer->batches_built <= 3);  // the one consumed and two in the queue
    ++it;
    CHECK(it->targets.item<int64_t>() == 1);
  });
}

TEST_CASE("destroying the loader, or the iterator, in the middle of a pass is clean") {
  within_seconds(60, [] {
    // The loader goes first: the pass keeps the dataset alive and finishes.
    auto loader = std::make_unique<DataLoader>(indexed_dataset(20), DataLoaderOptions{.batch_size = 3});
    DataLoader::Iterator it = loader->begin();
    loader.reset();
    std::vector<int64_t> order;
    for (; it != DataLoader::End{}; ++it)
      for (int64_t t : it->targets.to_vector<int64_t>()) order.push_back(t);
    CHECK(order.size() == 20);
    CHECK(order.front() == 0);
    CHECK(order.back() == 19);

    // Iterators dropped while the worker waits on a full queue, and while it is building a batch.
    auto slow = std::make_shared<ProbeDataset>(50, -1, 5);
    DataLoader slow_loader(slow, {.batch_size = 2});
    for (int round = 0; round < 5; ++round) {
      DataLoader::Iterator pass = slow_loader.begin();
      CHECK(pass->inputs.size(0) == 2);
    }
    { DataLoader::Iterator idle = DataLoader(indexed_dataset(100), {.batch_size = 1}).begin(); }
    DataLoader::Iterator past_end;
    CHECK((past_end == DataLoader::End{}));
    CHECK_THROWS_WITH_AS(*past_end, doctest::Contains("past the last batch"), Error);
  });
}
