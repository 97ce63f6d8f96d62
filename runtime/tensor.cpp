#include "runtime/tensor.h"

#include "runtime/logging.h"
#include "runtime/memory/allocator.h"
#include "runtime/ops/ops.h"

#include <atomic>
#include <exception>
#include <numeric>

namespace ddp {

std::string shape_str(const Shape& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    // A crafted file's shape (an .npy header) must not wrap around to a small count.
    DDP_CHECK(!__builtin_mul_overflow(n, s, &n),
              "shape {}: more elements than a 64-bit count holds", shape_str(shape));
  }
  return n;
}

size_t shape_nbytes(std::string_view op, const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  uint64_t bytes = 0;
  DDP_CHECK(
      n >= 0 && !__builtin_mul_overflow(static_cast<uint64_t>(n), element_size(dtype), &bytes),
      "{}: shape {} of {} is {} elements of {} bytes, more bytes than a 64-bit size holds; "
      "check the shape",
      op, shape_str(shape), dtype_name(dtype), n, element_size(dtype));
  return static_cast<size_t>(bytes);
}

Storage::Storage(Device device, size_t bytes, bool pinned)
    : device_(device),
      bytes_(bytes),
      pinned_(pinned),
      allocator_(pinned ? &pinned_host_allocator() : &device_allocator(device)),
      data_(allocator_->allocate(bytes)) {
  DDP_CHECK(!pinned || device.is_cpu(), "pinned memory is host memory; got device {}",
            device.str());
}

Storage::Storage(Device device, size_t bytes, void* data, std::function<void(void*)> deleter)
    : device_(device),
      bytes_(bytes),
      pinned_(false),
      allocator_(nullptr),
      data_(data),
      deleter_(std::move(deleter)) {}

namespace {

// Note [errors freeing memory]: a destructor cannot throw (it may run during stack
// unwinding, and ~Storage is noexcept), and one failed free (a CUDA error while
// recording an event, a throwing from_blob deleter) is no reason to end the process.
// The memory is leaked and the error logged; the first few in full, then one line.
void report_release_error(const Device& device, size_t bytes, const char* what) {
  constexpr int kLogged = 10;
  static std::atomic<int> count{0};
  const int n = ++count;
  if (n <= kLogged) {
    DDP_LOG_ERROR("freeing {} of tensor memory on {} failed (the memory may be leaked): {}",
                  format_bytes(bytes), device.str(), what);
  }
  if (n == kLogged) DDP_LOG_ERROR("further errors freeing tensor memory are not logged");
}

}  // namespace

Storage::~Storage() {
  try {
    if (allocator_ != nullptr) {
      allocator_->deallocate(data_);
    } else if (deleter_) {
      deleter_(data_);
    }
  } catch (const std::exception& e) {
    report_release_error(device_, bytes_, e.what());
  } catch (...) {
    report_release_error(device_, bytes_, "an exception that is not a std::exception");
  }
}

void Storage::release() {
  DDP_CHECK(allocator_ != nullptr, "Storage::release: memory from from_blob is not ours to free");
  if (released_) return;
  allocator_->deallocate(data_);
  data_ = nullptr;
  released_ = true;
}

void Storage::reallocate() {
  if (!released_) return;
  DDP_CHECK(allocator_ != nullptr, "Storage::reallocate: memory from from_blob");
  data_ = allocator_->allocate(bytes_);
  released_ = false;
}

Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options,
                 std::function<void(void*)> deleter) {
  for (int64_t s : shape) {
    DDP_CHECK(s >= 0, "from_blob: negative dimension {} in shape {}", s, shape_str(shape));
  }
  DDP_CHECK(data != nullptr || shape_numel(shape) == 0, "from_blob: null data for shape {}",
            shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(
      options.device, shape_nbytes("from_blob", shape, options.dtype), data, std::move(deleter));
  impl->shape = shape;
  impl->dtype = options.dtype;
  return Tensor(std::move(impl));
}

TensorImpl& Tensor::impl() const {
  DDP_CHECK(impl_ != nullptr, "use of an undefined tensor (default-constructed Tensor)");
  return *impl_;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  DDP_CHECK(d >= -n && d < n,
            "dimension {} out of range for a tensor of shape {} (valid: {} to {})", d,
            shape_str(shape()), -n, n - 1);
  return shape()[static_cast<size_t>(d < 0 ? d + n : d)];
}

void* Tensor::data_ptr() const {
  const auto& s = impl();
  if (s.storage->data() == nullptr) {
    DDP_CHECK(!s.storage->released(),
              "a tensor of shape {} is used while its memory is released: it is a parameter "
              "of {} outside that unit's forward and backward (Note [released storage]). Call "
              "the module (module(x), not module.forward(x)) so its hooks gather the "
              "parameters, or gather them first (ZeroOptimizer::gather_state); a parameter "
              "that a module outside its unit uses too (a head tied to the embedding) must "
              "be in a unit that holds both uses: leave its unit out of the ZeRO-3 units "
              "(--zero3-units), so the root unit holds it",
              shape_str(s.shape),
              s.storage->release_label().empty() ? std::string("a ZeRO-3 unit")
                                                 : s.storage->release_label());
    return nullptr;
  }
  return static_cast<char*>(s.storage->data()) +
         s.offset * static_cast<int64_t>(element_size(s.dtype));
}

namespace {
Tensor make_view(const Tensor& base, int64_t offset, Shape shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->offset = offset;
  impl->shape = std::move(shape);
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}
}  // namespace

Tensor Tensor::slice(int64_t start, int64_t end) const {
  DDP_CHECK(dim() >= 1, "slice: a 0-dimensional tensor has no rows to slice");
  const int64_t rows = shape()[0];
  DDP_CHECK(0 <= start && start <= end && end <= rows,
            "slice [{}, {}) out of range for a tensor of shape {} (rows 0 to {})", start, end,
            shape_str(shape()), rows);
  Shape s = shape();
  s[0] = end - start;
  const int64_t row_numel = rows == 0 ? 0 : numel() / rows;
  return make_view(*this, storage_offset() + start * row_numel, std::move(s));
}

Tensor Tensor::reshape(const Shape& shape_in) const {
  Shape s = shape_in;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DDP_CHECK(infer < 0, "reshape to {}: only one dimension can be -1", shape_str(shape_in));
      infer = static_cast<int64_t>(i);
    } else {
      DDP_CHECK(s[i] >= 0, "reshape to {}: negative dimension {}", shape_str(shape_in), s[i]);
      known *= s[i];
    }
  }
  if (infer >= 0) {
    DDP_CHECK(known != 0 && numel() % known == 0, "reshape {} to {}: {} elements do not fit",
              shape_str(shape()), shape_str(shape_in), numel());
    s[static_cast<size_t>(infer)] = numel() / known;
  }
  DDP_CHECK(shape_numel(s) == numel(), "reshape {} ({} elements) to {} ({} elements): sizes differ",
            shape_str(shape()), numel(), shape_str(shape_in), shape_numel(s));
  return make_view(*this, storage_offset(), std::move(s));
}

Tensor Tensor::flat_view(int64_t offset, const Shape& shape) const {
  for (int64_t s : shape) {
    DDP_CHECK(s >= 0, "flat_view: negative dimension {} in shape {}", s, shape_str(shape));
  }
  const int64_t n = shape_numel(shape);
  // Not offset + n <= numel(): a huge offset would wrap that sum to a negative.
  DDP_CHECK(offset >= 0 && offset <= numel() && n <= numel() - offset,
            "flat_view of {} elements at offset {} exceeds the {} elements of a tensor of shape {}",
            n, offset, numel(), shape_str(this->shape()));
  return make_view(*this, storage_offset() + offset, shape);
}

Tensor Tensor::to(const Device& device, bool non_blocking) const {
  if (device == this->device()) return *this;
  // A non-blocking copy from a GPU can only land in pinned memory (Note [copy semantics]).
  const bool pinned_result = device.is_cpu() && this->device().is_cuda() && non_blocking;
  Tensor out = empty(shape(), {.dtype = dtype(), .device = device, .pinned = pinned_result});
  copy_(out, *this, non_blocking);
  out.storage()->restore_version(0);  // a new tensor (Note [version counter])
  return out;
}

Tensor Tensor::to(DType dtype) const {
  return dtype == this->dtype() ? *this : cast(*this, dtype);
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), {.dtype = dtype(), .device = device(), .pinned = is_pinned()});
  copy_(out, *this);
  out.storage()->restore_version(0);  // a new tensor (Note [version counter])
  return out;
}

Tensor Tensor::pin_memory() const {
  DDP_CHECK(device().is_cpu(), "pin_memory: only cpu tensors can be pinned, got a tensor on {}",
            device().str());
  Tensor out = empty(shape(), {.dtype = dtype(), .device = Device::cpu(), .pinned = true});
  copy_(out, *this);
  out.storage()->restore_version(0);  // a new tensor (Note [version counter])
  return out;
}

void Tensor::record_stream(const Stream& stream) const {
  const Storage& s = *storage();
  if (s.data() != nullptr && s.allocator() != nullptr)
    s.allocator()->record_stream(s.data(), stream);
}

template <typename T, DType>
std::vector<T> Tensor::to_vector() const {
  DDP_CHECK(DTypeOf<T>::value == dtype(), "to_vector<{}>() on a tensor of dtype {}; cast first",
            dtype_name(DTypeOf<T>::value), dtype_name(dtype()));
  const Tensor host = cpu();
  const T* p = static_cast<const T*>(host.data_ptr());
  return std::vector<T>(p, p + numel());
}

template <typename T, DType>
T Tensor::item() const {
  DDP_CHECK(numel() == 1, "item() needs a tensor with one element, got shape {}",
            shape_str(shape()));
  return to_vector<T>()[0];
}

double Tensor::item_double() const {
  DDP_CHECK(numel() == 1, "item() needs a tensor with one element, got shape {}",
            shape_str(shape()));
  if (dtype() == DType::i64) return static_cast<double>(item<int64_t>());
  return static_cast<double>(cast(*this, DType::f32).item<float>());
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, const TensorOptions& options) {
  DDP_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
            "from_vector: {} values do not fill shape {} ({} elements)", values.size(),
            shape_str(shape), shape_numel(shape));
  Tensor host =
      empty(shape, {.dtype = DTypeOf<T>::value, .device = Device::cpu(), .pinned = options.pinned});
  if (!values.empty()) std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(T));
  return host.to(options.dtype).to(options.device);
}

#define DDP_INSTANTIATE(T)                              \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template T Tensor::item<T>() const;                   \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&, const TensorOptions&);
DDP_INSTANTIATE(float)
DDP_INSTANTIATE(BFloat16)
DDP_INSTANTIATE(Half)
DDP_INSTANTIATE(int32_t)
DDP_INSTANTIATE(int64_t)
DDP_INSTANTIATE(uint8_t)
#undef DDP_INSTANTIATE

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.str();
}

}  // namespace ddp
