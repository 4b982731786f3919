// store_bench: how many store operations per second the TCP store serves, and how long each takes.
//
//   store_bench --clients 64 --ops 10000            # an in-process server on a free loopback port
//   store_bench --host 10.0.0.1 --port 29500        # an existing tinyddp-store (TINYDDP_TOKEN if it has one)
//
// Each client is a thread with its own TcpStore connection, doing --ops operations in the cycle
// set, get, add, wait (on a key it has set, so the wait returns at once: this measures the server's
// round trip, not anyone's patience). At the end it checks the results: the shared counter must equal
// the number of adds, and every get must have returned the value set before it. Exit status 1 if not.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "tinyddp/comm/store/store_server.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/command_line.h"
#include "tinyddp/core/error.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace tinyddp::comm;

const char* kOpNames[] = {"set", "get", "add", "wait"};

// Every client here is a whole TcpStore in this one process: its socket, plus the epoll, eventfd and
// timerfd of its own event loop, and the server's end of the connection: 5 descriptors a client. A
// real job spreads the clients over processes (the server holds one descriptor per client), so a
// default limit of 1024 would refuse a bench of 256 clients that a real store serves easily: raise
// the soft limit as far as the hard one allows, and say so when even that is too few.
void make_room_for_descriptors(int clients) {
  const rlim_t wanted = rlim_t(clients) * 5 + 64;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min(wanted, limit.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur < wanted)
    std::fprintf(stderr,
                 "store_bench: %d clients in one process need about %llu open files, but the hard limit is %llu;"
                 " hint: raise it (ulimit -Hn) or run fewer clients\n",
                 clients, (unsigned long long)wanted, (unsigned long long)limit.rlim_max);
}

double percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t index = std::min(sorted.size() - 1, size_t(p * double(sorted.size() - 1) + 0.5));
  return sorted[index];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"store_bench: throughput and latency of the tinyddp TCP store"};
  int clients = 64, ops = 10000, value_bytes = 64, port = 0;
  std::string host = "127.0.0.1";
  app.add_option("-c,--clients", clients, "concurrent clients (threads, one connection each)")->capture_default_str();
  app.add_option("-n,--ops", ops, "operations per client")->capture_default_str();
  app.add_option("--value-bytes", value_bytes, "size of each value set")->capture_default_str();
  app.add_option("--host", host, "store address")->capture_default_str();
  app.add_option("--port", port, "store port (0: start a server in this process)")->capture_default_str();
  if (auto code = tinyddp::command_line::parse(app, argc, argv)) return *code;
  make_room_for_descriptors(clients);

  try {
    std::unique_ptr<StoreServer> server;
    if (port == 0) {
      StoreServerOptions options;
      options.host = host;
      server = std::make_unique<StoreServer>(options);
      port = server->port();
    }
    TcpStoreOptions options;
    options.timeout = std::chrono::seconds(60);
    std::vector<std::unique_ptr<TcpStore>> stores;
    for (int c = 0; c < clients; ++c) stores.push_back(std::make_unique<TcpStore>(host, port, false, options));
    std::string run = "bench/" + std::to_string(Clock::now().time_since_epoch().count());
    stores[0]->set(run + "/counter", "0");

    // latencies[client][op kind] in microseconds
    std::vector<std::vector<std::vector<double>>> latencies(clients, std::vector<std::vector<double>>(4));
    std::atomic<int64_t> wrong_gets{0}, adds{0};
    std::latch ready(clients + 1);
    std::latch go(1);
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        TcpStore& store = *stores[c];
        std::string key = run + "/client/" + std::to_string(c);
        std::string value(size_t(value_bytes), char('a' + c % 26));
        for (auto& l : latencies[c]) l.reserve(size_t(ops / 4 + 1));
        ready.count_down();
        go.wait();
        for (int i = 0; i < ops; ++i) {
          int kind = i % 4;
          auto start = Clock::now();
          switch (kind) {
            case 0: value[0] = char('A' + (i / 4) % 26), store.set(key, value); break;
            case 1: wrong_gets += store.get(key) != value; break;
            case 2: store.add(run + "/counter", 1), adds++; break;
            case 3: store.wait({key}, std::chrono::seconds(10)); break;
          }
          latencies[c][kind].push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
        }
      });
    ready.count_down();
    ready.wait();
    auto start = Clock::now();
    go.count_down();
    for (auto& t : threads) t.join();
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();

    int64_t counter = std::stoll(stores[0]->get(run + "/counter"));
    std::printf("store_bench: %d clients x %d ops (%d-byte values) against %s:%d%s\n", clients, ops, value_bytes,
                host.c_str(), port, server ? " (in-process server)" : "");
    std::printf("%-6s %12s %10s %10s %10s\n", "op", "count", "p50 us", "p99 us", "max us");
    std::vector<double> all;
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<double> these;
      for (auto& per_client : latencies) these.insert(these.end(), per_client[kind].begin(), per_client[kind].end());
      std::sort(these.begin(), these.end());
      std::printf("%-6s %12zu %10.1f %10.1f %10.1f\n", kOpNames[kind], these.size(), percentile(these, 0.5),
                  percentile(these, 0.99), these.empty() ? 0.0 : these.back());
      all.insert(all.end(), these.begin(), these.end());
    }
    std::sort(all.begin(), all.end());
    std::printf("%-6s %12zu %10.1f %10.1f %10.1f\n", "all", all.size(), percentile(all, 0.5), percentile(all, 0.99),
                all.empty() ? 0.0 : all.back());
    std::printf("throughput: %.0f ops/s over %.2f s\n", double(all.size()) / seconds, seconds);
    bool correct = counter == adds.load() && wrong_gets.load() == 0;
    std::printf("check: counter %lld, adds %lld, wrong gets %lld: %s\n", (long long)counter, (long long)adds.load(),
                (long long)wrong_gets.load(), correct ? "correct" : "WRONG");
    return correct ? 0 : 1;
  } catch (const tinyddp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
