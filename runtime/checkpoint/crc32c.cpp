#include "runtime/checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ddp {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // 0x1EDC6F41, bit-reversed

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t sse42_crc32c(const void* data, size_t bytes,
                                                        uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; bytes > 0; --bytes, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

bool have_sse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

namespace crc32c_detail {
uint32_t table_crc32c(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < bytes; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}
}  // namespace crc32c_detail

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
#if defined(__x86_64__)
  if (have_sse42()) return sse42_crc32c(data, bytes, crc);
#endif
  return crc32c_detail::table_crc32c(data, bytes, crc);
}

}  // namespace ddp
