// PerfCollective: what one benchmark program (all_reduce_perf, all_gather_perf, ...) knows about its
// collective. Everything else (flags, timing, checking, the table, JSON, CSV) is shared: see
// perf_main.h.
//
// Sizes follow nccl-tests (its src/<collective>.cu): for a row of S bytes, `count` = S / element
// size elements, and the collective's buffer counts come from it. Collectives that split a buffer
// among the ranks round each rank's part down to 16 bytes, as nccl-tests does, so the sizes in the
// table are the same as nccl-tests prints for the same flags. algbw = size / time, and busbw =
// algbw x bus_factor(world), the factors of nccl-tests' doc/PERFORMANCE.md: the bytes each rank
// must move through its link in an optimal algorithm, relative to the size, so that busbw compares
// across world sizes and with the link's own speed.
#pragma once

#include <cstddef>
#include <string>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/tensor.h"
#include "bench/perf/test_values.h"

namespace tinyddp::bench {

// Per-rank element counts of one row (nccl-tests' getCollByteCount).
struct CollectiveCounts {
  size_t send = 0;           // elements in the send buffer
  size_t recv = 0;           // elements in the receive buffer
  size_t param = 0;          // the count passed to the collective (per rank), printed as "count"
  size_t send_in_place = 0;  // in place, the input starts at recv + rank * send_in_place
  size_t recv_in_place = 0;  // in place, the output starts at send + rank * recv_in_place
};

// A rank's part of a buffer of `count` elements split among `world` ranks, rounded down to 16 bytes
// as nccl-tests rounds it (all_gather, reduce_scatter).
inline size_t part_per_rank(size_t count, size_t element_size, int world) {
  return (count / size_t(world)) & ~(16 / element_size - 1);
}

// The buffers of one placement: out of place, input in `send` and output in `recv`; in place, the
// input and the output are windows of one buffer (which one depends on the collective).
struct Placement {
  Tensor input;
  Tensor output;
  bool in_place = false;
};

class PerfCollective {
 public:
  virtual ~PerfCollective() = default;

  virtual std::string name() const = 0;  // "all_reduce"
  virtual bool reduces() const = 0;      // takes -o; otherwise the redop column says "none"
  virtual bool has_root() const = 0;     // takes -r; otherwise the root column says -1
  virtual bool has_out_of_place() const { return true; }
  // Whether any placement reads the send buffer (else it is not allocated).
  virtual bool needs_send_buffer() const { return true; }
  // The factor from algbw to busbw for `world` ranks (doc/PERFORMANCE.md).
  virtual double bus_factor(int world) const = 0;
  virtual std::string bus_factor_formula() const = 0;  // "2(n-1)/n", for --help
  virtual CollectiveCounts counts(size_t count, size_t element_size, int world) const = 0;

  // Where the input and output of a row lie in the two buffers (each at least counts.send /
  // counts.recv elements long).
  virtual Placement place(const Tensor& send, const Tensor& recv, const CollectiveCounts& counts, bool in_place,
                          int rank) const = 0;
  // `call`: blocking for -z 1 (the call returns once the collective is done, as MPI's do).
  virtual comm::WorkPtr launch(comm::ProcessGroup& pg, const Placement& p, comm::ReduceOp op, int root,
                               const comm::CallOptions& call = {}) const = 0;

  // Rank `rank`'s input element j, and its output element i once the collective has run.
  virtual double input_value(const TestValues& v, int rank, int root, size_t j) const = 0;
  virtual double expected_value(const TestValues& v, DType dtype, int rank, int root, const CollectiveCounts& counts,
                                size_t i) const = 0;
  // Whether this rank provides an input at all (broadcast: only the root).
  virtual bool has_input(int rank, int root) const {
    (void)rank;
    (void)root;
    return true;
  }

  std::string program() const { return name() + "_perf"; }
};

// The collectives the library has (one file each beside this one).
const PerfCollective& all_reduce_collective();
const PerfCollective& all_gather_collective();
const PerfCollective& reduce_scatter_collective();
const PerfCollective& broadcast_collective();

}  // namespace tinyddp::bench
