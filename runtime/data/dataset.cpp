#include "runtime/data/dataset.h"

#include "runtime/data/idx.h"
#include "runtime/rng/philox.h"

#include <filesystem>

namespace ddp {
namespace {

constexpr int64_t kFashionMnistClasses = 10;

std::string missing_data_hint() {
  return fmt::format(
      "Install Fashion-MNIST with `apt-get install dataset-fashion-mnist` (files under {}), point "
      "to a directory holding the four *-ubyte.gz files, or train on generated data with "
      "`--data synthetic`",
      kFashionMnistDir);
}

// dir/name.gz, else dir/name (uncompressed), else a ValueError with the install hint.
std::string find_idx_file(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DDP_CHECK(fs::is_directory(dir, ec), "Fashion-MNIST not found: directory '{}' does not exist. {}",
            dir, missing_data_hint());
  const fs::path gz = fs::path(dir) / (name + ".gz");
  if (fs::exists(gz, ec)) return gz.string();
  const fs::path raw = fs::path(dir) / name;
  if (fs::exists(raw, ec)) return raw.string();
  throw ValueError(fmt::format("Fashion-MNIST not found: '{}' has no {} (nor {}). {}", dir,
                               gz.filename().string(), name, missing_data_hint()));
}

Tensor normalized_pixels(const IdxArray& images) {
  Tensor out = empty({images.dims[0], 1, images.dims[1], images.dims[2]});
  float* dst = out.data<float>();
  const float scale = 1.0f / (255.0f * kFashionMnistStd);
  const float shift = kFashionMnistMean / kFashionMnistStd;
  for (size_t i = 0; i < images.data.size(); ++i) dst[i] = images.data[i] * scale - shift;
  return out;
}

Tensor checked_labels(const IdxArray& labels, const std::string& path) {
  Tensor out = empty({labels.dims[0]}, {.dtype = DType::i64});
  int64_t* dst = out.data<int64_t>();
  for (size_t i = 0; i < labels.data.size(); ++i) {
    DDP_CHECK(labels.data[i] < kFashionMnistClasses, "{}: label {} at index {} is not a class 0..9",
              path, labels.data[i], i);
    dst[i] = labels.data[i];
  }
  return out;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The Philox key of a split's labels and noise (Note [synthetic data]).
uint64_t sample_key(uint64_t seed, Split split) {
  return splitmix64(seed ^ (split == Split::train ? 0x747261696eull : 0x74657374ull));
}

void check_synthetic_options(const SyntheticOptions& o) {
  DDP_CHECK(o.n >= 0, "make_synthetic: n must be >= 0, got {}", o.n);
  DDP_CHECK(o.num_classes >= 1, "make_synthetic: num_classes must be >= 1, got {}", o.num_classes);
  DDP_CHECK(!o.shape.empty(), "make_synthetic: the sample shape must have at least one dimension");
  for (int64_t s : o.shape) {
    DDP_CHECK(s > 0, "make_synthetic: sample shape {} has a non-positive size", shape_str(o.shape));
  }
  DDP_CHECK(o.noise >= 0.0f, "make_synthetic: noise must be >= 0, got {}", o.noise);
}

}  // namespace

std::string_view split_name(Split split) {
  return split == Split::train ? "train" : "test";
}

Dataset load_fashion_mnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const std::string images_path = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  const IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);
  DDP_CHECK(images.dims.size() == 3 && images.dims[1] == 28 && images.dims[2] == 28,
            "{}: expected Fashion-MNIST images of N x 28 x 28 (magic 0x{:08x}), found {}",
            images_path, kIdxMagicImages, shape_str(images.dims));
  DDP_CHECK(labels.dims.size() == 1, "{}: expected labels (1 dimension, magic 0x{:08x}), found {}",
            labels_path, kIdxMagicLabels, shape_str(labels.dims));
  DDP_CHECK(images.dims[0] == labels.dims[0],
            "Fashion-MNIST {} split in '{}': {} images but {} labels; the files do not belong "
            "together (reinstall dataset-fashion-mnist)",
            split_name(split), dir, images.dims[0], labels.dims[0]);
  return Dataset{.inputs = normalized_pixels(images),
                 .labels = checked_labels(labels, labels_path),
                 .num_classes = kFashionMnistClasses,
                 .name = fmt::format("fashion-mnist/{}", split_name(split))};
}

Dataset make_synthetic(const SyntheticOptions& o) {
  check_synthetic_options(o);
  const int64_t d = shape_numel(o.shape);
  const Tensor templates = randn({o.num_classes, d}, o.seed);
  const uint64_t key = sample_key(o.seed, o.split);
  Tensor inputs = randn({o.n, d}, key);  // the noise z, turned into inputs in place
  Tensor labels = empty({o.n}, {.dtype = DType::i64});
  // Labels continue the noise's Philox stream (Note [rng stream]).
  const uint64_t label_counter = rng::philox_counters(static_cast<uint64_t>(o.n * d));
  const float* t = templates.data<float>();
  float* x = inputs.data<float>();
  int64_t* y = labels.data<int64_t>();
  for (int64_t i = 0; i < o.n; ++i) {
    const uint32_t word =
        rng::philox_block(key, label_counter + static_cast<uint64_t>(i) / 4).v[i % 4];
    y[i] = static_cast<int64_t>(word % static_cast<uint64_t>(o.num_classes));
    const float* row = t + y[i] * d;
    for (int64_t j = 0; j < d; ++j) x[i * d + j] = row[j] + o.noise * x[i * d + j];
  }
  Shape shape = {o.n};
  shape.insert(shape.end(), o.shape.begin(), o.shape.end());
  return Dataset{.inputs = inputs.reshape(shape),
                 .labels = labels,
                 .num_classes = o.num_classes,
                 .name = fmt::format("synthetic/{}", split_name(o.split))};
}

}  // namespace ddp
