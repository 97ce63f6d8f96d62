#include "collectives/data_parallel/replicate.h"

#include "runtime/ops/ops.h"

#include <map>

namespace ddp::data_parallel {
namespace {

// A replica parameter's gradient, moved to the original parameter's device. The
// engine adds the gradients of all replicas of one parameter before accumulating.
struct BroadcastBackward : Node {
  explicit BroadcastBackward(Device source) : source_(source) {}
  std::vector<Tensor> apply(const Tensor& g) override { return {g.to(source_)}; }
  std::string name() const override { return "BroadcastBackward"; }

 private:
  Device source_;
};

// A new handle on t's data: the replica's own tensor, free of t's autograd state.
Tensor fresh_view(const Tensor& t) {
  return t.flat_view(0, t.shape());
}

}  // namespace

std::vector<Tensor> copy_coalesced(const std::vector<Tensor>& tensors, const Device& device) {
  std::vector<Tensor> out(tensors.size());
  if (tensors.empty()) return out;
  const Device source = tensors.front().device();
  // Per dtype, in order: the indices of its tensors and their total element count.
  std::map<DType, std::pair<std::vector<size_t>, int64_t>> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_same_device({&tensors.front(), &tensors[i]});
    auto& [indices, total] = groups[tensors[i].dtype()];
    indices.push_back(i);
    total += tensors[i].numel();
  }
  for (const auto& [dtype, group] : groups) {
    const auto& [indices, total] = group;
    Tensor packed = empty({total}, {.dtype = dtype, .device = source});
    int64_t offset = 0;
    for (size_t i : indices) {
      Tensor slot = packed.flat_view(offset, {tensors[i].numel()});
      copy_(slot, tensors[i].flatten());
      offset += tensors[i].numel();
    }
    const Tensor copied = packed.to(device);
    offset = 0;
    for (size_t i : indices) {
      out[i] = copied.flat_view(offset, tensors[i].shape());
      offset += tensors[i].numel();
    }
  }
  return out;
}

std::vector<std::shared_ptr<nn::Module>> replicate(const nn::Module& module,
                                                   const std::vector<Device>& devices) {
  std::vector<Tensor> params = module.parameters(), buffers;
  for (const auto& [name, t] : module.named_buffers()) buffers.push_back(t);
  std::vector<Tensor> all = params;
  all.insert(all.end(), buffers.begin(), buffers.end());
  const Device source = all.empty() ? devices.front() : all.front().device();
  // One coalesced copy per distinct device other than the source, shared by every
  // replica on that device (each replica then takes fresh views of it).
  std::map<std::string, std::vector<Tensor>> copies;
  for (const Device& d : devices) {
    if (d != source && !copies.contains(d.str())) copies[d.str()] = copy_coalesced(all, d);
  }
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (const Device& d : devices) {
    const std::vector<Tensor>& data = d == source ? all : copies.at(d.str());
    std::vector<Tensor> rp, rb;
    for (size_t j = 0; j < params.size(); ++j) {
      Tensor p = fresh_view(data[j]);
      if (autograd::needs_grad({&params[j]})) {
        autograd::record(p, std::make_shared<BroadcastBackward>(source), {&params[j]});
      }
      rp.push_back(std::move(p));
    }
    for (size_t j = 0; j < buffers.size(); ++j) rb.push_back(fresh_view(data[params.size() + j]));
    replicas.push_back(module.replicate(rp, rb));
  }
  return replicas;
}

}  // namespace ddp::data_parallel
