#include "collectives/data_parallel/scatter_gather.h"

#include "runtime/autograd/autograd.h"
#include "runtime/ops/ops.h"

#include <algorithm>

namespace ddp::data_parallel {
namespace {

// One chunk's gradient, placed into its rows of a zero gradient for the whole input.
// Several chunks' gradients are summed by the engine, so each is padded to the
// input's shape: a cost paid only when the scattered input itself requires grad.
struct ScatterBackward : Node {
  ScatterBackward(Device source, Shape shape, int64_t row_begin)
      : source_(source), shape_(std::move(shape)), row_begin_(row_begin) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    Tensor full = zeros(shape_, {.dtype = g.dtype(), .device = source_});
    Tensor rows = full.slice(row_begin_, row_begin_ + g.size(0));
    copy_(rows, g);
    return {full};
  }
  std::string name() const override { return "ScatterBackward"; }

 private:
  Device source_;
  Shape shape_;
  int64_t row_begin_;
};

// Splits the output's gradient by rows, back to each gathered tensor's device.
struct GatherBackward : Node {
  GatherBackward(std::vector<Device> devices, std::vector<int64_t> rows)
      : devices_(std::move(devices)), rows_(std::move(rows)) {}
  std::vector<Tensor> apply(const Tensor& g) override {
    std::vector<Tensor> grads;
    int64_t begin = 0;
    for (size_t i = 0; i < rows_.size(); ++i) {
      grads.push_back(g.slice(begin, begin + rows_[i]).to(devices_[i]));
      begin += rows_[i];
    }
    return grads;
  }
  std::string name() const override { return "GatherBackward"; }

 private:
  std::vector<Device> devices_;
  std::vector<int64_t> rows_;
};

}  // namespace

std::vector<int64_t> chunk_sizes(int64_t batch, size_t replicas) {
  DDP_CHECK(replicas >= 1, "chunk_sizes: need at least one replica");
  DDP_CHECK(batch >= 0, "chunk_sizes: negative batch size {}", batch);
  if (batch == 0) return {0};
  const auto n = static_cast<int64_t>(replicas);
  const int64_t used = std::min(batch, n);
  std::vector<int64_t> sizes(static_cast<size_t>(used), batch / used);
  for (int64_t i = 0; i < batch % used; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

std::vector<Tensor> scatter(const Tensor& x, const std::vector<Device>& devices) {
  DDP_CHECK(x.defined() && x.dim() >= 1,
            "scatter: the input must have a batch dimension (dim 0) to split, got shape {}",
            x.defined() ? shape_str(x.shape()) : "undefined");
  DDP_CHECK(!devices.empty(), "scatter: no devices to scatter to");
  const std::vector<int64_t> sizes = chunk_sizes(x.size(0), devices.size());
  const bool grad = autograd::needs_grad({&x});
  std::vector<Tensor> chunks;
  int64_t begin = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // slice() is a fresh view, so a chunk never shares x's autograd history.
    Tensor chunk = x.slice(begin, begin + sizes[i]).to(devices[i]);
    if (grad) {
      autograd::record(chunk, std::make_shared<ScatterBackward>(x.device(), x.shape(), begin),
                       {&x});
    }
    chunks.push_back(std::move(chunk));
    begin += sizes[i];
  }
  return chunks;
}

Tensor gather(const std::vector<Tensor>& outputs, const Device& device) {
  DDP_CHECK(!outputs.empty(), "gather: no outputs to gather");
  const Tensor& first = outputs.front();
  Shape shape = first.shape();
  DDP_CHECK(!shape.empty(),
            "gather: replica 0 returned a 0-dimensional tensor; outputs are concatenated along "
            "dim 0, so return one row per sample (e.g. the per-sample loss, not its mean)");
  std::vector<int64_t> rows;
  std::vector<Device> devices;
  std::vector<const Tensor*> inputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& t = outputs[i];
    const bool fits = t.dim() == first.dim() && t.dtype() == first.dtype() &&
                      std::equal(t.shape().begin() + 1, t.shape().end(), shape.begin() + 1);
    DDP_CHECK(fits,
              "gather: replica {} returned {} ({}) but replica 0 returned {} ({}); replicas must "
              "return tensors that differ only in dim 0",
              i, shape_str(t.shape()), dtype_name(t.dtype()), shape_str(first.shape()),
              dtype_name(first.dtype()));
    rows.push_back(t.size(0));
    devices.push_back(t.device());
    inputs.push_back(&t);
  }
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  shape[0] = total;
  Tensor out = empty(shape, {.dtype = first.dtype(), .device = device});
  int64_t begin = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor dst = out.slice(begin, begin + rows[i]);
    copy_(dst, outputs[i]);
    begin += rows[i];
  }
  if (autograd::needs_grad(inputs)) {
    autograd::record(out, std::make_shared<GatherBackward>(std::move(devices), std::move(rows)),
                     inputs);
  }
  return out;
}

}  // namespace ddp::data_parallel
