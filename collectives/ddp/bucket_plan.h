// The gradient bucket plan of DistributedDataParallel: which parameters share a
// flat bucket tensor, and where each one sits in it.
//
// Note [bucket order]: parameters are taken in the order given. DDP passes them
// in reverse registration order (as PyTorch does), which approximates the order
// in which backward completes their gradients (Note [backward order] in
// runtime/autograd/autograd.h), so the first bucket fills first and its
// all_reduce overlaps the rest of backward. The plan is a pure function of
// sizes, dtypes, devices, order and caps, so every rank computes the same plan.
#pragma once

#include "runtime/device.h"
#include "runtime/dtype.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {

struct ParamInfo {
  int64_t numel = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

struct BucketCaps {
  size_t first_bucket_bytes = size_t{1} << 20;  // the first bucket launches early
  size_t bucket_bytes = size_t{25} << 20;
};

struct Bucket {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  std::vector<size_t> params;    // indices into the planned list, in plan order
  std::vector<int64_t> offsets;  // element offset of each param in the bucket
  int64_t numel = 0;             // elements in the bucket
};

// Packs params, in order, into buckets: a new bucket starts when the param's
// dtype or device differs from the open bucket's, or when adding it would take
// the open bucket past its cap (first_bucket_bytes for bucket 0, bucket_bytes
// after). A param larger than the cap gets a bucket of its own.
std::vector<Bucket> plan_buckets(const std::vector<ParamInfo>& params, const BucketCaps& caps = {});

// Note [bucket rebuild]: the same packing over params taken in `order`, a
// permutation of 0 .. params.size() - 1 (the order in which the first backward
// completed the gradients, as rank 0 observed it); Bucket::params then holds
// indices into `params`, in packing order. Throws ValueError if `order` is not
// a permutation.
std::vector<Bucket> plan_buckets_in_order(const std::vector<ParamInfo>& params,
                                          const std::vector<size_t>& order,
                                          const BucketCaps& caps = {});

}  // namespace ddp
