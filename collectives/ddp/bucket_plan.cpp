#include "collectives/ddp/bucket_plan.h"

namespace ddp {

std::vector<Bucket> plan_buckets(const std::vector<ParamInfo>& params, const BucketCaps& caps) {
  std::vector<Bucket> buckets;
  size_t open_bytes = 0;  // bytes in buckets.back()
  for (size_t i = 0; i < params.size(); ++i) {
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
