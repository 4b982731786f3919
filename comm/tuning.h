// Tuning: every number the collective runtime was tuned with, in one place.
//
// The code that uses a constant says what the knob does; this file says what it is set to and why,
// and links the section of docs/results.md where the measurement that chose it is
// written up. They were chosen on the 2-core reference host (loopback TCP, one shared L3): on
// another machine, measure before changing one (bench/all_reduce_perf side by side with the build
// before, alternating runs). Where an environment variable overrides a constant, it is there for
// such measurements.
#pragma once

#include <chrono>
#include <cstddef>

namespace tinyddp::comm::tuning {

using namespace std::chrono_literals;

// ---- which algorithm ----------------------------------------------------------------------------
// ../docs/results.md#small-message-algorithm-or-ring-the-crossover

// All-reduces up to this size take the one-round direct exchange instead of the ring: below it the
// ring's 2(n-1) dependent steps cost more than the direct exchange's n-1 times the bytes.
// (TINYDDP_SMALL_MESSAGE_BYTES, ProcessGroupOptions::small_message_bytes.)
inline constexpr size_t kSmallMessageBytes = 32 << 10;
// Two ranks over tcp: there both algorithms send each rank's buffer once, and the direct exchange
// does it in one step instead of two dependent ones.
inline constexpr size_t kSmallMessageBytesTcpPair = 512 << 10;

// ---- the blocking caller (comm/executor.h) ---------------------------------------------------------
// ../docs/results.md#blocking-callers

// Collectives up to this size (and up to the small-message size) may run on a waiting caller's own
// thread: above it the thread hand-off is small beside the transfer, and a collective nobody waits
// for must start at once (TINYDDP_BLOCKING_CALLER_BYTES, to measure another).
inline constexpr size_t kBlockingCallerBytes = 64 << 10;
// The same for an all-reduce of symmetric memory (algorithms/symmetric_all_reduce.h): it has no
// fifo to keep fed, so the thread hand-off costs as much as the reduction itself up to megabytes,
// and a blocking caller runs it on its own thread at any size up to this one.
inline constexpr size_t kBlockingCallerSymmetricBytes = 64 << 20;
// Small collectives, each awaited before the next call, before a caller counts as blocking.
inline constexpr int kBlockingStreak = 3;
// How often the sleeping thread looks for a blocking caller's collective that nobody came to wait
// for: it takes one that waited a whole period, so such a collective starts within two.
inline constexpr auto kBlockingCallerPoll = 200us;
// After this long without a collective the thread stops looking and sleeps until woken.
inline constexpr auto kBlockingCallerIdle = 20ms;

// ---- bytes per turn (Connection::bytes_per_turn) ---------------------------------------------------
// ../docs/results.md#bytes-per-turn

// The default: small enough that the piece just reduced is still in L1/L2 when it is sent on,
// large enough to amortise the calls. Shared memory keeps it while ranks share cores.
inline constexpr size_t kBytesPerTurn = 128 << 10;
// tcp: a receiver thread drains the socket whatever the engine does, so the engine need not come
// back to receiving often, and every turn costs a send() and a pass through its loop.
inline constexpr size_t kBytesPerTurnTcp = 1 << 20;
// Shared memory while every rank of the host has a core of its own: fewer, longer turns.
inline constexpr size_t kBytesPerTurnShmOwnCores = 1 << 20;

// ---- waiting (comm/wait_policy.h) -------------------------------------------------------------------
// ../docs/results.md#waiting-spin-yield-sleep

// How long a blocked thread spins before it sleeps: a loopback round trip is 10-30 us, and the
// answer usually comes sooner than a sleeping thread is woken.
inline constexpr auto kSpinBudget = 50us;
// The spin when ranks outnumber cores: every retry then yields the core, so the rank being waited
// for gets to run, and spinning on costs less than a futex wake-up per hand-off.
inline constexpr auto kSpinBudgetOversubscribed = 500us;
// ../docs/results.md#waits-that-look-once-per-pause-and-yield-only-to-a-peer-that-may-share-the-cpu
// How long a wait spins without yielding before, where a peer may share the core, it starts to
// yield between looks. While every rank of the host can have a core, a peer rarely shares this one,
// and a yield only delays seeing it: 15 us is what the waits spun before yielding when these values
// were measured (32 looks of 16 pauses on Zen 4); yielding after 1 us made 2 unbound ranks' 64 KiB
// all-reduce 2.7x slower.
inline constexpr auto kPureSpin = 15us;
// The same when the ranks of the host outnumber its cores: a rank it waits for shares the core, and
// needs it handed over soon (4 ranks on 2 cores: 1.1-3.7x faster calls than with 15 us).
inline constexpr auto kPureSpinOversubscribed = 1us;
// The longest sleep, and so the cadence of the liveness checks and of retries: loopback TCP now
// and then stalls until a retransmission timer fires (~10 ms), and a retry ends that stall sooner.
inline constexpr auto kSleepSlice = 1000us;
// The sleep on each transport when a collective waits on two (shm and tcp): neither can wake the
// thread out of the other's sleep.
inline constexpr auto kMixedSleepSlice = 500us;
// The longest a Work::wait spins before it sleeps: while it spins it takes a core from the thread
// that runs the collective.
inline constexpr auto kWorkWaitSpin = 5us;

// ---- buffer sizes -----------------------------------------------------------------------------------
// ../docs/results.md#buffer-sizes

// Each shared-memory fifo: half an L2 of the reference host, so a fifo being filled and drained stays
// in cache (TINYDDP_SHM_FIFO_BYTES, ProcessGroupOptions::shm_fifo_bytes).
inline constexpr size_t kShmFifoBytes = 1 << 20;
// The fifo to a local peer that is not a ring neighbour (the small-message exchanges' partners): a
// bounded window, so that a rank's /dev/shm grows with the number of peers it talks to by 64 KiB,
// not by a whole fifo. It holds two default small messages (kSmallMessageBytes) and is the smallest
// fifo that still keeps streams aligned in a page (Connection::align_send).
// ../docs/results.md#memory-per-rank-devshm-and-rss-against-the-world-size
inline constexpr size_t kShmWindowFifoBytes = 64 << 10;
// A worker's own memory besides its fifos, for the estimate that refuses a job too large for the host
// (shm_budget.h): an all_reduce_perf rank's peak RSS without its shared memory is 6.5-7.3 MiB at
// 2-64 ranks; the rest leaves room for a small program's own data.
// ../docs/results.md#memory-per-rank-devshm-and-rss-against-the-world-size
inline constexpr size_t kWorkerRamBytes = 16 << 20;
// The tcp receiver thread's inbox: room for the peer to run ahead by a few turns.
inline constexpr size_t kTcpInboxBytes = 4 << 20;
// At most this much per recv() into the inbox, so that a receive posted meanwhile takes over soon.
inline constexpr size_t kTcpInboxChunk = 256 << 10;
// Posted receives (Connection::post_recv) shorter than this are copied out of the inbox instead:
// a copy of a few hundred KiB costs less than the bookkeeping.
inline constexpr size_t kTcpPostBytes = 1 << 20;
// The direct exchange's gathered inputs are kept between calls up to this size: every default direct
// exchange fits (2 ranks x 512 KiB over tcp, up to 128 ranks x 32 KiB).
inline constexpr size_t kDirectExchangeKeptBytes = 4 << 20;

// ---- symmetric memory (algorithms/symmetric_all_reduce.h) -------------------------------------------
// ../docs/results.md (2026-11-26, symmetric memory)

// A rank reduces its slice of a symmetric buffer this many bytes at a time, every peer's block in
// turn: the partial sum (one block) stays in L2 between the peers' passes, so with n > 2 ranks it is
// read and written once per block, not once per peer from memory. Zen 3's L2 is 512 KiB.
inline constexpr size_t kSymmetricReduceBlockBytes = 64 << 10;

// The most bytes one small all-reduce takes through the slots (algorithms/slot_all_reduce.h): each
// rank holds two slots of this size, or of the small-message size if that is smaller. Raising the
// small-message size past it leaves the messages in between to the direct exchange.
inline constexpr size_t kSlotBytes = 256 << 10;

// ---- ordinary buffers inside a host: the FIFOs, staging, or one copy through the kernel -------------
// (algorithms/staged_all_reduce.h, algorithms/cross_memory_all_reduce.h; TINYDDP_STAGING=0|1 and
// TINYDDP_CROSS_MEMORY=0|1 override the choice, to measure it)

// process_vm_readv reads a peer's slice into a bounce buffer of this size before it is added: small
// enough to stay in L2 while it is added, large enough that the system call and the pinning of the
// peer's pages are paid for few bytes.
inline constexpr size_t kCrossMemoryBlockBytes = 256 << 10;
// All-reduces of ordinary CPU tensors at least this large, with every rank on one host, may take the
// cross-memory path when every rank may read the others; below it the direct exchange's one round
// over the fifos costs less than two barriers and the system calls. TINYDDP_CROSS_MEMORY=1 takes the
// path from this size, to measure it.
inline constexpr size_t kCrossMemoryAllReduceBytes = 64 << 10;
// Of the three ways a large ordinary tensor can go (the fifos; staging into symmetric memory;
// process_vm_readv/writev): staged from kStagedAllReduceBytes, through the kernel from
// kCrossMemoryDefaultBytes where every rank may read the others, the fifos only where neither is
// open to the group (or TINYDDP_STAGING=0 and TINYDDP_CROSS_MEMORY=0 ask for them). Each rank copies
// 3(n-1)/n of the tensor and adds (n-1)/n over the fifos and staged alike, but staged it does so in
// two barriers a window and no fifo hand-offs; through the kernel it copies 2(n-1)/n, after the kernel
// pins the peer's pages (one pin per 2 MiB on the allocator's huge pages, core/allocator.h), and
// writes each reduced block back to the peers while it is still in cache.
// Measured with bench/compare_symmetric.sh on the 2-core Intel Xeon (docs/results.md:
// "Ordinary tensors staged in one pass" and "The kernel's copy writes back while the block is hot"): staged leads from
// 64 KiB to 256 KiB with 2 ranks and ties to 1 MiB; from 2 MiB the kernel's copy leads with 2 and 4 ranks, and out of
// every cache (64-256 MiB) the two tie.
inline constexpr bool kCrossMemoryByDefault = true;
inline constexpr size_t kCrossMemoryDefaultBytes = 2 << 20;
inline constexpr bool kStagingByDefault = true;
// All-reduces of ordinary tensors at least this large, with every rank on one host, are staged
// (below it the slots or the direct exchange take them).
inline constexpr size_t kStagedAllReduceBytes = 64 << 10;
// Each half of a rank's staging buffer: a round stages this much of the input. Large enough that
// the two barriers of a round are small beside its copies, small enough that a round's staged,
// pushed and gathered lines stay in L2 while the peers read them (measured against 64 KiB - 2 MiB,
// in the same section).
inline constexpr size_t kStagingHalfBytes = 256 << 10;

// ---- where a stream starts in a page (Connection::align_send) --------------------------------------
// ../docs/results.md#the-fifos-position-in-a-page-shm

// Streams of at least this many bytes start kStreamPhase bytes past a page boundary of a transport's
// buffer, so that a reduction's loads from there never trail its stores to the caller's buffer by a
// few dozen bytes modulo 4 KiB (4K aliasing).
inline constexpr size_t kAlignedStreamBytes = 64 << 10;
// Half a page from where large buffers start: far from that window (TINYDDP_STREAM_PHASE).
inline constexpr size_t kStreamPhase = 2048;

}  // namespace tinyddp::comm::tuning
