// Fingerprint: what a collective call is, in 24 bytes (which collective, the call's sequence
// number, dtype, element count, op, root). Every collective of both backends describes itself with
// one before it is queued: the Work's description, the flight recorder's records and the
// watchdog's messages are made from it.
//
// It is also what the TINYDDP_DEBUG=DETAIL check (TORCH_DISTRIBUTED_DEBUG=DETAIL's fingerprints)
// compares. A rank that calls all_reduce while another calls broadcast, or all_reduce on 1000
// floats while another passes 999, usually hangs or, worse, returns garbage. With DETAIL every
// collective first gathers the fingerprint from every rank and, when they differ, every rank
// raises the same error listing which ranks called what. It costs one extra small round per
// collective.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/core/tensor.h"

namespace tinyddp::comm {

enum class CollectiveKind : uint8_t {
  all_reduce,
  broadcast,
  all_gather,
  reduce_scatter,
  barrier,
  all_reduce_single_rounding,
  reduce_scatter_single_rounding,
};
const char* collective_kind_name(CollectiveKind kind);

// Fixed-size and trivially copyable: it travels as raw bytes.
struct Fingerprint {
  uint64_t sequence = 0;  // how many collectives this group ran before this one
  int64_t count = 0;      // elements per rank
  int32_t root = -1;      // broadcast's root, else -1
  uint8_t kind = 0;       // CollectiveKind
  uint8_t op = 0;         // ReduceOp (reductions only)
  uint8_t dtype = 0;      // DType
  uint8_t reduces = 0;    // 1 when op is meaningful
};
static_assert(sizeof(Fingerprint) == 24);

// What a call is, as both backends describe it before they queue it: `count` elements per rank of
// `t`'s dtype (i32 for a barrier's undefined tensor), `op` for reductions, `root` for a broadcast.
// The sequence number is the backend's to fill in.
Fingerprint make_fingerprint(CollectiveKind kind, const Tensor& t, int64_t count, std::optional<ReduceOp> op,
                             int root = -1);

// "all_reduce #5 f32 x1024 sum"
std::string describe_fingerprint(const Fingerprint& f);

// "" when every rank's fingerprint agrees; else a message naming the ranks, what each called and
// which fields differ, ending with a hint.
std::string fingerprint_mismatch(std::span<const Fingerprint> by_rank);

// True when TINYDDP_DEBUG says DETAIL (core/log.h reads it).
bool debug_detail_from_environment();

}  // namespace tinyddp::comm
