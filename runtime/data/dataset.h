// Data sets held in memory on the host: Fashion-MNIST from its IDX files, or a
// generated, learnable synthetic set (no files needed).
//
// A Dataset owns its tensors (Tensor handles; copies of a Dataset share them).
// inputs and labels are CPU tensors; the DataLoader moves batches to a device.
#pragma once

#include "runtime/tensor.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace ddp {

struct Dataset {
  Tensor inputs;  // f32 [N, C, H, W] or [N, D], on the CPU
  // i64 class ids [N] in [0, num_classes) for classification, or targets of any
  // shape [N, ...] and dtype (f32 [N, k] for a k-output regression; num_classes 0).
  Tensor labels;
  int64_t num_classes = 0;
  std::string name;  // "fashion-mnist/train", "synthetic/test", ...

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

enum class Split { train, test };
std::string_view split_name(Split split);  // "train", "test"

// Where Debian's package dataset-fashion-mnist installs the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// Mean and standard deviation of the Fashion-MNIST training pixels scaled to [0, 1].
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir`: inputs f32
// [N, 1, 28, 28] with pixels scaled to [0, 1] then normalized,
// (x / 255 - kFashionMnistMean) / kFashionMnistStd; labels i64 in 0..9.
// Throws ValueError when the files are missing (saying how to install them or to
// use --data synthetic), malformed (see read_idx), or the counts do not match.
Dataset load_fashion_mnist(const std::string& dir, Split split);

// A learnable classification set. Note [synthetic data]: class c has a template
// T_c = row c of randn([num_classes, prod(shape)], seed); sample i has label
// y_i (uniform, from Philox) and input T_{y_i} + noise * z_i, z_i standard normal.
// Labels and noise come from a Philox stream whose key mixes seed and split, so
// the train and test splits of one seed share the templates (the same task) but
// have independent samples. Deterministic for (seed, split, n, shape).
struct SyntheticOptions {
  int64_t n = 1024;  // number of samples
  int64_t num_classes = 10;
  Shape shape = {1, 28, 28};  // of one sample; {D} gives inputs [N, D]
  uint64_t seed = 0;
  float noise = 1.0f;  // standard deviation of the noise; templates have std 1
  Split split = Split::train;
};
Dataset make_synthetic(const SyntheticOptions& options = {});

}  // namespace ddp
