// IDX files (the format of MNIST and Fashion-MNIST): a big-endian header
// (magic 0x0000TTNN: type TT, NN dimensions; then NN u32 sizes) and the raw data.
//
// read_idx reads a gzip-compressed file (through zlib) or an uncompressed one
// (zlib reads those transparently). Only u8 data (type 0x08) with 1 dimension
// (labels, magic 0x00000801) or 3 dimensions (images, magic 0x00000803) is
// accepted. Any problem -- a missing file, a wrong magic, a truncated or
// oversized body, a corrupt gzip stream -- throws ValueError naming the file,
// what was expected and what was found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // product(dims) bytes, row-major
};

inline constexpr uint32_t kIdxMagicLabels = 0x00000801;  // u8, 1 dimension
inline constexpr uint32_t kIdxMagicImages = 0x00000803;  // u8, 3 dimensions

IdxArray read_idx(const std::string& path);

}  // namespace ddp
