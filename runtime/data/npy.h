// NumPy arrays from .npy files and .npz archives (np.save, np.savez,
// np.savez_compressed), read into CPU tensors; and .npy files written from them.
//
// A .npy file is "\x93NUMPY", a version (1.0, 2.0 or 3.0), a header length (u16
// for 1.0, u32 after), a Python dict literal {'descr': '<f4', 'fortran_order':
// False, 'shape': (3, 4), } padded with spaces to a multiple of 64 bytes, then
// the elements in C order. An .npz is a ZIP archive of .npy files, stored or
// deflated; the array's name is the member's name without ".npy".
//
// Note [npy dtypes]: the runtime's dtypes come through as they are (<f4 f32,
// <f2 f16, <i4 i32, <i8 i64, |u1 u8); the others are converted where the value is
// kept: |b1 to u8, |i1 <i2 <u2 <u4 to i64, <f8 to f32 (PyTorch's default float;
// rounded to nearest). Big-endian arrays ('>') are byte-swapped. Refused with the
// conversion to use: fortran_order True, <u8 (values past i64), complex, strings,
// objects. Every malformed file -- a wrong magic, a header that is not the dict,
// a body shorter or longer than the shape says, a ZIP member that fails its CRC --
// throws ValueError naming the file (and the member), the byte offset and what
// was expected there.
#pragma once

#include "runtime/tensor.h"

#include <cstdint>
#include <map>
#include <span>
#include <string>

namespace ddp {

Tensor read_npy(const std::string& path);
// The arrays of an .npz, by name (np.savez(path, x=a, y=b) gives "x" and "y").
std::map<std::string, Tensor> read_npz(const std::string& path);
// Parses the bytes of one .npy; `name` is the file (and member) for messages.
Tensor parse_npy(std::span<const uint8_t> bytes, const std::string& name);

// Writes a CPU or device tensor of any dtype but bf16 (NumPy has none; cast it to
// f32 first) as a version 1.0 .npy, which np.load reads.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace ddp
