// Reverse-mode automatic differentiation.
//
// Ops in autograd/functions.h record a Node for every output whose inputs require
// grad (and only while grad mode is on). backward(loss) runs the recorded graph:
// Note [backward order]: a node runs once all the gradients flowing into it have
// been summed, and among ready nodes the most recently created runs first
// (PyTorch's sequence-number priority), so the last layer's parameter gradients
// are complete first, which lets DDP start reducing them while backward goes on.
// Leaf tensors that require grad accumulate into their .grad; after a leaf's
// gradient is complete for this backward, its post-accumulate-grad hooks run,
// exactly once per backward.
#pragma once

#include "runtime/tensor.h"

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

struct Node;

// Note [gradient dtypes]: an edge remembers the dtype its input had when the op
// ran, and the engine casts every gradient sent along it to that dtype (as
// PyTorch's engine does with its input metadata). So an op may compute a
// gradient in whatever dtype is natural to it (a bf16 matmul under autocast
// gives bf16, an f32 add gives f32) and the input still receives its own: an
// f32 tensor cast to bf16 inside an op gets an f32 gradient, a bf16 one added
// to an f32 residual gets bf16.
struct Edge {
  std::shared_ptr<Node> node;  // null: this input needs no gradient
  DType dtype = DType::f32;    // the input's dtype when the op ran
};

// A recorded backward function with one output gradient in and one gradient out
// per input edge (an undefined Tensor where there is nothing to pass).
struct Node {
  Node();
  virtual ~Node() = default;
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors after the node ran (the graph is not retained).
  virtual void release() {}

  std::vector<Edge> next;
  uint64_t sequence_nr;
};

// Note [version counter] (runtime/tensor.h): the versions of the memory of the
// tensors a backward reads, noted when its op ran; check() throws ValueError naming
// the node and the tensor when one has changed since (torch's "modified by an inplace
// operation"), before the backward would compute a wrong gradient from it. Null and
// undefined tensors are skipped. The storage is held weakly (the node's closure keeps
// a view of it; a weak reference leaves is_only_reference alone). A tensor whose
// storage is replaced between the forward and the backward (Module::to moving a
// parameter, ZeRO-3 adopting it at construction) is no longer checked.
// Kept inside the node, no allocation of its own (a step records hundreds).
class SavedVersions {
 public:
  static constexpr size_t kMaxSaved = 6;
  SavedVersions() = default;
  explicit SavedVersions(std::initializer_list<const Tensor*> saved);
  void check(const std::string& node) const;

 private:
  struct Entry {
    std::weak_ptr<Storage> storage;
    uint64_t version = 0;
    std::array<int64_t, 4> dims{};  // the shape, for the message (up to 4 dims)
    int64_t numel = 0;
    uint8_t ndim = 0;
    DType dtype = DType::f32;
  };
  std::array<Entry, kMaxSaved> entries_{};
  size_t count_ = 0;
};

using GradHook = std::function<void(Tensor& param)>;

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;        // null for leaves
  std::weak_ptr<Node> accumulate_node;  // leaves: shared by every use in a graph
  std::vector<GradHook> post_accumulate_hooks;
  Tensor grad_destination;              // Note [gradient destinations]
  bool grad_destination_taken = false;  // handed to a backward op, not yet accumulated
};

// Leaves.
void set_requires_grad(Tensor& t, bool requires_grad);
bool requires_grad(const Tensor& t);
bool is_leaf(const Tensor& t);
// The accumulated gradient (undefined until a backward reached the tensor).
Tensor grad(const Tensor& t);
void set_grad(Tensor& t, const Tensor& grad);
std::shared_ptr<Node> grad_fn(const Tensor& t);
// Runs after `param`'s gradient for the current backward is fully accumulated.
void register_post_accumulate_grad_hook(Tensor& param, GradHook hook);

// Note [gradient destinations]: DDP's gradient_as_bucket_view gives each
// parameter a destination, its slice of a bucket. A backward op that computes a
// parameter's whole gradient into fresh memory (Linear's weight GEMM) may write
// it there instead (gradient_destination()); AccumulateGrad then makes that
// memory the .grad without a copy, and DDP's hook finds the gradient already in
// its bucket. Handed out once per accumulation: a parameter used twice in one
// graph gets the destination for one use and fresh memory for the other (the
// engine sums them out of place, so the sum is right either way).
void set_gradient_destination(Tensor& param, const Tensor& destination);  // undefined: none
// The memory a backward op may write `param`'s gradient to, or undefined: only a
// leaf that requires grad, has a destination, has no .grad yet (the first
// gradient since zero_grad(set_to_none)) and has not handed it out already.
Tensor gradient_destination(const Tensor& param);

// Backpropagates from `root`. Without `grad_root`, root must hold one element and
// the seed gradient is 1. Throws ValueError if root does not require grad.
void backward(const Tensor& root, const Tensor& grad_root = Tensor());

// Note [accumulating into a pending gradient]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A tensor used twice (GPT's residual stream: by the next residual add and by a
// LayerNorm) gets two gradients, which the engine sums: the op's gradient written
// out, then read again with the waiting one by an add (12 bytes an f32 element, and a
// launch). Instead, while backward() runs a node, the gradient already waiting for
// its input `edge` may be handed to it: the node's op reads it and adds its own
// gradient into it in the same kernel that computes it (4 bytes an element more
// there: 8 saved), and returns that tensor; the engine, getting back the very tensor
// it handed out for that input, adds nothing (any other tensor it adds, even the same
// tensor handed by AddBackward to two inputs). llm.c's LayerNorm backward
// accumulates into the residual stream's gradient so.
// - Handed out only when nobody else holds it (the engine's buffer is its only
//   reference, so the write in place cannot change a tensor anyone sees), when its
//   shape, dtype and device are those of `like` (the input) and the edge's dtype, when
//   the input is the node's only edge to that child, and once per node and child.
// - An op that takes it adds its value v to the waiting w as w + v, rounded once (no
//   fused multiply-add): the bits of the engine's add(w, v). Results do not change.
// - An op may also ignore it and return a new gradient: the engine adds as before.
// Returns undefined outside a node's backward, or when there is no such gradient.
Tensor pending_gradient(size_t edge, const Tensor& like);
// Whether backward() hands waiting gradients out (DDP_PENDING_GRADIENTS, read once, at
// the first call; default on); off, every sum is an add (for tests and measurements
// that compare the two). The setter overrides the variable.
bool pending_gradients_enabled();
void set_pending_gradients_enabled(bool enabled);

// Grad mode: while disabled (NoGradGuard), ops record nothing. Per thread
// (Note [autograd and threads] in autograd.cpp: forward may record in several threads).
bool grad_mode_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

namespace autograd {
// For op implementations: true when grad mode is on and any input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
// Attaches `node` (its edges taken from `inputs`) as the grad_fn of `output`.
void record(Tensor& output, std::shared_ptr<Node> node,
            std::initializer_list<const Tensor*> inputs);
// The same for ops with a number of inputs known only at run time (gather).
bool needs_grad(const std::vector<const Tensor*>& inputs);
void record(Tensor& output, std::shared_ptr<Node> node, const std::vector<const Tensor*>& inputs);
}  // namespace autograd

}  // namespace ddp
