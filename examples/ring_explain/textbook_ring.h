// The ring all-reduce as a textbook writes it: the algorithm before its optimisations.
//
// n ranks stand in a ring; rank r sends only to rank r+1 and receives only from rank r-1. Each
// rank's buffer is cut into n chunks, and the all-reduce is 2(n-1) steps in which every rank sends
// one chunk and receives one:
//
//   reduce-scatter, steps 0 .. n-2: rank r sends chunk r-s and adds the chunk r-s-1 it receives
//                                   into its own; then rank r holds chunk r+1 summed over all ranks;
//   all-gather,     steps 0 .. n-2: rank r sends chunk r+1-s and copies the chunk r-s it receives.
//
// Here every rank's buffer lives in one process and a step is one pass over the ranks: first each
// rank puts its chunk "on the wire", then each takes the chunk its left neighbour sent. The library's
// engine (comm/algorithms/ring.cpp) runs exactly this schedule, but pipelined: no rank
// waits for a whole step, and a piece of a chunk moves on as soon as it has been added. Since every
// element is added in the same order either way, the results are the same to the last bit
// (test/examples/test_ring_explain.cpp checks it against the real "host" process group).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "tinyddp/comm/chunks.h"

namespace tinyddp::examples {

// buffers[r] is rank r's buffer; afterwards every rank's buffer holds the element-wise sum.
template <typename T>
void textbook_ring_all_reduce(std::vector<std::vector<T>>& buffers) {
  const int n = int(buffers.size());
  const size_t count = buffers[0].size();
  // Chunk c of the buffer: the first count % n chunks get one element more (the engine's cut).
  auto begin = [&](int c) { return comm::chunk_begin(count, n, c); };
  auto chunk = [&](int r, int c) {
    c = ((c % n) + n) % n;
    return std::span<T>(buffers[size_t(r)]).subspan(begin(c), begin(c + 1) - begin(c));
  };
  std::vector<std::vector<T>> wire(buffers.size());  // what each rank sent in this step
  for (int step = 0; step < 2 * (n - 1); ++step) {
    const bool reduce = step < n - 1;  // reduce-scatter first, then all-gather
    const int s = reduce ? step : step - (n - 1);
    for (int r = 0; r < n; ++r) {  // every rank sends one chunk to rank r+1
      auto out = chunk(r, reduce ? r - s : r + 1 - s);
      wire[size_t(r)].assign(out.begin(), out.end());
    }
    for (int r = 0; r < n; ++r) {  // and receives the one rank r-1 sent
      const std::vector<T>& in = wire[size_t((r + n - 1) % n)];
      auto mine = chunk(r, reduce ? r - s - 1 : r - s);
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = reduce ? mine[i] + in[i] : in[i];
    }
  }
}

}  // namespace tinyddp::examples
