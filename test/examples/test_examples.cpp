// The examples, run as a user runs them (the built programs, each within a time limit): the seed job
// in one process; the seed's multi-device job on 2 CPU workers, spawned and under tinyddp-run, its
// checkpoints and resume, its timeline; digits reaching 95% test accuracy with 2 workers.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/core/trace.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "test/comm/helpers/child_process.h"
#include "test/examples/example_programs.h"
#include "test/test_skip.h"
#include "test/test_support.h"
#include "examples/dummy_dataset.h"

using namespace tinyddp;
using namespace std::chrono_literals;

namespace {

using tinyddp::testing::count;
using tinyddp::testing::have_programs;
using tinyddp::testing::program;
using tinyddp::testing::run;
using tinyddp::testing::TempDir;

// The number after `label` in `text` (the first occurrence); fails the test when there is none.
double number_after(const std::string& text, const std::string& label) {
  size_t at = text.find(label);
  REQUIRE_MESSAGE(at != std::string::npos, "no \"", label, "\" in the output:\n", text);
  return std::stod(text.substr(at + label.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("examples/dummy: the seed job in one process trains and saves") {
  if (!have_programs({"dummy"})) return;
  TempDir dir;
  auto out = run({"dummy", "--epochs", "2", "--save", dir.file("m.safetensors")});
  REQUIRE(out.exit_code == 0);
  CHECK(count(out.report, "epoch ") == 2);
  CHECK(out.report.find("final: loss") != std::string::npos);
  CHECK(load_safetensors(dir.file("m.safetensors")).get("weight").shape() == Shape{2, 10});
}

TEST_CASE("examples/dummy_mgpu: 2 CPU workers; only rank 0 reports; the spawner saves rank 0's weights") {
  if (!have_programs({"dummy_mgpu", "tinyddp-run"})) return;
  TempDir dir;
  auto out = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "3", "--save",
                  dir.file("spawned.safetensors")});
  REQUIRE(out.exit_code == 0);
  // One progress line per epoch: rank 1 trains but does not print.
  CHECK(count(out.report, "epoch 1/3") == 1);
  CHECK(count(out.report, "epoch 3/3") == 1);
  CHECK(count(out.report, "2 CPU workers, 3 epochs: final loss") == 1);

  // The saved file is a PyTorch nn.Linear(10, 2) state_dict, and the loss printed is the loss of these
  // weights on the whole data set, recomputed here.
  SafetensorsFile saved = load_safetensors(dir.file("spawned.safetensors"));
  CHECK(saved.get("weight").shape() == Shape{2, 10});
  CHECK(saved.get("bias").shape() == Shape{2});
  Generator unused(0);
  nn::Linear model(10, 2, unused);
  nn::load_model(dir.file("spawned.safetensors"), model);
  auto data = examples::make_dummy_dataset(1000, 10, 0);
  nn::CrossEntropyLoss loss_fn;
  Tensor logits = model.forward(data->features());
  double loss = loss_fn.evaluate(logits, data->targets());
  // The report rounds the loss to 4 decimals: within 0.5e-4 of the program's. The program computed it
  // in one batch too, but perhaps with another GEMM thread count, so another order of additions: each
  // logit b_c + sum_k w_ck x_k (10 products) is within gamma(12) M, M = |b_c| + sum_k |w_ck x_k|, of
  // exact (test_support.h), two computations within twice that, and a row's loss logsumexp(z) - z_y
  // moves by at most twice its largest logit change. Its own float roundings (z - max, expf and logf
  // within an ulp, the 2-term sum, two additions) stay below u (4 max|z| + 8 + loss) on each side, and
  // each side rounds the mean to float once more (u L).
  const std::vector<float> x = data->features().to_vector<float>(), z = logits.to_vector<float>();
  const std::vector<float> w = model.weight().value.to_vector<float>(), b = model.bias().value.to_vector<float>();
  const std::vector<int64_t> y = data->targets().to_vector<int64_t>();
  double spread = 0;
  for (size_t i = 0; i < 1000; ++i) {
    double largest_m = 0, largest_z = 0;
    for (size_t c = 0; c < 2; ++c) {
      double m = std::fabs(double(b[c]));
      for (size_t k = 0; k < 10; ++k) m += std::fabs(double(w[c * 10 + k]) * double(x[i * 10 + k]));
      largest_m = std::max(largest_m, m);
      largest_z = std::max(largest_z, std::fabs(double(z[i * 2 + c])));
    }
    const double top = std::max(double(z[i * 2]), double(z[i * 2 + 1]));
    const double row_loss = top + std::log(std::exp(z[i * 2] - top) + std::exp(z[i * 2 + 1] - top)) -
                            z[i * 2 + size_t(y[i])];
    spread += 2 * 2 * testing::gamma_n(12) * largest_m + 2 * testing::kFloatRoundoff * (4 * largest_z + 8 + row_loss);
  }
  const double bound = 0.5e-4 + spread / 1000 + 2 * testing::kFloatRoundoff * loss;
  CHECK(std::fabs(number_after(out.report, "final loss ") - loss) <= bound);

  // --load starts from a saved file: with no epochs to train, the same weights come back out.
  auto reloaded = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "0", "--load",
                       dir.file("spawned.safetensors"), "--save", dir.file("reloaded.safetensors")});
  REQUIRE(reloaded.exit_code == 0);
  CHECK(read_file(dir.file("reloaded.safetensors")) == read_file(dir.file("spawned.safetensors")));

  // The same job started by the launcher instead (the program joins, spawns nothing) ends bitwise the same.
  auto launched = run({"tinyddp-run", "-n", "2", program("dummy_mgpu"), "--device", "cpu", "--epochs", "3", "--save",
                       dir.file("launched.safetensors")});
  REQUIRE(launched.exit_code == 0);
  CHECK(count(launched.report, "saved ") == 1);  // rank 0 only
  CHECK(read_file(dir.file("launched.safetensors")) == read_file(dir.file("spawned.safetensors")));
}

TEST_CASE(
    "examples/dummy_mgpu: --checkpoint-dir resumes where a stopped run left off and ends where an unstopped one does") {
  if (!have_programs({"dummy_mgpu"})) return;
  TempDir dir;
  auto first = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "2", "--checkpoint-dir",
                    dir.file("ck"), "--save", ""});
  REQUIRE(first.exit_code == 0);
  CHECK(std::filesystem::exists(dir.file("ck/last.safetensors")));
  CHECK(std::filesystem::exists(dir.file("ck/best.safetensors")));
  auto resumed = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "4", "--checkpoint-dir",
                      dir.file("ck"), "--save", dir.file("resumed.safetensors")});
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.report.find("2 of 4 epochs done") != std::string::npos);
  CHECK(count(resumed.report, "epoch 1/4") == 0);
  CHECK(count(resumed.report, "epoch 3/4") == 1);
  auto straight = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "4", "--save",
                       dir.file("straight.safetensors")});
  REQUIRE(straight.exit_code == 0);
  CHECK(read_file(dir.file("resumed.safetensors")) == read_file(dir.file("straight.safetensors")));
}

TEST_CASE("examples/dummy_mgpu: TINYDDP_TRACE writes one timeline with both ranks' compute and communication") {
  if (!have_programs({"dummy_mgpu"})) return;
  TempDir dir;
  auto out = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "1", "--save", ""},
                 {"TINYDDP_TRACE=" + dir.file("trace.json")});
  REQUIRE(out.exit_code == 0);
  // One file: the ranks' parts were merged into it and removed.
  CHECK_FALSE(std::filesystem::exists(dir.file("trace.json.rank0")));
  CHECK_FALSE(std::filesystem::exists(dir.file("trace.json.rank1")));
  std::ifstream in(dir.file("trace.json"));
  REQUIRE(in.good());
  nlohmann::json trace = nlohmann::json::parse(in);
  std::map<int, std::map<std::string, int>> spans;  // by rank: name -> count
  std::map<int, std::set<int>> lanes;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    int rank = e.at("pid");
    spans[rank][e.at("name").get<std::string>()]++;
    lanes[rank].insert(e.at("tid").get<int>());
  }
  for (int rank : {0, 1}) {
    INFO("rank ", rank);
    // 1000 samples, 500 per rank, batches of 32: 16 steps.
    CHECK(spans[rank]["optimizer step"] == 16);
    CHECK(spans[rank]["train_step"] == 16);
    CHECK(lanes[rank].count(int(trace::Lane::compute)) == 1);
    CHECK(lanes[rank].count(int(trace::Lane::comm)) == 1);  // the gradient buckets' all-reduces
  }
}

namespace {

// The digits data set, or "" after saying why the test is skipped.
std::string digits_data_or_skip() {
  std::string data = testing::digits_data();
  if (data.empty())
    TINYDDP_RECORD_SKIP("neither " TINYDDP_SHARED_DATA
                        "/digits.csv.gz nor data/digits.csv.gz is there (make data extracts it)");
  return data;
}

}  // namespace

TEST_CASE("examples/digits: at least 95% test accuracy with 2 workers, saved under PyTorch's names") {
  if (!have_programs({"digits"})) return;
  const std::string data = digits_data_or_skip();
  if (data.empty()) return;
  TempDir dir;
  auto out = run(
      {"digits", "--data", data, "--device", "cpu", "--world-size", "2", "--save", dir.file("digits.safetensors")});
  REQUIRE(out.exit_code == 0);
  CHECK(out.report.find("1438 training rows") != std::string::npos);
  CHECK(out.report.find("359 test rows") != std::string::npos);
  CHECK(out.report.find("2 CPU workers") != std::string::npos);
  double accuracy = number_after(out.report, "test accuracy ");
  MESSAGE("digits test accuracy with 2 workers: ", accuracy);
  CHECK(accuracy >= 0.95);

  SafetensorsFile saved = load_safetensors(dir.file("digits.safetensors"));
  std::vector<std::pair<std::string, Shape>> expected = {{"0.weight", {128, 64}},
                                                         {"0.bias", {128}},
                                                         {"2.weight", {10, 128}},
                                                         {"2.bias", {10}}};
  REQUIRE(saved.tensors.size() == expected.size());
  for (const auto& [name, shape] : expected) CHECK(saved.get(name).shape() == shape);
}

TEST_CASE("examples/digits --zero 1: plain DDP's weights to the bit at 2 and 3 workers; its checkpoint resumes at 1") {
  if (!have_programs({"digits"})) return;
  const std::string data = digits_data_or_skip();
  if (data.empty()) return;
  TempDir dir;
  // The all-reduce pinned to the ring, whose order ZeRO's reduce-scatter follows (docs/zero.md).
  const std::vector<std::string> ring{"TINYDDP_ALGO=ring"};
  for (const char* workers : {"2", "3"}) {
    CAPTURE(workers);
    std::vector<std::vector<float>> weights;
    for (const char* zero : {"0", "1"}) {
      const std::string path = dir.file(std::string("w") + workers + "_" + zero + ".safetensors");
      auto out = run({"digits", "--data", data, "--device", "cpu", "--world-size", workers, "--epochs", "3", "--zero",
                      zero, "--save", path},
                     ring);
      REQUIRE(out.exit_code == 0);
      SafetensorsFile saved = load_safetensors(path);
      std::vector<float> all;
      for (const char* name : {"0.weight", "0.bias", "2.weight", "2.bias"}) {
        std::vector<float> v = saved.get(name).to_vector<float>();
        all.insert(all.end(), v.begin(), v.end());
      }
      weights.push_back(all);
    }
    CHECK(weights[0] == weights[1]);
  }
  // A ZeRO run's checkpoint holds Adam's whole state under Adam's names; one worker resumes from it.
  auto zero = run({"digits", "--data", data, "--device", "cpu", "--world-size", "2", "--epochs", "2", "--zero", "1",
                   "--checkpoint-dir", dir.file("ck")});
  REQUIRE(zero.exit_code == 0);
  SafetensorsFile checkpoint = load_safetensors(dir.file("ck/last.safetensors"));
  const Tensor exp_avg_sq = checkpoint.get("optimizer.exp_avg_sq.0.weight");
  CHECK(exp_avg_sq.shape() == Shape{128, 64});
  double sum = 0;
  for (float v : exp_avg_sq.to_vector<float>()) sum += v;
  CHECK(sum > 0);  // every shard's state is in it, not zeros
  auto resumed = run({"digits", "--data", data, "--device", "cpu", "--world-size", "1", "--epochs", "3",
                      "--checkpoint-dir", dir.file("ck")});
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.report.find("2 of 3 epochs done") != std::string::npos);
}

TEST_CASE(
    "examples/digits --comm-hook: bf16 gradients on the wire train as well as f32 (mean of 6 seeds within 0.3 "
    "points)") {
  if (!have_programs({"digits"})) return;
  const std::string data = digits_data_or_skip();
  if (data.empty()) return;
  // One seed's accuracy moves by up to a point when any bit of the training changes (359 test rows:
  // one row is 0.28 points), so the hooks are compared on the mean over seeds, each run to the end.
  const std::vector<std::string> hooks{"allreduce", "bf16_compress", "fp16_compress"};
  std::map<std::string, double> mean;
  for (int seed = 1; seed <= 6; ++seed)
    for (const std::string& hook : hooks) {
      auto out = run({"digits", "--data", data, "--device", "cpu", "--world-size", "2", "--seed", std::to_string(seed),
                      "--comm-hook", hook});
      REQUIRE_MESSAGE(out.exit_code == 0, out.report);
      const double accuracy = number_after(out.report, "test accuracy ");
      MESSAGE("digits --seed ", seed, " --comm-hook ", hook, ": test accuracy ", accuracy);
      CHECK(accuracy >= 0.93);
      mean[hook] += accuracy / 6;
    }
  MESSAGE("mean test accuracy: f32 ", mean["allreduce"], ", bf16 ", mean["bf16_compress"], ", f16 ",
          mean["fp16_compress"]);
  CHECK(std::abs(mean["bf16_compress"] - mean["allreduce"]) <= 0.003);
  CHECK(std::abs(mean["fp16_compress"] - mean["allreduce"]) <= 0.01);
  auto both = run({"digits", "--data", data, "--device", "cpu", "--world-size", "2", "--zero", "1", "--comm-hook",
                   "bf16_compress"});
  CHECK(both.exit_code == 1);
  CHECK(both.report.find("ZeRO-1 reduces the buckets with its own hook") != std::string::npos);
  auto unknown = run({"digits", "--data", data, "--comm-hook", "topk"});
  CHECK(unknown.exit_code == 2);
}

TEST_CASE("examples/digits: bad options are refused with a message that says what to do") {
  if (!have_programs({"digits"})) return;
  auto bad_hidden = run({"digits", "--data", "/nonexistent.csv", "--hidden", "12,x"});
  CHECK(bad_hidden.exit_code == 2);  // a usage error: nothing ran
  CHECK(bad_hidden.report.find("\"x\" is not a positive layer width; hint: ") != std::string::npos);
  auto missing = run({"digits", "--data", "/nonexistent/digits.csv.gz", "--world-size", "1"});
  CHECK(missing.exit_code == 1);
  CHECK(missing.report.find("/nonexistent/digits.csv.gz") != std::string::npos);
  TempDir dir;
  { std::ofstream(dir.file("d.csv")) << "1,2,3\n4,5,6\n"; }
  auto narrow = run({"digits", "--data", dir.file("d.csv"), "--world-size", "1"});
  CHECK(narrow.exit_code == 1);
  CHECK(narrow.report.find("64 features") != std::string::npos);
}
