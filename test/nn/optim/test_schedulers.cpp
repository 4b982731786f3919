// Learning-rate schedules against torch.optim.lr_scheduler (test/fixtures/make_nn.py ->
// nn_schedulers.safetensors): the lr after construction and after every step().
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/optim/sgd.h"
#include "test/test_support.h"

using namespace tinyddp;
using tinyddp::testing::fixture;

namespace {

const SafetensorsFile& schedule_fixture() {
  static const SafetensorsFile file = load_safetensors(fixture("nn_schedulers.safetensors"));
  return file;
}

nlohmann::json case_config(const std::string& name) {
  return nlohmann::json::parse(schedule_fixture().metadata.at("cases"))[name];
}

// An optimizer to schedule: one parameter, no gradients needed (schedulers only read and set the lr).
struct Rig {
  nn::Parameter p{Tensor::zeros({1}), Tensor::zeros({1}), /*has_grad=*/false, {}};
  nn::SGD optimizer;
  explicit Rig(double lr) : optimizer({{"p", &p}}, lr) {}
};

// The lr right after construction, then after each of the reference's steps, against PyTorch's.
// PyTorch derives each lr from the previous one; ours is a closed form: they agree to rounding.
void check_sequence(nn::LRScheduler& scheduler, const std::string& name) {
  std::vector<double> ref = schedule_fixture().get(name).to_vector<double>();
  REQUIRE(ref.size() > 1);
  for (size_t t = 0; t < ref.size(); ++t) {
    if (t > 0) scheduler.step();
    const double lr = scheduler.optimizer().lr();
    if (!(std::fabs(lr - ref[t]) <= 1e-15 + 1e-10 * std::fabs(ref[t]))) {
      FAIL_CHECK(name << ": lr at step " << t << " is " << lr << ", PyTorch has " << ref[t]);
      return;
    }
  }
  CHECK(scheduler.last_step() == int64_t(ref.size()) - 1);
}

}  // namespace

TEST_CASE("CosineAnnealing matches CosineAnnealingLR for 250 steps with T = 100, past T included") {
  for (std::string name : {"cosine_eta0", "cosine_eta1e-4"}) {
    CAPTURE(name);
    nlohmann::json c = case_config(name);
    REQUIRE(c["steps"].get<int>() == 250);
    Rig rig(c["base_lr"]);
    nn::CosineAnnealing cosine(rig.optimizer, c["total_iters"], c["eta_min"]);
    check_sequence(cosine, name);

    // The documented shape: eta_min at T, then rising again to the base lr at 2T (period 2T).
    const double base = c["base_lr"], eta_min = c["eta_min"];
    CHECK(cosine.lr_at(100) == doctest::Approx(eta_min).epsilon(1e-12));
    CHECK(cosine.lr_at(150) == doctest::Approx((base + eta_min) / 2).epsilon(1e-12));
    CHECK(cosine.lr_at(200) == doctest::Approx(base).epsilon(1e-12));
    CHECK(cosine.lr_at(101) > cosine.lr_at(100));
  }
}

TEST_CASE("WarmUp matches LinearLR (end_factor 1) and starts at base * start_factor") {
  nlohmann::json c = case_config("warmup");
  Rig rig(c["base_lr"]);
  nn::WarmUp warmup(rig.optimizer, c["warmup_iters"], c["start_factor"]);
  CHECK(rig.optimizer.lr() == doctest::Approx(0.1 * 0.25).epsilon(1e-12));  // set on construction
  check_sequence(warmup, "warmup");
  CHECK(warmup.lr_at(1000) == doctest::Approx(0.1).epsilon(1e-12));
}

TEST_CASE("SequentialSchedule (warm-up, then cosine) matches SequentialLR") {
  nlohmann::json c = case_config("sequential");
  Rig rig(c["base_lr"]);
  auto warmup = std::make_shared<nn::WarmUp>(rig.optimizer, c["warmup_iters"], c["start_factor"]);
  auto cosine = std::make_shared<nn::CosineAnnealing>(rig.optimizer, c["total_iters"], c["eta_min"]);
  // Constructing the cosine reset the lr to the base; the chain puts the warm-up's start back.
  nn::SequentialSchedule schedule(rig.optimizer, {warmup, cosine}, {c["milestone"].get<int64_t>()});
  CHECK(rig.optimizer.lr() == doctest::Approx(0.05 * 0.1).epsilon(1e-12));
  check_sequence(schedule, "sequential");
  // At the milestone the cosine starts from its own t = 0.
  CHECK(schedule.lr_at(5) == cosine->lr_at(0));
  CHECK(schedule.lr_at(12) == cosine->lr_at(7));
  CHECK(schedule.lr_at(4) == warmup->lr_at(4));
}

TEST_CASE("set_last_step resumes a schedule where it was") {
  Rig stepped(0.1), resumed(0.1);
  nn::CosineAnnealing a(stepped.optimizer, 50, 1e-3), b(resumed.optimizer, 50, 1e-3);
  for (int i = 0; i < 37; ++i) a.step();
  b.set_last_step(37);
  CHECK(resumed.optimizer.lr() == stepped.optimizer.lr());
  a.step();
  b.step();
  CHECK(resumed.optimizer.lr() == stepped.optimizer.lr());
  CHECK(a.kind() == "cosine");
}

TEST_CASE("schedule settings that cannot work are refused with a hint") {
  Rig rig(0.1), other(0.1);
  CHECK_THROWS_WITH_AS(nn::CosineAnnealing(rig.optimizer, 0), doctest::Contains("total_iters is 0"), Error);
  CHECK_THROWS_WITH_AS(nn::WarmUp(rig.optimizer, 5, 0.0), doctest::Contains("(0, 1]"), Error);
  CHECK_THROWS_WITH_AS(nn::WarmUp(rig.optimizer, 0, 0.5), doctest::Contains("hint:"), Error);
  auto w = std::make_shared<nn::WarmUp>(rig.optimizer, 5, 0.1);
  auto c = std::make_shared<nn::CosineAnnealing>(rig.optimizer, 10);
  auto elsewhere = std::make_shared<nn::CosineAnnealing>(other.optimizer, 10);
  CHECK_THROWS_WITH_AS(nn::SequentialSchedule(rig.optimizer, {w, c}, {}), doctest::Contains("need 1 milestones"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::SequentialSchedule(rig.optimizer, {w, c, c}, {5, 5}),
                       doctest::Contains("strictly increasing"), Error);
  CHECK_THROWS_WITH_AS(nn::SequentialSchedule(rig.optimizer, {w, elsewhere}, {5}),
                       doctest::Contains("another optimizer"), Error);
}
