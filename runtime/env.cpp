#include "runtime/env.h"

#include "runtime/error.h"

#include <charconv>
#include <cstdlib>

namespace ddp::env {

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<int64_t> get_int(const char* name) {
  auto text = get(name);
  if (!text) return std::nullopt;
  int64_t value = 0;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  DDP_CHECK(ec == std::errc() && ptr == end,
            "environment variable {}='{}' is not an integer; set it to a whole number or unset it",
            name, *text);
  return value;
}

std::optional<double> get_double(const char* name) {
  auto text = get(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text->c_str(), &end);
  DDP_CHECK(end == text->c_str() + text->size(),
            "environment variable {}='{}' is not a number; set it to a number or unset it", name,
            *text);
  return value;
}

}  // namespace ddp::env
