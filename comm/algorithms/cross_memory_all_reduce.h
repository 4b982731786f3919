// All-reduce of ordinary buffers (a user's own tensors) among the ranks of one host, each byte read
// out of its owner's buffer once and each result written into it once, by the kernel:
// process_vm_readv and process_vm_writev ("cross memory attach", what Open MPI's vader transport uses
// for large messages).
//
// The schedule is the symmetric two-shot's (symmetric_all_reduce.h) with the peers' buffers reached
// through the kernel instead of a mapping: every rank publishes its buffer's address with its arrival
// on a small symmetric control buffer; rank p reads slice p of every peer's buffer, a block at a time,
// into a cache-sized bounce buffer and adds it into its own (the ring's fold order, so the ring's
// bits), then writes that finished block into every peer's buffer while it is still in this core's
// cache (one copy, no FIFO); a barrier, after which nobody reads or writes its buffer any more. Per
// rank: (n-1)/n of S read into the bounce and added, (n-1)/n of S written: the FIFO ring copies
// 3(n-1)/n of S. Reading the finished slices back after a second barrier would copy as many bytes,
// but from where the peers left them, and wait at one barrier more.
//
// It needs ptrace permission over the peers, the same for writing as for reading (same user;
// /proc/sys/kernel/yama/ptrace_scope 0, or no Yama): cross_memory_unreadable() asks, and the process
// group uses this path only when every rank of the host can read every other (comm/tuning.h says when
// it is chosen over the FIFO).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/collective_engine.h"

namespace tinyddp::comm {

class ShmTransport;
class SymmetricBuffer;

// `data`: this rank's `count` elements of ctx.dtype, reduced in place over every rank of the host;
// `pids`: every party's pid, by its position in `control`. When it throws (a peer died or failed, a
// timeout), a peer that is still in the collective may yet write its slice into `data`: the caller
// keeps that memory from any other use (HostBackend keeps the tensor until the process ends).
void cross_memory_all_reduce(SymmetricBuffer& control, const std::vector<int>& pids, std::byte* data, size_t count,
                             ShmTransport& shm, const CollectiveContext& ctx);

// "" when this process can read `bytes` bytes at `address` in process `pid` with process_vm_readv;
// else why not (with what /proc/sys/kernel/yama/ptrace_scope says, where there is one).
std::string cross_memory_unreadable(int pid, const void* address, size_t bytes);

}  // namespace tinyddp::comm
