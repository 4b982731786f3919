// ring_explain: the ring all-reduce, one step at a time, on a few CPU ranks (threads).
//
//   build/bin/ring_explain                     # 4 ranks, 9 floats each
//   build/bin/ring_explain --ranks 3 --count 7
//
// Each rank is a thread that calls the library's own comm::ring_all_reduce (comm/algorithms/ring.cpp),
// the function the "host" process group runs for large messages. Its connections are a
// LockstepTransport (lockstep_transport.h): in-memory queues that record every send and receive
// and hold the ranks to one step at a time. So the chunks printed are the ones the real code sent,
// and the buffers printed are the real buffers between steps. Rank r starts with (i+1)*10^r in
// element i: each decimal digit of a sum tells whose contribution it holds (1111 = all 4 ranks).
//
// At the end the result is checked against the closed form (i+1)*(1+10+...+10^(n-1)), the observed
// schedule against the chunk formula of comm/chunks.h, and the same inputs are all-reduced once
// more through a real "host" ProcessGroup (shared memory between threads), and once through the
// textbook step loop of textbook_ring.h (read it first: it is the algorithm without the engine's
// optimisations); both must agree.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/comm/algorithms/ring.h"
#include "tinyddp/comm/chunks.h"
#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/comm/work.h"
#include "tinyddp/core/command_line.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/tensor.h"
#include "lockstep_transport.h"
#include "textbook_ring.h"

using namespace tinyddp;
using examples::LockstepConnection;
using examples::LockstepNetwork;
using examples::LockstepTransport;
using examples::StepRecord;

namespace {

using comm::chunk_begin;  // how the ring cuts `count` elements into `parts` chunks (comm/chunks.h)

// The chunk that an observed element offset falls in.
int chunk_of(size_t element, size_t count, int parts) {
  int c = 0;
  while (c + 1 < parts && chunk_begin(count, parts, c + 1) <= element) ++c;
  return c;
}
int wrap(int i, int n) { return ((i % n) + n) % n; }

// "| 1 2 3 | 4 5 | ..." with a bar between chunks.
std::string show(const std::vector<float>& buffer, int parts) {
  std::string text;
  int chunk = -1;
  for (size_t i = 0; i < buffer.size(); ++i) {
    int c = chunk_of(i, buffer.size(), parts);
    if (c != chunk) {
      text += "| ";
      chunk = c;
    }
    char number[32];
    std::snprintf(number, sizeof number, "%5.0f ", double(buffer[i]));
    text += number;
  }
  return text + "|";
}

float initial_value(int rank, size_t i) {
  float power = 1;
  for (int k = 0; k < rank; ++k) power *= 10;
  return float(i + 1) * power;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ring_explain: the library's ring all-reduce, step by step, on CPU threads", "ring_explain"};
  int ranks = 4;
  size_t count = 9;
  app.add_option("--ranks", ranks, "ranks in the ring (threads)")
      ->check(command_line::between(2, 6))
      ->capture_default_str();
  app.add_option("--count", count, "floats per rank (at least --ranks, at most 9 so every digit stays a digit)")
      ->check(command_line::between<size_t>(2, 9))
      ->capture_default_str();
  if (auto code = command_line::parse(app, argc, argv)) return *code;
  if (count < size_t(ranks))
    return command_line::usage_error(app, "--count " + std::to_string(count) + " is smaller than --ranks " +
                                              std::to_string(ranks) + " (every chunk needs an element)");
  const int n = ranks;
  const int steps = 2 * (n - 1);

  std::vector<std::vector<float>> buffers(static_cast<size_t>(n), std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) buffers[size_t(r)][i] = initial_value(r, i);
  const auto inputs = buffers;

  std::printf("A ring of %d ranks: ", n);
  for (int r = 0; r < n; ++r) std::printf("%d -> ", r);
  std::printf("0. Each rank holds %zu floats, cut into %d chunks:", count, n);
  for (int c = 0; c < n; ++c)
    std::printf(" chunk %d = [%zu, %zu)%s", c, chunk_begin(count, n, c), chunk_begin(count, n, c + 1),
                c + 1 < n ? "," : ".\n");
  std::printf("Rank r starts with (i+1)*10^r in element i, so each digit of a sum says which ranks it holds.\n\n");
  std::printf("start\n");
  for (int r = 0; r < n; ++r) std::printf("  rank %d  %s\n", r, show(buffers[size_t(r)], n).c_str());

  std::vector<const std::byte*> bases;
  for (auto& b : buffers) bases.push_back(reinterpret_cast<const std::byte*>(b.data()));
  std::vector<std::vector<float>> before = buffers;
  bool consistent = true;  // what the transport saw matches the buffers and the documented schedule
  std::vector<size_t> sent_elements(size_t(n), 0);
  LockstepNetwork* network_ptr = nullptr;

  // Runs with every rank held between two steps: print what each rank did, then the buffers.
  auto on_step = [&](int step) {
    const auto& record = network_ptr->records()[size_t(step)];
    bool gather = step >= n - 1;
    int phase_step = gather ? step - (n - 1) : step;
    std::printf("\n%s, step %d of %d\n", gather ? "all-gather" : "reduce-scatter", phase_step + 1, n - 1);
    for (int r = 0; r < n; ++r) {
      const StepRecord& s = record[size_t(r)];
      size_t sent_first = s.sent_offset / sizeof(float), sent_count = s.sent_bytes / sizeof(float);
      size_t got_first = s.received_offset / sizeof(float), got_count = s.received_bytes / sizeof(float);
      int sent_chunk = chunk_of(sent_first, count, n), got_chunk = chunk_of(got_first, count, n);
      int from = wrap(r - 1, n);
      sent_elements[size_t(r)] += sent_count;
      std::printf("  rank %d sends chunk %d to rank %d; receives chunk %d from rank %d and %s\n", r, sent_chunk,
                  wrap(r + 1, n), got_chunk, from, s.reduced ? "adds it to its own" : "copies it over its own");
      // The schedule ring.h documents: reduce-scatter step s sends chunk r-s and reduces
      // chunk r-s-1; all-gather step s sends chunk r+1-s and receives chunk r-s.
      int expect_send = gather ? wrap(r + 1 - phase_step, n) : wrap(r - phase_step, n);
      int expect_recv = gather ? wrap(r - phase_step, n) : wrap(r - phase_step - 1, n);
      bool whole_chunks = sent_first == chunk_begin(count, n, sent_chunk) &&
                          sent_first + sent_count == chunk_begin(count, n, sent_chunk + 1) &&
                          got_first == chunk_begin(count, n, got_chunk) &&
                          got_first + got_count == chunk_begin(count, n, got_chunk + 1);
      if (!s.sent || !s.received || !whole_chunks || sent_chunk != expect_send || got_chunk != expect_recv ||
          s.reduced == gather) {
        std::printf("  !! rank %d: expected to send chunk %d and %s chunk %d\n", r, expect_send,
                    gather ? "copy" : "add", expect_recv);
        consistent = false;
      }
      // The elements that changed in this rank's buffer must be exactly the chunk it received.
      for (size_t i = 0; i < count; ++i) {
        bool changed = buffers[size_t(r)][i] != before[size_t(r)][i];
        bool in_chunk = i >= got_first && i < got_first + got_count;
        if (changed != in_chunk) {
          std::printf("  !! rank %d: element %zu %s\n", r, i,
                      changed ? "changed outside the chunk received" : "did not change");
          consistent = false;
        }
      }
    }
    for (int r = 0; r < n; ++r) std::printf("  rank %d  %s\n", r, show(buffers[size_t(r)], n).c_str());
    before = buffers;
  };

  LockstepNetwork network(bases, on_step);
  network_ptr = &network;
  std::vector<std::unique_ptr<LockstepTransport>> transports;
  std::vector<std::unique_ptr<LockstepConnection>> to_next, from_prev;
  for (int r = 0; r < n; ++r) {
    transports.push_back(std::make_unique<LockstepTransport>(network));
    to_next.push_back(std::make_unique<LockstepConnection>(*transports.back(), network, r, wrap(r + 1, n)));
    from_prev.push_back(std::make_unique<LockstepConnection>(*transports.back(), network, r, wrap(r - 1, n)));
  }

  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  const comm::Work work("ring_explain all_reduce f32 sum");  // names the collective in errors
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        comm::Transport* mine = transports[size_t(r)].get();
        comm::CollectiveContext ctx;
        ctx.rank = r;
        ctx.work = &work;
        ctx.dtype = DType::f32;
        ctx.op = comm::ReduceOp::sum;
        ctx.world_size = n;
        ctx.timeout = std::chrono::seconds(20);
        ctx.deadline = std::chrono::steady_clock::now() + ctx.timeout;
        ctx.transports = {&mine, 1};
        comm::Ring ring{r, n, to_next[size_t(r)].get(), from_prev[size_t(r)].get()};
        auto* data = reinterpret_cast<std::byte*>(buffers[size_t(r)].data());
        comm::ring_all_reduce(ring, data, data, count, ctx);  // in place, as DDP reduces its buckets
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[size_t(r)].empty()) {
      std::fprintf(stderr, "ring_explain: rank %d failed: %s\n", r, errors[size_t(r)].c_str());
      return 1;
    }
  if (int(network.records().size()) != steps) {
    std::printf("!! the ring took %zu steps, not 2(n-1) = %d\n", network.records().size(), steps);
    consistent = false;
  }

  // The closed form: element i of the sum is (i+1) * 11...1 (n ones).
  float ones = 0;
  for (int r = 0; r < n; ++r) ones += initial_value(r, 0);
  int wrong = 0;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) wrong += buffers[size_t(r)][i] != float(i + 1) * ones ? 1 : 0;
  std::printf("\nclosed form: element i = (i+1) * %.0f on every rank: %s\n", double(ones),
              wrong == 0 ? "all match" : (std::to_string(wrong) + " elements differ").c_str());

  // Traffic: every rank sent 2(n-1) chunks, 2(n-1)/n of its buffer (exactly so when n divides count).
  std::printf("traffic: each rank sent");
  for (int r = 0; r < n; ++r) std::printf(" %zu", sent_elements[size_t(r)]);
  std::printf(" elements (rank 0 .. %d); 2(n-1)/n x %zu = %.1f. That is why busbw = algbw x 2(n-1)/n.\n", n - 1, count,
              2.0 * (n - 1) / n * double(count));
  std::printf("schedule: %s\n", consistent ? "every send and receive matched ring.h (rank r sends chunk "
                                             "r-s in reduce-scatter step s, chunk r+1-s in all-gather step s)"
                                           : "MISMATCH (see the lines marked !!)");

  // The same inputs through a real "host" process group over shared memory; small_message_bytes = 0
  // makes it take the ring even for these few bytes (by default it would use the direct exchange).
  auto store = std::make_shared<comm::HashStore>();
  store->set_timeout(std::chrono::seconds(20));
  comm::ProcessGroupOptions options;
  options.small_message_bytes = 0;
  options.timeout = std::chrono::seconds(20);
  options.token = "";
  std::vector<std::vector<float>> via_group(static_cast<size_t>(n));
  threads.clear();
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto group = comm::create_process_group("host", store, r, n, options);
        Tensor t = Tensor::from_vector(inputs[size_t(r)]);
        group->all_reduce(t)->wait();
        via_group[size_t(r)] = t.to_vector<float>();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!errors[size_t(r)].empty()) {
      std::fprintf(stderr, "ring_explain: rank %d of the process group failed: %s\n", r, errors[size_t(r)].c_str());
      return 1;
    }
  bool same = via_group == buffers;
  std::printf("ProcessGroup(\"host\").all_reduce of the same inputs: %s\n",
              same ? "the same result on every rank" : "DIFFERENT");
  std::vector<std::vector<float>> textbook = inputs;
  examples::textbook_ring_all_reduce(textbook);
  bool same_as_textbook = textbook == buffers;
  std::printf("the textbook step loop (textbook_ring.h) on the same inputs: %s\n",
              same_as_textbook ? "the same result on every rank" : "DIFFERENT");
  return wrong == 0 && consistent && same && same_as_textbook ? 0 : 1;
}
