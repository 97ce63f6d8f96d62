#!/usr/bin/env bash
# fmt_engine_once.sh FILE...: fails if an archive or program of ours defines fmt's
# formatting engine, fmt::detail::vformat_to<char>, which libfmt.so already exports
# (Note [fmt's engine in every object] in runtime/fmt.h). A file that includes
# <fmt/format.h> (or spdlog) before runtime/fmt.h compiles its own copy again, about
# 700 KB of code and half the file's compile time under ASan; this names it.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: fmt_engine_once.sh ARCHIVE_OR_PROGRAM..." >&2; exit 2; }
fail=0
for file in "$@"; do
  # -A names the member object of an archive; W/T: a (weak) definition in it, t: a
  # local copy (an optimised clone, "[clone .constprop.0]").
  symbols=$(nm -A -C --defined-only "$file") || { echo "FAIL: nm could not read $file" >&2; exit 1; }
  found=$(grep -E ' [WTt] void fmt::v[0-9]+::detail::vformat_to<char>\(' <<<"$symbols" |
    sed -E 's/:[0-9a-f]+ [WTt] .*//' | sort -u)
  if [ -n "$found" ]; then
    echo "FAIL: fmt's engine is compiled into:" >&2
    while read -r object; do echo "  $object" >&2; done <<<"$found"
    fail=1
  else
    echo "ok: $(basename "$file") calls libfmt's engine"
  fi
done
[ "$fail" = 0 ] || echo "include \"runtime/fmt.h\" (not <fmt/format.h>, and before spdlog) in those sources" >&2
exit "$fail"
