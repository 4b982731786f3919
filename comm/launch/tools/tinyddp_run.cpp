// tinyddp-run: start, watch and restart the workers of a data-parallel job (torchrun's role).
//
//   tinyddp-run -n 4 ./train --epochs 3
//   tinyddp-run -n 8 --nnodes 2 --node-rank $NODE --master-addr node0 --master-port 29500 ./train
//
// Every line a worker prints comes out prefixed with its rank ("[rank 2] loss 0.31"), unless
// --prefix and --print-ranks say otherwise (comm/launch/worker_output.h):
//
//   tinyddp-run --print-ranks 0 --prefix '' -n 4 all_reduce_perf -b 8 -e 128M
//
// prints rank 0's table alone, as nccl-tests does under mpirun. The exit
// status is 0 when every worker succeeded, else the first failed worker's exit code (128 + signal
// when a signal killed it); the last line on stderr names that worker. See comm/launch/launcher.h.
//
//   tinyddp-run -n 2 --max-restarts 3 ./train --checkpoint-dir runs/a
//
// restarts the whole group when a worker dies, up to 3 times; a program that checkpoints with
// nn::StateManager then resumes from its last complete epoch (docs/reliability.md).
//
//   tinyddp-run --explain DIR
//
// reads the flight records a job left in DIR (TINYDDP_FLIGHT_RECORDER=DIR) and prints each rank's
// last collectives and which rank the others wait for (comm/launch/flight_explain.h).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>

#include <CLI/CLI.hpp>

#include "tinyddp/comm/launch/flight_explain.h"
#include "tinyddp/comm/launch/launcher.h"
#include "tinyddp/comm/launch/worker_output.h"
#include "tinyddp/comm/transport/shm_budget.h"
#include "tinyddp/comm/tuning.h"
#include "tinyddp/core/command_line.h"
#include "tinyddp/core/error.h"

namespace {

tinyddp::comm::Launcher* g_launcher = nullptr;
std::atomic<int> g_signals{0};

// The first SIGINT/SIGTERM is passed on to the workers (they get the grace period to finish);
// a second one means "now": leave at once, and PR_SET_PDEATHSIG takes the workers with us.
void on_stop_signal(int signal) {
  if (g_signals.fetch_add(1) == 0 && g_launcher) {
    g_launcher->request_stop(signal);
  } else {
    _exit(128 + signal);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tinyddp::comm;
  CLI::App app{
      "tinyddp-run [options] [--] program args...\n\nStarts N workers of a program with RANK, WORLD_SIZE, "
      "MASTER_ADDR/PORT set, watches them, and restarts the group when one fails.",
      "tinyddp-run"};
  LauncherOptions options;
  int grace_ms = 5000;
  std::string explain_dir;
  WorkerOutputOptions output;
  std::string print_ranks = "all";
  double timeout_s = 0;
  using tinyddp::command_line::at_least;
  using tinyddp::command_line::between;
  app.add_option("-n,--nproc-per-node", options.nproc_per_node, "workers on this node")
      ->check(between(1, 4096))
      ->capture_default_str();
  app.add_option("--nnodes", options.nnodes, "nodes in the job")->check(between(1, 65536))->capture_default_str();
  app.add_option("--node-rank", options.node_rank, "this node's rank, 0 .. nnodes-1")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--master-addr", options.master_addr, "node 0's address (where the store runs)")
      ->capture_default_str();
  app.add_option("--master-port", options.master_port, "the store's port [default on one node: a free port]")
      ->check(between(1, 65535));
  app.add_option("--max-restarts", options.max_restarts, "restarts of the whole group after a failure")
      ->check(between(0, 1000000))
      ->capture_default_str();
  std::string cpu_bind = "auto";
  app.add_option("--cpu-bind", cpu_bind,
                 "auto: each worker on its own share of this node's CPUs, as mpirun binds (not when the workers "
                 "outnumber them, nor under TINYDDP_BIND=none); none: wherever the scheduler puts them")
      ->check(CLI::IsMember({"auto", "none"}))
      ->capture_default_str();
  app.add_option("--grace-ms", grace_ms, "time between SIGTERM and SIGKILL when stopping workers")
      ->check(between(0, 3600000))
      ->capture_default_str();
  app.add_option("--run-id", options.run_id, "names the job in the store [default: $TINYDDP_RUN_ID or 'default']");
  app.add_option("--timeout", timeout_s,
                 "seconds any wait may last (rendezvous, collectives): sets TINYDDP_TIMEOUT "
                 "for the workers [default: $TINYDDP_TIMEOUT or 300]")
      ->check(CLI::PositiveNumber);
  app.add_option("--prefix", output.prefix,
                 "what each printed line starts with: {rank}, {local_rank} and {node} are "
                 "filled in; '' for none")
      ->capture_default_str();
  app.add_option("--print-ranks", print_ranks,
                 "whose standard output is printed: all, or ranks and ranges (0 or "
                 "0,4-7); every rank's standard error always is")
      ->capture_default_str();
  app.add_option("--log-dir", output.log_dir,
                 "also write every rank's whole output, unprefixed, to "
                 "DIR/rank<N>.stdout and DIR/rank<N>.stderr");
  app.add_option("--explain", explain_dir, "read the flight records in this directory, say which rank lags, and exit");
  // Everything from the program's name on belongs to the program, options included.
  app.prefix_command();
  if (auto code = tinyddp::command_line::parse(app, argc, argv)) return *code;
  options.bind_cpus = cpu_bind == "auto";
  if (!explain_dir.empty()) {
    try {
      std::cout << format_explanation(explain_flight_records(explain_dir));
      return 0;
    } catch (const tinyddp::Error& e) {
      std::cerr << e.what() << std::endl;
      return tinyddp::command_line::kFailed;
    }
  }
  if (timeout_s > 0) setenv("TINYDDP_TIMEOUT", std::to_string(timeout_s).c_str(), 1);
  options.program = app.remaining();
  const bool separated = !options.program.empty() && options.program.front() == "--";
  if (separated) options.program.erase(options.program.begin());
  // Without "--", a word that starts with '-' where the program should be is a flag tinyddp-run does
  // not know (a program named "-x" is started as `tinyddp-run -- -x`).
  if (!separated && !options.program.empty() && options.program.front().starts_with("-"))
    return tinyddp::command_line::usage_error(app, "unknown flag " + options.program.front());
  if (options.program.empty()) return tinyddp::command_line::usage_error(app, "no program to start");
  if (options.node_rank >= options.nnodes)
    return tinyddp::command_line::usage_error(app, "--node-rank " + std::to_string(options.node_rank) +
                                                       " is not below --nnodes " + std::to_string(options.nnodes));
  options.grace = std::chrono::milliseconds(grace_ms);
  try {
    output.print_ranks = parse_rank_list(print_ranks, options.nnodes * options.nproc_per_node);
    options.output = WorkerOutput(output, options.nproc_per_node, options.node_rank);
  } catch (const tinyddp::Error& e) {  // the message names the flag and has its own hint
    std::cerr << "tinyddp-run: " << e.message() << std::endl;
    return tinyddp::command_line::kUsageError;
  }
  signal(SIGPIPE, SIG_IGN);
  try {
    // A job this host cannot hold is refused before any worker starts (comm/transport/shm_budget.h).
    const std::string does_not_fit = job_does_not_fit(estimate_job(options.nproc_per_node, configured_fifo_bytes(),
                                                                   tuning::kWorkerRamBytes),
                                                      read_host_capacity());
    if (!does_not_fit.empty()) {
      std::cerr << "tinyddp-run: " << does_not_fit << std::endl;
      return 1;
    }
    Launcher launcher(options);
    g_launcher = &launcher;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGTERM, &action, nullptr);
    LaunchResult result = launcher.run();
    g_launcher = nullptr;
    std::cerr << "tinyddp-run: " << result.summary << std::endl;
    return result.exit_code;
  } catch (const tinyddp::Error& e) {
    std::cerr << e.what() << std::endl;
    return tinyddp::command_line::kFailed;
  }
}
