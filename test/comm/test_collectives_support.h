// Helpers for the collective tests: threads acting as ranks over one HashStore, and the
// independent reference (a plain loop over every rank's input) the results are checked against.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/hash_store.h"

namespace tinyddp::testing {

// Runs body(rank) on `world` threads; rethrows the first exception any of them raised.
inline void run_ranks(int world, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// One process group per thread, all over one HashStore.
inline std::vector<std::shared_ptr<comm::ProcessGroup>> make_groups(int world, comm::ProcessGroupOptions options) {
  auto store = std::make_shared<comm::HashStore>();
  store->set_timeout(std::chrono::seconds(30));
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups(static_cast<size_t>(world));
  run_ranks(world, [&](int r) { groups[size_t(r)] = comm::create_process_group("host", store, r, world, options); });
  return groups;
}

// A group over shared memory only (every rank on this host), named `name`.
inline comm::ProcessGroupOptions shm_group(const std::string& name,
                                           std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  comm::ProcessGroupOptions options;
  options.transport = "shm";
  options.group_name = name;
  options.timeout = timeout;
  return options;
}

// Floats whose sum depends on the order of the additions (ranks differ by 10^7 in scale), different
// for every `call`: equal results of two implementations mean the same fold order.
inline Tensor order_sensitive_input(int rank, int64_t count, int call = 0) {
  Tensor t = Tensor::empty({count});
  for (int64_t i = 0; i < count; ++i)
    t.data<float>()[i] = float(1.0 + 1e-7 * double((i * 7919 + rank * 104729 + call * 31) % 1000003)) *
                         (rank % 2 ? 1e4f : 1e-3f);
  return t;
}

// A rank's input value at index i, chosen per op so every result is exact in every dtype:
// small integers for sum/avg, +-1 and 2 for prod (no overflow), a scrambled spread for max/min.
inline double input_value(comm::ReduceOp op, int rank, int64_t i) {
  switch (op) {
    case comm::ReduceOp::prod: {
      int k = int((rank + i) % 3);
      return k == 0 ? 2.0 : (k == 1 ? -1.0 : 1.0);
    }
    case comm::ReduceOp::max:
    case comm::ReduceOp::min: return double((rank * 37 + i * 11) % 101 - 50);
    default: return double((rank + 1) * ((i % 7) + 1) - 3);
  }
}

template <typename T>
Tensor make_input(comm::ReduceOp op, int rank, int64_t count) {
  std::vector<T> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[size_t(i)] = T(input_value(op, rank, i));
  return Tensor::from_vector(values, {count});
}

// The reference: fold every rank's input with a plain loop, in the tensor's own type.
template <typename T>
std::vector<T> reference_reduce(comm::ReduceOp op, int world, int64_t count) {
  std::vector<T> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    T acc = T(input_value(op, 0, i));
    for (int r = 1; r < world; ++r) {
      T x = T(input_value(op, r, i));
      switch (op) {
        case comm::ReduceOp::sum:
        case comm::ReduceOp::avg: acc = T(acc + x); break;
        case comm::ReduceOp::prod: acc = T(acc * x); break;
        case comm::ReduceOp::max: acc = acc < x ? x : acc; break;
        case comm::ReduceOp::min: acc = x < acc ? x : acc; break;
      }
    }
    if (op == comm::ReduceOp::avg) acc = T(acc / T(world));
    out[size_t(i)] = acc;
  }
  return out;
}

}  // namespace tinyddp::testing
