#include "tinyddp/comm/fingerprint.h"

#include <map>
#include <tuple>
#include <vector>

#include "tinyddp/core/dtype.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::all_reduce_single_rounding: return "all_reduce_single_rounding";
    case CollectiveKind::reduce_scatter_single_rounding: return "reduce_scatter_single_rounding";
  }
  return "?";
}

Fingerprint make_fingerprint(CollectiveKind kind, const Tensor& t, int64_t count, std::optional<ReduceOp> op,
                             int root) {
  Fingerprint f;
  f.kind = uint8_t(kind);
  f.dtype = uint8_t(t.defined() ? t.dtype() : DType::i32);
  f.count = count;
  f.reduces = op.has_value();
  f.op = uint8_t(op.value_or(ReduceOp::sum));
  f.root = root;
  return f;
}

std::string describe_fingerprint(const Fingerprint& f) {
  std::string text = std::string(collective_kind_name(CollectiveKind(f.kind))) + " #" + std::to_string(f.sequence) +
                     " " + dtype_name(DType(f.dtype)) + " x" + std::to_string(f.count);
  if (f.reduces) text += std::string(" ") + reduce_op_name(ReduceOp(f.op));
  if (f.root >= 0) text += " root " + std::to_string(f.root);
  return text;
}

namespace {
auto key(const Fingerprint& f) {
  return std::make_tuple(f.sequence, f.kind, f.dtype, f.count, f.reduces, f.op, f.root);
}
}  // namespace

std::string fingerprint_mismatch(std::span<const Fingerprint> by_rank) {
  // Group the ranks by what they called.
  std::map<decltype(key(Fingerprint{})), std::vector<int>> groups;
  for (size_t r = 0; r < by_rank.size(); ++r) groups[key(by_rank[r])].push_back(int(r));
  if (groups.size() <= 1) return "";

  std::string text = "collective mismatch (TINYDDP_DEBUG=DETAIL): ";
  bool first = true;
  for (auto& [k, ranks] : groups) {
    std::string who = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) who += (i ? ", " : "") + std::to_string(ranks[i]);
    text += (first ? "" : "; ") + who + (ranks.size() == 1 ? " calls " : " call ") +
            describe_fingerprint(by_rank[ranks[0]]);
    first = false;
  }
  std::vector<std::string> fields;
  const Fingerprint& a = by_rank[0];
  auto differs = [&](auto get) {
    for (const Fingerprint& f : by_rank)
      if (get(f) != get(a)) return true;
    return false;
  };
  if (differs([](const Fingerprint& f) { return f.kind; })) fields.push_back("collective");
  if (differs([](const Fingerprint& f) { return f.sequence; })) fields.push_back("call number");
  if (differs([](const Fingerprint& f) { return f.dtype; })) fields.push_back("dtype");
  if (differs([](const Fingerprint& f) { return f.count; })) fields.push_back("element count");
  if (differs([](const Fingerprint& f) { return int(f.op) * 2 + f.reduces; })) fields.push_back("reduce op");
  if (differs([](const Fingerprint& f) { return f.root; })) fields.push_back("root");
  text += "; they differ in ";
  for (size_t i = 0; i < fields.size(); ++i) text += (i ? ", " : "") + fields[i];
  text += "; hint: every rank must make the same collective calls, in the same order, with the same dtype and size";
  return text;
}

bool debug_detail_from_environment() { return debug_level() == DebugLevel::detail; }

}  // namespace tinyddp::comm
