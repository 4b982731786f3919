// soak: the fault-tolerance soak. Runs a training job N times under tinyddp-run --max-restarts, and
// in each run SIGKILLs one worker, chosen at random, at a random moment -- rendezvous, forward,
// backward, an all-reduce, a checkpoint write, whatever it happens to be doing. Then it checks what a
// user would: did the job finish with the epochs it was asked for; does every checkpoint left on
// disk load (the library's own validator, load_safetensors, and the training-state metadata); how
// many epochs had to be done again; and the final accuracy, beside a run that was never killed.
//
//   soak --runs 50 --job digits --epochs 20 --data data/digits.csv.gz
//   soak --runs 3 --job dummy_mgpu --epochs 6          # the short version make test runs
//
// The moment of the kill is uniform over the length of the unkilled run (measured first). A kill that
// lands after the last worker has finished injects nothing, and is reported as such. Exits 0 when
// every run finished and no checkpoint was corrupt.
//
// With --max-restarts 0 no run can finish after a kill; the soak then checks the other promise: the
// launcher stops every rank within 10 s of the kill and names the killed rank as the root cause (not
// a peer that failed because it had gone). Exits 0 when that held for every kill.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/core/command_line.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/train/addons/state_manager.h"

using namespace tinyddp;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

struct SoakOptions {
  int runs = 20;
  std::string job = "digits";
  int epochs = 20;
  int world_size = 2;
  int max_restarts = 3;
  uint64_t seed = 1;
  std::string bin_dir;
  std::string data = "data/digits.csv.gz";
  std::string work_dir;
  bool keep = false;
};

// How one run of the job went.
struct RunOutcome {
  bool finished = false;  // exit 0, every epoch done
  bool hung = false;      // still running at the deadline (killed)
  bool killed_worker = false;
  int killed_rank = -1;
  double kill_at_s = 0;
  int restarts = 0;
  int epochs_redone = 0;  // epochs trained, then trained again after a restart
  int checkpoints = 0;    // files loaded
  int corrupt = 0;
  double accuracy = -1;
  std::string weights;  // the saved final weights
  double seconds = 0;
  bool root_cause_named = false;  // the launcher's first failure message names the killed rank, SIGKILL
  std::string log;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The number after the last `label` in `text`; -1 when there is none.
double last_number_after(const std::string& text, const std::string& label) {
  size_t at = text.rfind(label);
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + label.size());
}

// Whether one line of `text` holds both `a` and then `b`.
bool has_line(const std::string& text, const std::string& a, const std::string& b) {
  for (size_t at = text.find(a); at != std::string::npos; at = text.find(a, at + 1)) {
    size_t end = text.find('\n', at);
    if (text.substr(at, end == std::string::npos ? std::string::npos : end - at).find(b) != std::string::npos)
      return true;
  }
  return false;
}

// The processes whose parent is `parent`: the launcher's workers.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::string stat = slurp("/proc/" + name + "/stat");
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent && state != 'Z')
      children.push_back(pid_t(std::atoi(name.c_str())));
  }
  return children;
}

// A worker's RANK, from its environment (-1 when unreadable).
int rank_of(pid_t pid) {
  std::string env = slurp("/proc/" + std::to_string(pid) + "/environ");
  for (size_t at = 0; at < env.size(); at = env.find('\0', at) + 1) {
    if (env.compare(at, 5, "RANK=") == 0) return std::atoi(env.c_str() + at + 5);
    if (env.find('\0', at) == std::string::npos) break;
  }
  return -1;
}

class Soak {
 public:
  explicit Soak(SoakOptions o) : o_(std::move(o)), rng_(o_.seed) {}

  std::vector<std::string> command(const std::string& dir) const {
    std::vector<std::string> argv{o_.bin_dir + "/tinyddp-run",
                                  "-n",
                                  std::to_string(o_.world_size),
                                  "--max-restarts",
                                  std::to_string(o_.max_restarts),
                                  "--grace-ms",
                                  "3000",
                                  o_.bin_dir + "/" + o_.job,
                                  "--device",
                                  "cpu",
                                  "--epochs",
                                  std::to_string(o_.epochs),
                                  "--checkpoint-dir",
                                  dir + "/ck",
                                  "--save",
                                  dir + "/final.safetensors"};
    if (o_.job == "digits") argv.insert(argv.end(), {"--data", o_.data});
    return argv;
  }

  // One run; kill_after < 0: never kill.
  RunOutcome run(const std::string& dir, double kill_after_s) {
    fs::create_directories(dir);
    RunOutcome out;
    const std::string log_path = dir + "/log.txt";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<std::string> argv = command(dir);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t launcher = 0;
    int spawned = posix_spawn(&launcher, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    TINYDDP_CHECK(spawned == 0, "soak: cannot start ", args[0], ": ", std::strerror(spawned),
                  hint("pass --bin-dir, the folder holding tinyddp-run and ", o_.job));

    const auto start = Clock::now();
    const auto deadline = start + std::chrono::seconds(120) + std::chrono::duration<double>(20 * baseline_s_);
    int status = 0;
    bool ended = false;
    while (!ended) {
      ended = waitpid(launcher, &status, WNOHANG) == launcher;
      if (ended) break;
      double now_s = std::chrono::duration<double>(Clock::now() - start).count();
      if (kill_after_s >= 0 && !out.killed_worker && now_s >= kill_after_s) {
        kill_after_s = -1;  // one attempt: when no worker is running at that moment, nothing is injected
        std::vector<pid_t> workers = children_of(launcher);
        if (!workers.empty()) {
          pid_t victim = workers[std::uniform_int_distribution<size_t>(0, workers.size() - 1)(rng_)];
          out.killed_rank = rank_of(victim);
          out.killed_worker = ::kill(victim, SIGKILL) == 0;
          out.kill_at_s = now_s;
        }
      }
      if (Clock::now() > deadline) {
        out.hung = true;
        ::kill(launcher, SIGTERM);  // it stops its workers
        waitpid(launcher, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    out.log = slurp(log_path);
    out.finished = !out.hung && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    out.restarts = int(count(out.log, "; stopped the group; restart "));
    // rank 0 prints "epoch k/E  train ..." once per epoch it finishes; beyond E, epochs done twice.
    out.epochs_redone = int(count(out.log, "/" + std::to_string(o_.epochs) + "  train")) - o_.epochs;
    out.accuracy = last_number_after(out.log, "accuracy ");
    out.weights = slurp(dir + "/final.safetensors");
    // The launcher's first word on the failure (the restart warning, or its last line when none is
    // left) must be about the killed rank, not a peer that failed after it.
    size_t first = out.log.find("worker rank ");
    std::string line = first == std::string::npos ? "" : out.log.substr(first, out.log.find('\n', first) - first);
    out.root_cause_named = has_line(line, "worker rank " + std::to_string(out.killed_rank) + " (",
                                    ") was killed by SIGKILL");
    check_checkpoints(dir + "/ck", out);
    return out;
  }

  // Every file in the checkpoint directory must load; last must hold every epoch, best the one last
  // names as best.
  void check_checkpoints(const std::string& dir, RunOutcome& out) {
    std::error_code error;
    if (!fs::is_directory(dir)) return;
    for (const auto& entry : fs::directory_iterator(dir, error)) {
      const std::string path = entry.path().string(), name = entry.path().filename().string();
      if (name.find(".tmp.") != std::string::npos) continue;     // a dead writer's leftover, never read
      if (entry.path().extension() != ".safetensors") continue;  // history.jsonl: its reader checks it
      ++out.checkpoints;
      try {
        SafetensorsFile file = load_safetensors(path);
        int64_t epochs = nn::checkpoint_epochs_done(path);
        if (name == "last.safetensors" && out.finished && epochs != o_.epochs)
          TINYDDP_FAIL(path, " holds ", epochs, " epochs, not ", o_.epochs, hint("the resume lost count"));
        if (name == "last.safetensors" && file.metadata.count("extra.trainer.best_epoch")) {
          // A job that stopped between writing last and best (no restart left to repair it) may
          // leave best one behind, when the best epoch is last's own: the next resume rewrites it
          // (or not there yet, when that was the first epoch).
          int64_t best = std::stoll(file.metadata.at("extra.trainer.best_epoch")) + 1;
          bool have_best = nn::checkpoint_exists(dir + "/best.safetensors");
          int64_t in_best = have_best ? nn::checkpoint_epochs_done(dir + "/best.safetensors") : 0;
          bool repairable = !out.finished && best == epochs && in_best < best;
          if (in_best != best && !repairable)
            TINYDDP_FAIL("best.safetensors holds the state after epoch ", in_best,
                         " but last.safetensors says the best "
                         "epoch is ",
                         best, hint("the pair was not written last-then-best"));
        }
      } catch (const std::exception& e) {
        ++out.corrupt;
        std::fprintf(stderr, "soak: CORRUPT %s: %s\n", path.c_str(), e.what());
      }
    }
  }

  int main() {
    std::printf(
        "soak: %d runs of %s (%d CPU workers, %d epochs, tinyddp-run --max-restarts %d), one worker "
        "SIGKILLed at a random moment of each\n",
        o_.runs, o_.job.c_str(), o_.world_size, o_.epochs, o_.max_restarts);
    std::printf("command: %s\n", describe(command(o_.work_dir + "/<run>")).c_str());
    // Twice, the shorter counting: the first run also pays for cold caches.
    RunOutcome baseline;
    for (int i = 0; i < 2; ++i) {
      RunOutcome r = run(o_.work_dir + "/unkilled" + std::to_string(i), -1);
      TINYDDP_CHECK(r.finished, "soak: the job fails even when nothing is killed:\n", r.log,
                    hint("fix the job first (run the command above by hand)"));
      if (i == 0 || r.seconds < baseline.seconds) baseline = r;
      fs::remove_all(o_.work_dir + "/unkilled" + std::to_string(i));
    }
    baseline_s_ = baseline.seconds;
    std::printf("unkilled run: %.2f s, final accuracy %.4f\n", baseline.seconds, baseline.accuracy);
    std::fflush(stdout);

    int finished = 0, injected = 0, hung = 0, checkpoints = 0, corrupt = 0, restarts = 0, redone = 0, max_redone = 0;
    int same_weights = 0, named = 0;
    double max_stop_s = 0;
    double min_accuracy = 1e9, sum_accuracy = 0;
    std::uniform_real_distribution<double> moment(0.0, baseline.seconds);
    for (int i = 0; i < o_.runs; ++i) {
      const std::string dir = o_.work_dir + "/run" + std::to_string(i);
      RunOutcome r = run(dir, moment(rng_));
      finished += r.finished;
      injected += r.killed_worker;
      hung += r.hung;
      checkpoints += r.checkpoints;
      corrupt += r.corrupt;
      restarts += r.restarts;
      redone += std::max(0, r.epochs_redone);
      max_redone = std::max(max_redone, r.epochs_redone);
      same_weights += r.finished && r.weights == baseline.weights;
      if (r.killed_worker) {
        named += r.root_cause_named;
        max_stop_s = std::max(max_stop_s, r.seconds - r.kill_at_s);
      }
      if (r.finished) {
        min_accuracy = std::min(min_accuracy, r.accuracy);
        sum_accuracy += r.accuracy;
      }
      if (r.finished)
        std::printf(
            "run %3d: %s at %.3f s (rank %d): finished, %d restart%s, %d epoch%s redone, accuracy %.4f, %.2f s\n", i,
            r.killed_worker ? "SIGKILL" : "no kill", r.kill_at_s, r.killed_rank, r.restarts, r.restarts == 1 ? "" : "s",
            r.epochs_redone, r.epochs_redone == 1 ? "" : "s", r.accuracy, r.seconds);
      else
        std::printf("run %3d: %s at %.3f s (rank %d): %s, root cause %s, all ranks gone %.3f s after the kill\n", i,
                    r.killed_worker ? "SIGKILL" : "no kill", r.kill_at_s, r.killed_rank, r.hung ? "HUNG" : "stopped",
                    r.root_cause_named ? "named" : "NOT named", r.seconds - r.kill_at_s);
      const bool expected = (o_.max_restarts > 0 ? r.finished : !r.hung) && (!r.killed_worker || r.root_cause_named);
      if (!expected) std::fprintf(stderr, "soak: run %d's output:\n%s\n", i, r.log.c_str());
      std::fflush(stdout);
      if (!o_.keep && r.finished && r.corrupt == 0) fs::remove_all(dir);
    }
    std::printf("\n%-26s%d\n", "runs", o_.runs);
    std::printf("%-26s%d (a kill that came after the last worker ended injects nothing)\n", "faults injected",
                injected);
    std::printf("%-26s%d of %d (%d hung)\n", "runs finished", finished, o_.runs, hung);
    std::printf("%-26s%d\n", "restarts", restarts);
    std::printf("%-26s%d of %d loaded\n", "checkpoints found corrupt", corrupt, checkpoints);
    std::printf("%-26s%d in all, at most %d in one run (%.2f per fault)\n", "epochs redone", redone, max_redone,
                injected ? double(redone) / injected : 0.0);
    if (finished)
      std::printf("%-26smin %.4f, mean %.4f (unkilled run: %.4f)\n", "final accuracy", min_accuracy,
                  sum_accuracy / finished, baseline.accuracy);
    std::printf("%-26s%d of %d\n", "final weights as unkilled", same_weights, o_.runs);
    std::printf("%-26s%d of %d kills\n", "root cause named", named, injected);
    if (o_.max_restarts == 0) std::printf("%-26s%.2f s after the kill, at most\n", "all ranks gone", max_stop_s);
    if (o_.max_restarts == 0) return hung == 0 && named == injected && max_stop_s < 10 && corrupt == 0 ? 0 : 1;
    return finished == o_.runs && corrupt == 0 ? 0 : 1;
  }

 private:
  static std::string describe(const std::vector<std::string>& argv) {
    std::string text;
    for (const auto& a : argv) text += (text.empty() ? "" : " ") + a;
    return text;
  }

  SoakOptions o_;
  std::mt19937_64 rng_;
  double baseline_s_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "soak: run a training job N times under tinyddp-run --max-restarts, SIGKILL a random worker at a "
      "random moment of each run, and check that every run finishes and every checkpoint loads"};
  SoakOptions o;
  app.add_option("--runs", o.runs, "runs with a kill")->capture_default_str();
  app.add_option("--job", o.job, "the example to run")
      ->check(CLI::IsMember({"digits", "dummy_mgpu"}))
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "epochs per run")->capture_default_str();
  app.add_option("--world-size", o.world_size, "workers (tinyddp-run -n)")->capture_default_str();
  app.add_option("--max-restarts", o.max_restarts, "tinyddp-run --max-restarts")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the victims and moments")->capture_default_str();
  app.add_option("--bin-dir", o.bin_dir, "folder of tinyddp-run and the examples (default: this program's)");
  app.add_option("--data", o.data, "digits: the CSV file")->capture_default_str();
  app.add_option("--work-dir", o.work_dir, "where the runs write (default: a new folder under /tmp, removed after)");
  app.add_flag("--keep", o.keep, "keep every run's folder (log.txt, ck/)");
  if (auto code = tinyddp::command_line::parse(app, argc, argv)) return *code;
  try {
    if (o.bin_dir.empty()) o.bin_dir = fs::read_symlink("/proc/self/exe").parent_path().string();
    std::shared_ptr<void> cleanup;
    if (o.work_dir.empty()) {
      std::string pattern = (fs::temp_directory_path() / "tinyddp_soak_XXXXXX").string();
      TINYDDP_CHECK(::mkdtemp(pattern.data()) != nullptr, "soak: cannot create ", pattern, ": ", std::strerror(errno),
                    hint("set TMPDIR, or pass --work-dir"));
      o.work_dir = pattern;
      if (!o.keep)
        cleanup = std::shared_ptr<void>(nullptr, [dir = o.work_dir](void*) {
          std::error_code ignored;
          fs::remove_all(dir, ignored);
        });
    }
    TINYDDP_CHECK(o.runs >= 0 && o.epochs >= 1 && o.world_size >= 2, "soak: --runs ", o.runs, " --epochs ", o.epochs,
                  " --world-size ", o.world_size, hint("at least 1 epoch and 2 workers"));
    return Soak(o).main();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
