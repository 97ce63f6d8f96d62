#!/usr/bin/env bash
# default_build_flags.sh SOURCE_DIR GENERATOR: configures SOURCE_DIR as the README's
# main command does (no build type, no flags) and checks that the C++ code compiles
# with -O3 (CMakeLists.txt: the CPU kernels rely on GCC's full vectorizer); a flag
# given on the command line must stay. Configures only (about 2 s), builds nothing.
set -uo pipefail
src=$1 generator=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
configure() { # BUILD_DIR [ARGS...]
  local dir=$1
  shift
  cmake -S "$src" -B "$dir" -G "$generator" -DDDP_CUDA=OFF -DDDP_BUILD_TESTS=OFF "$@" >"$dir.log" 2>&1 || {
    cat "$dir.log"
    echo "default_build_flags: configuring $src failed" >&2
    exit 1
  }
}
cache() { sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt"; }
fail=0
configure "$work/default"
type=$(cache "$work/default" CMAKE_BUILD_TYPE)
flags=$(cache "$work/default" CMAKE_CXX_FLAGS_RELWITHDEBINFO)
echo "default: build type '$type', RelWithDebInfo flags '$flags'"
[[ $type == RelWithDebInfo ]] || { echo "FAIL: default build type '$type', expected RelWithDebInfo" >&2; fail=1; }
[[ " $flags " == *" -O3 "* && " $flags " != *" -O2 "* ]] ||
  { echo "FAIL: default RelWithDebInfo flags '$flags' do not optimise with -O3" >&2; fail=1; }
configure "$work/given" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g"
given=$(cache "$work/given" CMAKE_CXX_FLAGS_RELWITHDEBINFO)
echo "given -O1 -g: RelWithDebInfo flags '$given'"
[[ $given == "-O1 -g" ]] || { echo "FAIL: the user's flags '-O1 -g' became '$given'" >&2; fail=1; }
[[ $fail -eq 0 ]] && echo "default_build_flags: ok"
exit "$fail"
