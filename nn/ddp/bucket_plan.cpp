#include "tinyddp/nn/ddp/bucket_plan.h"

#include <cstdio>
#include <sstream>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

std::vector<BucketSpec> plan_buckets(std::span<const size_t> order, std::span<const size_t> parameter_bytes,
                                     size_t first_bucket_bytes, size_t bucket_cap_bytes) {
  TINYDDP_CHECK(first_bucket_bytes > 0 && bucket_cap_bytes > 0, "plan_buckets: the first bucket limit (",
                first_bucket_bytes, " bytes) and the bucket cap (", bucket_cap_bytes, " bytes) must be positive",
                hint("pass a bucket_cap_mb above zero"));
  TINYDDP_CHECK(order.size() == parameter_bytes.size(), "plan_buckets: the order lists ", order.size(),
                " parameters but there are ", parameter_bytes.size(), hint("list every parameter exactly once"));
  std::vector<bool> seen(parameter_bytes.size(), false);
  for (size_t index : order) {
    TINYDDP_CHECK(index < parameter_bytes.size() && !seen[index], "plan_buckets: parameter index ", index,
                  index < parameter_bytes.size() ? " appears twice" : " is out of range", " in the order of ",
                  parameter_bytes.size(), " parameters",
                  hint("the order must be a permutation of 0..",
                       parameter_bytes.size() == 0 ? 0 : parameter_bytes.size() - 1));
    seen[index] = true;
  }

  std::vector<BucketSpec> buckets;
  BucketSpec open;
  size_t limit = first_bucket_bytes;
  for (size_t index : order) {
    open.parameters.push_back(index);
    open.bytes += parameter_bytes[index];
    open.size_limit = limit;
    // ">=" and closing *after* adding, as PyTorch does: the parameter that reaches the limit still
    // joins the bucket, so no bucket is ever left empty by a parameter larger than the limit.
    if (open.bytes >= limit) {
      buckets.push_back(std::move(open));
      open = BucketSpec{};
      limit = bucket_cap_bytes;  // only the very first bucket gets the small limit
    }
  }
  if (!open.parameters.empty()) buckets.push_back(std::move(open));
  return buckets;
}

std::vector<size_t> reverse_registration_order(size_t count) {
  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = count - 1 - i;
  return order;
}

namespace {
std::string mebibytes(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(1 << 20));
  return text;
}
}  // namespace

std::string describe_buckets(const std::vector<BucketSpec>& buckets, const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BucketSpec& bucket = buckets[b];
    out << "bucket " << b << ": " << mebibytes(bucket.bytes) << " (" << bucket.bytes << " bytes, limit "
        << mebibytes(bucket.size_limit) << "):";
    for (size_t i = 0; i < bucket.parameters.size(); ++i) {
      size_t index = bucket.parameters[i];
      out << (i == 0 ? " " : ", ");
      if (index < names.size())
        out << names[index];
      else
        out << '#' << index;
    }
    out << '\n';
  }
  return out.str();
}

}  // namespace tinyddp::nn
