// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors),
// which PyTorch, JAX and the Hugging Face tools read:
//
//   8 bytes    N, the header length, a little-endian u64
//   N bytes    UTF-8 JSON: {"__metadata__": {"key": "value", ...},
//                           "name": {"dtype": "F32", "shape": [2, 3],
//                                    "data_offsets": [begin, end]}, ...}
//              padded with spaces so that N is a multiple of 8
//   the rest   the tensors' raw little-endian bytes; offsets count from here
//
// ddp writes the tensors in the order given, back to back, and "__metadata__"
// first (left out when there is none); dtypes F32, BF16, F16, I32, I64, U8.
#pragma once

#include "runtime/tensor.h"

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes `tensors` (any devices; GPU tensors are copied to the host one at a time)
// and `metadata` to `path`, atomically: the bytes go to `path.tmp.<pid>`, which is
// flushed, fsync'ed and renamed over `path`, and then the directory is fsync'ed.
// A reader sees the old file or the new one, never a partial one.
// Throws ValueError for a duplicate, reserved ("__metadata__") or non-UTF-8 name
// or an undefined tensor (before anything is written), and for an I/O failure,
// naming the path and the system's reason; the temporary file is removed then
// and an existing `path` is left as it was.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // CPU tensors, in the order of their data in the file
  std::map<std::string, std::string> metadata;

  bool contains(std::string_view name) const;
  // Throws ValueError naming the tensor and listing the ones present.
  const Tensor& at(std::string_view name) const;
};

// Reads a whole file. Throws ValueError naming the file and the problem: cannot
// be opened, shorter than 8 bytes, a header length beyond the file (or above
// 100 MB), a header that is not JSON or not a safetensors header, an unknown
// dtype, a shape or offsets that do not agree with the dtype's size, offsets out
// of range, overlapping, or leaving gaps or trailing bytes in the data section.
SafetensorsFile load_safetensors(const std::string& path);

// "F32", "BF16", "F16", "I32", "I64", "U8".
std::string_view safetensors_dtype_name(DType dtype);

// What a model expects to load: a name, a shape and a dtype per tensor.
struct TensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
};
std::vector<TensorSpec> tensor_specs(const NamedTensors& tensors);

// Throws one ValueError listing every problem, in PyTorch's words:
//   Error(s) in loading state_dict:
//     Missing key(s) in state_dict: "2.weight", "2.bias".
//     Unexpected key(s) in state_dict: "3.weight".
//     size mismatch for 0.weight: copying a param with shape [256, 784] from
//       checkpoint, the shape in current model is [128, 784].
//     dtype mismatch for 0.bias: the checkpoint has bf16, the current model has f32.
// Returns normally when names, shapes and dtypes all match (order is free).
void check_state_dict_match(const std::vector<TensorSpec>& expected, const NamedTensors& loaded);

}  // namespace ddp
