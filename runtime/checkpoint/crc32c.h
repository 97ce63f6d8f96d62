// CRC-32C (Castagnoli, the polynomial of iSCSI, ext4 and LevelDB's checksums):
// the per-tensor checksum of ddp's checkpoints (Note [checkpoint checksums] in
// safetensors.cpp). On x86 with SSE4.2 it runs on the CPU's crc32 instruction
// (about 8 bytes per 3 cycles); elsewhere a table, a byte at a time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddp {

// The CRC-32C of `bytes` bytes at `data`, continuing from `crc` (0 to start):
// crc32c(ab) == crc32c(b, crc32c(a)). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

namespace crc32c_detail {
// The portable path, always compiled, so tests compare it with the fast one.
uint32_t table_crc32c(const void* data, size_t bytes, uint32_t crc);
}  // namespace crc32c_detail

}  // namespace ddp
