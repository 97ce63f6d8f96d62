#include "collectives/ddp/bucket_plan.h"

#include "runtime/error.h"

#include <numeric>

namespace ddp {

std::vector<Bucket> plan_buckets(const std::vector<ParamInfo>& params, const BucketCaps& caps) {
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  return plan_buckets_in_order(params, order, caps);
}

std::vector<Bucket> plan_buckets_in_order(const std::vector<ParamInfo>& params,
                                          const std::vector<size_t>& order,
                                          const BucketCaps& caps) {
  std::vector<char> seen(params.size(), 0);
  for (size_t i : order) {
    DDP_CHECK(
        i < params.size() && !seen[i]++,
        "plan_buckets_in_order: the order is not a permutation of the {} parameters (index {} is "
        "out of range or repeated)",
        params.size(), i);
  }
  DDP_CHECK(order.size() == params.size(),
            "plan_buckets_in_order: the order has {} entries for {} parameters", order.size(),
            params.size());
  std::vector<Bucket> buckets;
  size_t open_bytes = 0;  // bytes in buckets.back()
  for (size_t i : order) {
    const ParamInfo& p = params[i];
    const size_t bytes = static_cast<size_t>(p.numel) * element_size(p.dtype);
    // The open bucket is bucket 0 while exactly one exists.
    const size_t cap = buckets.size() == 1 ? caps.first_bucket_bytes : caps.bucket_bytes;
    const bool fits = !buckets.empty() && buckets.back().dtype == p.dtype &&
                      buckets.back().device == p.device && open_bytes + bytes <= cap;
    if (!fits) {
      buckets.emplace_back();
      buckets.back().dtype = p.dtype;
      buckets.back().device = p.device;
      open_bytes = 0;
    }
    Bucket& b = buckets.back();
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.numel += p.numel;
    open_bytes += bytes;
  }
  return buckets;
}

}  // namespace ddp
