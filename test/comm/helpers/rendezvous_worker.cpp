// A worker for the launcher tests: joins its job by env:// (as a real training program would under
// tinyddp-run), checks that it sees every other rank through the store, and optionally fails.
//
//   test_rendezvous_worker [--fail-rank R --fail-code C --fail-on-restart K] [--throw-rank R]
//
// Prints "rank R of W joined (restart K, saw all W)" and exits 0, or exits C when it is rank R on
// restart K (after joining, so the others are left waiting and must be stopped by the launcher).
// --throw-rank R: rank R raises an error after joining, which it reports as a program should
// (report_failure_to_launcher: torchrun's error file), and exits 91.
#include <chrono>
#include <iostream>

#include <CLI/CLI.hpp>

#include "tinyddp/comm/launch/failure_report.h"
#include "tinyddp/comm/store/barrier.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/core/error.h"

int main(int argc, char** argv) {
  using namespace tinyddp::comm;
  CLI::App app{"test worker"};
  int fail_rank = -1, fail_code = 1, fail_on_restart = 0, throw_rank = -1;
  app.add_option("--fail-rank", fail_rank);
  app.add_option("--fail-code", fail_code);
  app.add_option("--fail-on-restart", fail_on_restart);
  app.add_option("--throw-rank", throw_rank);
  CLI11_PARSE(app, argc, argv);
  Rendezvous r;
  try {
    RendezvousOptions options;
    options.timeout = std::chrono::seconds(30);
    r = rendezvous("env://", options);
    int restart = read_launch_environment().restart_count;
    r.store->set("hello/" + std::to_string(r.rank), "1");
    StoreBarrier(*r.store, r.rank, r.world_size, "hello").arrive_and_wait();
    for (int i = 0; i < r.world_size; ++i)
      if (!r.store->check({"hello/" + std::to_string(i)})) return 90;
    std::cout << "rank " << r.rank << " of " << r.world_size << " joined (restart " << restart << ", saw all "
              << r.world_size << ")" << std::endl;
    if (r.rank == fail_rank && restart == fail_on_restart) return fail_code;
    TINYDDP_CHECK(r.rank != throw_rank, "deliberate failure of rank ", r.rank, " (--throw-rank)");
    StoreBarrier(*r.store, r.rank, r.world_size, "bye").arrive_and_wait();
    return 0;
  } catch (const tinyddp::Error& e) {
    std::cerr << e.what() << std::endl;
    report_failure_to_launcher(r.store.get(), r.rank, e.what());
    return 91;
  }
}
