// fmt, with its formatting engine compiled once: include this, not <fmt/format.h>.
//
// Note [fmt's engine in every object]: fmt 9 (Debian 12's) defines
// detail::vformat_to<char>, the engine behind fmt::format_to, spdlog's log
// calls and every formatter, as a template in format.h and declares no extern
// instantiation of it, although libfmt.so exports one. So every object file that
// formats anything compiled its own copy of the engine (integer, float and
// dragon4 writers, about 700 KB of code under ASan): two thirds of the code of a
// file such as trainer/epoch.cpp, and half of its compile time (measured on an
// AVX2 EPYC under ASan -O1: tcp_store.cpp 24.2 -> 10.8 s). Declaring the
// instantiation extern here makes each object call the library's copy instead.
// fmt 10 declares it itself; a header-only fmt has no library to call.
// runtime/logging.h includes this before spdlog, and the test
// lint.fmt_engine_compiled_once checks that no library or program of ours defines it
// (and CI's CPU-only phase its own).
#pragma once

#include <fmt/format.h>

#if FMT_VERSION >= 90000 && FMT_VERSION < 100000 && !defined(FMT_HEADER_ONLY)
FMT_BEGIN_NAMESPACE
FMT_BEGIN_DETAIL_NAMESPACE
extern template FMT_API void vformat_to<char>(buffer<char>& buf, basic_string_view<char> fmt,
                                              basic_format_args<FMT_BUFFER_CONTEXT(char)> args,
                                              locale_ref loc);
FMT_END_DETAIL_NAMESPACE
FMT_END_NAMESPACE
#endif
