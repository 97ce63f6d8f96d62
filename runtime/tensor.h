// Tensor: shared storage + element offset + shape; always contiguous.
//
// A Tensor is a handle: copies share the same TensorImpl (and so the same data,
// and later the same gradient). Views (slice, reshape, flat_view) share the
// storage with a new offset and shape. A tensor lives on one device; moving it
// is explicit (`to`), and every op checks that its inputs share a device.
//
// Autograd records only the functional:: ops (runtime/autograd/functions.h): this
// class's views and copies (slice, reshape, flat_view, to, clone) are not recorded, so
// a parameter used through one of them gets no gradient from that use (torch records
// them); use functional::reshape and functional::cast. An in-place change (an
// optimizer step, fill_, copy_) to a tensor a recorded op keeps for its backward, made
// before that backward, is an error when the backward runs, as torch's (Note [version
// counter]).
#pragma once

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace ddp {

class Allocator;
class Stream;
using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);  // "[64, 784]"
int64_t shape_numel(const Shape& shape);
// The bytes of a contiguous `shape` of `dtype`. Throws ValueError naming `op`, the
// shape and the dtype when they exceed a 64-bit byte count (2^62 f32 elements would
// otherwise wrap around to 0 bytes: a tensor without memory).
size_t shape_nbytes(std::string_view op, const Shape& shape, DType dtype);

// Memory that one or more tensors view. Freed through its allocator with the last
// reference; a failure to free (or a throwing from_blob deleter) is logged, never
// thrown, and the memory leaked (Note [errors freeing memory] in tensor.cpp).
class Storage {
 public:
  Storage(Device device, size_t bytes, bool pinned);
  // Wraps memory ddp did not allocate (see from_blob); `deleter` runs with the last reference.
  Storage(Device device, size_t bytes, void* data, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }
  bool pinned() const { return pinned_; }
  Allocator* allocator() const { return allocator_; }  // null for wrapped memory

  // Note [released storage]: ZeRO-3 (collectives/ddp/fully_shard.h) frees a unit's
  // gathered parameters between their uses while every view of them (the
  // module's parameters, tensors autograd saved) keeps this Storage, as PyTorch's
  // FSDP resizes a storage to zero. release() gives the memory back (data() is
  // null, bytes() unchanged); reallocate() takes bytes() again, contents
  // undefined. A tensor over released storage is an error on use (data_ptr()).
  // Allocator-owned storage only (ValueError for from_blob memory).
  void release();
  void reallocate();
  bool released() const { return released_; }

  // Note [version counter]: how many times an in-place op has written this memory
  // (torch's tensor._version, shared by every view as torch's is). The ops that write
  // a caller's tensor in place bump it: copy_, fill_, axpy_, matmul_out's out,
  // scale_by_, and the optimizers' updates (sgd_update_, adamw_update_,
  // adamw_update_all_); a factory's tensor, clone() and to() start at 0. A recorded op notes the
  // version of each tensor its backward reads, and the backward refuses to run on a changed one
  // (SavedVersions in autograd/autograd.h) instead of computing a wrong gradient. Writes
  // through data_ptr() are not counted (torch's .data neither), nor are the
  // collectives' (copy_uncounted_ where one copies into its output). ZeRO-1/2 count
  // a step once for every trainable parameter on every rank; ZeRO-3's gather of a unit
  // it released after the forward puts back the values the forward saw and leaves the
  // version alone, unless the optimizer stepped the unit in between: then it counts
  // as a write, on every rank alike.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  // Sets it: 0 for a new tensor whose factory filled it.
  void restore_version(uint64_t version) { version_.store(version, std::memory_order_relaxed); }
  // Who releases it (ZeRO-3: its unit and parameters), for the error on use.
  void set_release_label(std::string label) { release_label_ = std::move(label); }
  const std::string& release_label() const { return release_label_; }

 private:
  Device device_;
  size_t bytes_;
  bool pinned_;
  Allocator* allocator_;  // null for wrapped memory
  void* data_;
  std::function<void(void*)> deleter_;
  bool released_ = false;
  std::string release_label_;
  std::atomic<uint64_t> version_{0};
};

struct AutogradMeta;  // defined by runtime/autograd (later); null for plain tensors

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMeta> autograd;
};

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool pinned = false;  // page-locked host memory (cpu only)
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(dtype()); }
  DType dtype() const { return impl().dtype; }
  const Device& device() const { return impl().storage->device(); }
  bool is_pinned() const { return impl().storage->pinned(); }
  int64_t storage_offset() const { return impl().offset; }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  // Note [version counter]: the in-place writes its memory has seen.
  uint64_t version() const { return impl().storage->version(); }
  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // No other handle shares this tensor, and no other tensor (a view) its storage: what
  // it holds may be taken or overwritten (a defined tensor only).
  bool is_only_reference() const {
    return impl_.use_count() == 1 && impl_->storage.use_count() == 1;
  }

  void* data_ptr() const;
  template <typename T>
  T* data() const {
    DDP_CHECK(DTypeOf<T>::value == dtype(), "data<{}>() on a tensor of dtype {}",
              dtype_name(DTypeOf<T>::value), dtype_name(dtype()));
    return static_cast<T*>(data_ptr());
  }

  // Views sharing storage (not recorded by autograd: see the top of this file).
  Tensor slice(int64_t start, int64_t end) const;  // rows [start, end) along dim 0
  Tensor reshape(const Shape& shape) const;        // one -1 may be inferred
  Tensor flatten() const { return reshape({numel()}); }
  // A view of `shape` starting `offset` elements into this tensor's data (a flat
  // view into a larger buffer, as DDP buckets use).
  Tensor flat_view(int64_t offset, const Shape& shape) const;

  // Moves, with copy_'s rules (Note [copy semantics] in ops/copy.cpp). `to` returns
  // *this (no copy) when nothing changes. Between two GPUs it never blocks the host;
  // non_blocking host->device copies go through pinned staging and do not wait;
  // device->host with non_blocking gives a pinned tensor valid once the current
  // stream syncs. clone() never blocks the host for a CUDA tensor.
  Tensor to(const Device& device, bool non_blocking = false) const;
  Tensor to(DType dtype) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor clone() const;
  Tensor pin_memory() const;  // a pinned host copy (cpu tensors only)
  // This tensor's memory is also used by work queued on `stream` (a communication
  // or copy stream other than the one it was allocated on): once freed, it is
  // handed out again only after that work has finished (PyTorch's record_stream).
  // A no-op for ordinary CPU memory and for memory from from_blob.
  void record_stream(const Stream& stream) const;

  // Reads to the host (synchronous). item() needs exactly one element. The
  // unnamed parameter stops item<double>() at compile time (DTypeOf).
  template <typename T, DType = DTypeOf<T>::value>
  T item() const;
  template <typename T, DType = DTypeOf<T>::value>
  std::vector<T> to_vector() const;
  double item_double() const;  // any dtype, one element

  std::string str() const;  // PyTorch style: tensor([...], device='cuda:0')

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Factories: the data is created directly on options.device (no host round trip).
// t's bytes (numel x element size); 0 for an undefined tensor.
inline int64_t bytes_of(const Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
}

Tensor empty(const Shape& shape, const TensorOptions& options = {});
Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
Tensor full(const Shape& shape, double value, const TensorOptions& options = {});
// 0, 1, ..., n-1 (or start, start+step, ... below end)
Tensor arange(int64_t n, const TensorOptions& options = {});
Tensor arange(double start, double end, double step, const TensorOptions& options = {});
// Philox 4x32-10 streams, identical on every device for the same seed and offset
// (see runtime/rng/philox.h). rand: uniform [0, 1); randn: standard normal.
Tensor rand(const Shape& shape, uint64_t seed, const TensorOptions& options = {},
            uint64_t offset = 0);
Tensor randn(const Shape& shape, uint64_t seed, const TensorOptions& options = {},
             uint64_t offset = 0);
// A tensor over existing memory that lives on options.device (the caller vouches for
// that); nothing is copied. `deleter`, if any, runs when the last view is gone.
Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options,
                 std::function<void(void*)> deleter = {});
// Copies host values into a new tensor on options.device (dtype from T unless options say).
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                   const TensorOptions& options = {.dtype = DTypeOf<T>::value});

}  // namespace ddp
