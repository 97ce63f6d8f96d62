#include "runtime/autograd/autograd.h"

#include "runtime/env.h"
#include "runtime/fmt.h"
#include "runtime/ops/ops.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace ddp {
namespace {

std::atomic<uint64_t> g_next_sequence_nr{0};
thread_local bool t_grad_mode = true;

AutogradMeta& meta(const Tensor& t) {
  auto& slot = t.impl().autograd;
  if (!slot) slot = std::make_shared<AutogradMeta>();
  return *slot;
}

const AutogradMeta* meta_if(const Tensor& t) {
  return t.impl().autograd.get();
}

// The sink of a leaf: sums the incoming gradient into .grad, then runs the hooks.
// Its sequence number is the largest possible, so it runs as soon as it is ready.
struct AccumulateGrad : Node {
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> target) : target_(std::move(target)) {
    sequence_nr = std::numeric_limits<uint64_t>::max();
  }
  std::vector<Tensor> apply(const Tensor& g) override {
    auto impl = target_.lock();
    if (!impl || !g.defined()) return {};
    Tensor param(impl);
    AutogradMeta& m = meta(param);
    DDP_ASSERT(g.shape() == param.shape(), "gradient shape {} for a parameter of shape {}",
               shape_str(g.shape()), shape_str(param.shape()));
    const bool at_destination = m.grad_destination.defined() &&
                                g.data_ptr() == m.grad_destination.data_ptr() &&
                                g.device() == m.grad_destination.device();
    m.grad_destination_taken = false;
    if (!m.grad.defined() && at_destination) {
      m.grad = m.grad_destination;  // Note [gradient destinations]
    } else if (!m.grad.defined()) {
      // Note [stealing gradients]: a gradient nobody else references (the fresh output
      // of a backward op) becomes .grad as it is; a shared one (AddBackward hands the
      // same tensor to both inputs) is copied, so .grad never aliases another tensor.
      const bool sole_owner = g.is_only_reference();
      m.grad = sole_owner ? g : g.clone();
    } else {
      axpy_(1.0f, g, m.grad);
    }
    for (auto& hook : m.post_accumulate_hooks) hook(param);
    return {};
  }
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::weak_ptr<TensorImpl> target_;
};

// Note [autograd and threads]: forward passes may record graphs in several threads at
// once (DataParallel's replicas do). Grad mode is per thread (a new thread starts with
// it on; DataParallel hands its workers the caller's mode), sequence numbers are
// atomic, and a recorded node and its output's metadata belong to the thread that
// records them. What threads share are leaves (a parameter used by several replicas):
// their metadata exists before the threads start (requires_grad was set), and the
// lazily made accumulate node is created under this lock. backward() runs in one
// thread; running two backward passes over one graph at once is not supported.
std::mutex g_accumulate_mutex;

std::shared_ptr<Node> accumulate_node(const Tensor& leaf) {
  std::lock_guard<std::mutex> lock(g_accumulate_mutex);
  AutogradMeta& m = meta(leaf);
  auto node = m.accumulate_node.lock();
  if (!node) {
    node = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    m.accumulate_node = node;
  }
  return node;
}

std::shared_ptr<Node> node_of(const Tensor& t) {
  const AutogradMeta* m = meta_if(t);
  if (m == nullptr || !m->requires_grad) return nullptr;
  return m->grad_fn ? m->grad_fn : accumulate_node(t);
}

std::unordered_map<Node*, int> count_dependencies(const std::shared_ptr<Node>& root) {
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen{root.get()};
  std::vector<Node*> stack{root.get()};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next) {
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  return deps;
}

struct ReadyEntry {
  std::shared_ptr<Node> node;
  uint64_t order;  // insertion order: ties run first-in first-out
  bool operator<(const ReadyEntry& o) const {
    if (node->sequence_nr != o.node->sequence_nr) return node->sequence_nr < o.node->sequence_nr;
    return order > o.order;
  }
};

}  // namespace

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1)) {}

SavedVersions::SavedVersions(std::initializer_list<const Tensor*> saved) {
  DDP_ASSERT(saved.size() <= kMaxSaved, "SavedVersions: {} tensors, at most {}", saved.size(),
             kMaxSaved);
  for (const Tensor* t : saved) {
    if (t == nullptr || !t->defined()) continue;
    Entry& e = entries_[count_++];
    e = {t->storage(), t->version(), {}, t->numel(), static_cast<uint8_t>(t->dim()), t->dtype()};
    for (int64_t d = 0; d < std::min<int64_t>(t->dim(), 4); ++d) e.dims[d] = t->size(d);
  }
}

void SavedVersions::check(const std::string& node) const {
  for (size_t i = 0; i < count_; ++i) {
    const Entry& e = entries_[i];
    const std::shared_ptr<Storage> storage = e.storage.lock();
    if (storage == nullptr) continue;  // freed: nothing of the backward reads it
    const uint64_t now = storage->version();
    if (now == e.version) continue;
    throw ValueError(fmt::format(
        "{}: a tensor its backward needs ({} {}) was modified by an in-place operation (copy_, "
        "fill_, axpy_, an optimizer step, ...) after the forward: it is at version {}, the "
        "forward saw version {}. Call backward before changing it (e.g. optimizer.step() after "
        "backward), or change a clone of it instead",
        node, dtype_name(e.dtype),
        e.ndim <= 4 ? shape_str(Shape(e.dims.begin(), e.dims.begin() + e.ndim))
                    : fmt::format("of {} elements", e.numel),
        now, e.version));
  }
}

void set_requires_grad(Tensor& t, bool value) {
  DDP_CHECK(!value || is_floating(t.dtype()),
            "only floating-point tensors can require gradients, got dtype {}",
            dtype_name(t.dtype()));
  DDP_CHECK(is_leaf(t),
            "requires_grad can only be changed on leaf tensors (this one has grad_fn {})",
            grad_fn(t)->name());
  meta(t).requires_grad = value;
}

bool requires_grad(const Tensor& t) {
  const AutogradMeta* m = meta_if(t);
  return m != nullptr && m->requires_grad;
}

bool is_leaf(const Tensor& t) {
  const AutogradMeta* m = meta_if(t);
  return m == nullptr || !m->grad_fn;
}

Tensor grad(const Tensor& t) {
  const AutogradMeta* m = meta_if(t);
  return m == nullptr ? Tensor() : m->grad;
}

void set_grad(Tensor& t, const Tensor& g) {
  if (g.defined()) {
    check_same_device("set_grad", {&t, &g});
    DDP_CHECK(g.shape() == t.shape(), "set_grad: gradient shape {} differs from tensor shape {}",
              shape_str(g.shape()), shape_str(t.shape()));
    // As torch ("assigned grad has data of a different type"): backward adds into it
    // in the tensor's dtype.
    DDP_CHECK(g.dtype() == t.dtype(),
              "set_grad: gradient of dtype {} for a tensor of dtype {} (shape {}); give it the "
              "tensor's dtype (g.to(DType::{}))",
              dtype_name(g.dtype()), dtype_name(t.dtype()), shape_str(t.shape()),
              dtype_name(t.dtype()));
  }
  meta(t).grad = g;
}

std::shared_ptr<Node> grad_fn(const Tensor& t) {
  const AutogradMeta* m = meta_if(t);
  return m == nullptr ? nullptr : m->grad_fn;
}

void set_gradient_destination(Tensor& param, const Tensor& destination) {
  if (destination.defined()) {
    check_same_device("set_gradient_destination", {&param, &destination});
    DDP_CHECK(destination.shape() == param.shape() && destination.dtype() == param.dtype(),
              "set_gradient_destination: destination {} {} for a parameter {} {}",
              shape_str(destination.shape()), dtype_name(destination.dtype()),
              shape_str(param.shape()), dtype_name(param.dtype()));
  }
  AutogradMeta& m = meta(param);
  m.grad_destination = destination;
  m.grad_destination_taken = false;
}

Tensor gradient_destination(const Tensor& param) {
  if (meta_if(param) == nullptr) return Tensor();
  AutogradMeta& m = meta(param);
  if (!m.requires_grad || m.grad_fn || !m.grad_destination.defined() || m.grad.defined() ||
      m.grad_destination_taken) {
    return Tensor();
  }
  m.grad_destination_taken = true;
  return m.grad_destination;
}

void register_post_accumulate_grad_hook(Tensor& param, GradHook hook) {
  DDP_CHECK(is_leaf(param) && requires_grad(param),
            "post-accumulate-grad hooks can only be registered on leaf tensors that require grad");
  meta(param).post_accumulate_hooks.push_back(std::move(hook));
}

namespace {
// The node backward() is running, and the gradients waiting for the nodes its inputs
// lead to (Note [accumulating into a pending gradient]).
struct PendingOffer {
  Node* node = nullptr;
  std::unordered_map<Node*, Tensor>* buffers = nullptr;
  // The children whose waiting gradient was handed out, and that gradient's impl.
  std::vector<std::pair<Node*, const TensorImpl*>> handed;
};
thread_local PendingOffer* t_offer = nullptr;

std::atomic<bool>& pending_switch() {  // DDP_PENDING_GRADIENTS, default on
  static std::atomic<bool> on{env::get_int(env::kPendingGradients).value_or(1) != 0};
  return on;
}

class OfferScope {
 public:
  explicit OfferScope(PendingOffer& offer) : previous_(t_offer) { t_offer = &offer; }
  ~OfferScope() { t_offer = previous_; }
  OfferScope(const OfferScope&) = delete;
  OfferScope& operator=(const OfferScope&) = delete;

 private:
  PendingOffer* previous_;
};
}  // namespace

bool pending_gradients_enabled() {
  return pending_switch().load(std::memory_order_relaxed);
}
void set_pending_gradients_enabled(bool enabled) {
  pending_switch().store(enabled, std::memory_order_relaxed);
}

Tensor pending_gradient(size_t edge, const Tensor& like) {
  PendingOffer* offer = t_offer;
  if (!pending_gradients_enabled()) return Tensor();
  if (offer == nullptr || edge >= offer->node->next.size()) {
    return Tensor();
  }
  const Edge& e = offer->node->next[edge];
  Node* child = e.node.get();
  if (child == nullptr || e.dtype != like.dtype()) return Tensor();
  // A child reached by two of this node's edges gets both gradients: none is handed out.
  if (std::count_if(offer->node->next.begin(), offer->node->next.end(),
                    [&](const Edge& o) { return o.node.get() == child; }) != 1) {
    return Tensor();
  }
  for (const auto& h : offer->handed) {
    if (h.first == child) return Tensor();
  }
  const auto it = offer->buffers->find(child);
  if (it == offer->buffers->end() || !it->second.defined()) return Tensor();
  const Tensor& waiting = it->second;
  const bool sole_owner = waiting.is_only_reference();
  if (!sole_owner || waiting.dtype() != like.dtype() || waiting.shape() != like.shape() ||
      waiting.device() != like.device()) {
    return Tensor();
  }
  offer->handed.emplace_back(child, waiting.impl_ptr().get());
  return waiting;
}

void backward(const Tensor& root, const Tensor& grad_root) {
  DDP_CHECK(requires_grad(root),
            "backward: the tensor does not require grad and has no grad_fn; did a parameter miss "
            "set_requires_grad, or did the forward run under NoGradGuard?");
  Tensor seed = grad_root;
  if (!seed.defined()) {
    DDP_CHECK(root.numel() == 1,
              "backward: grad can be implicitly created only for scalar outputs, "
              "got shape {}; pass grad_root",
              shape_str(root.shape()));
    seed = ones(root.shape(), {.dtype = root.dtype(), .device = root.device()});
  } else {
    // As torch's engine: a gradient of another shape or on another device is refused
    // by name (it would otherwise reach a leaf's .grad on that device, or fail deep in
    // the graph as an internal error); another dtype is cast to the root's.
    DDP_CHECK_T(DeviceError, seed.device() == root.device(),
                "backward: grad_root is on {}, but the tensor it is the gradient of is on {}; "
                "move it there first (grad_root.to({}))",
                seed.device().str(), root.device().str(), root.device().str());
    // A one-element gradient of a one-element root ([1] of a scalar loss []) is taken,
    // in the root's shape.
    DDP_CHECK(seed.shape() == root.shape() || (seed.numel() == 1 && root.numel() == 1),
              "backward: grad_root has shape {}, but the tensor it is the gradient of has shape "
              "{}; pass a gradient of that shape",
              shape_str(seed.shape()), shape_str(root.shape()));
    if (seed.shape() != root.shape()) seed = seed.reshape(root.shape());  // one element
    if (seed.dtype() != root.dtype()) seed = cast(seed, root.dtype());
  }
  NoGradGuard no_grad;
  const std::shared_ptr<Node> root_node = node_of(root);
  auto deps = count_dependencies(root_node);
  std::unordered_map<Node*, Tensor> buffers{{root_node.get(), seed}};
  std::priority_queue<ReadyEntry> ready;
  uint64_t order = 0;
  ready.push({root_node, order++});
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top().node;
    ready.pop();
    Tensor g = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    std::vector<Tensor> outs;
    PendingOffer offer{.node = node.get(), .buffers = &buffers, .handed = {}};
    if (g.defined()) {
      const OfferScope offering(offer);
      outs = node->apply(g);
    }
    node->release();
    for (size_t i = 0; i < node->next.size(); ++i) {
      const auto& child = node->next[i].node;
      if (!child) continue;
      if (i < outs.size() && outs[i].defined()) {
        // Note [gradient dtypes]
        if (outs[i].dtype() != node->next[i].dtype) outs[i] = cast(outs[i], node->next[i].dtype);
        Tensor& buf = buffers[child.get()];
        // The waiting gradient itself comes back when the op added into it (Note
        // [accumulating into a pending gradient]): nothing left to add.
        const bool added_in_place =
            buf.defined() && buf.is_same(outs[i]) &&
            std::any_of(offer.handed.begin(), offer.handed.end(), [&](const auto& h) {
              return h.first == child.get() && h.second == outs[i].impl_ptr().get();
            });
        if (!added_in_place) {
          buf = buf.defined() ? add(buf, outs[i]) : outs[i];
        }
      }
      if (--deps[child.get()] == 0) ready.push({child, order++});
    }
  }
}

bool grad_mode_enabled() {
  return t_grad_mode;
}

NoGradGuard::NoGradGuard() : previous_(t_grad_mode) {
  t_grad_mode = false;
}
NoGradGuard::~NoGradGuard() {
  t_grad_mode = previous_;
}

namespace autograd {

namespace {

template <typename Inputs>
bool any_needs_grad(const Inputs& inputs) {
  if (!t_grad_mode) return false;
  for (const Tensor* t : inputs) {
    if (t->defined() && requires_grad(*t)) return true;
  }
  return false;
}

template <typename Inputs>
void record_edges(Tensor& output, std::shared_ptr<Node> node, const Inputs& inputs) {
  node->next.clear();
  for (const Tensor* t : inputs) {
    if (t->defined()) {
      node->next.push_back({node_of(*t), t->dtype()});
    } else {
      node->next.push_back({});
    }
  }
  AutogradMeta& m = meta(output);
  m.requires_grad = true;
  m.grad_fn = std::move(node);
}

}  // namespace

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  return any_needs_grad(inputs);
}

bool needs_grad(const std::vector<const Tensor*>& inputs) {
  return any_needs_grad(inputs);
}

void record(Tensor& output, std::shared_ptr<Node> node,
            std::initializer_list<const Tensor*> inputs) {
  record_edges(output, std::move(node), inputs);
}

void record(Tensor& output, std::shared_ptr<Node> node, const std::vector<const Tensor*>& inputs) {
  record_edges(output, std::move(node), inputs);
}

}  // namespace autograd
}  // namespace ddp
