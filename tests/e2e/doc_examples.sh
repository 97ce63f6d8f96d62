#!/usr/bin/env bash
# doc_examples.sh CMAKE BUILD_DIR SOURCE_DIR CXX GENERATOR: the C++ in the docs is
# code that works. Installs the build tree (headers, libraries, the CMake
# package) into a fresh prefix and, as an outside project would:
# - compiles every ```cpp block of docs/api.md and docs/ddp.md as a program of
#   its own and runs it alone (world size 1: the local communicator), expecting
#   exit 0; a block is a whole program, so snippets that are not go in ```text;
# - compiles each tests/e2e/compile_fail/*.cpp, expecting the compilation to
#   fail with the text of its `// expect-error: TEXT` line (misuse named at
#   compile time, such as a float64 tensor).
set -uo pipefail
cmake=$1 build=$2 source=$3 cxx=$4 generator=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "doc_examples.sh: FAIL: $*" >&2; exit 1; }

prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" --component dev >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install"; }

project=$work/src
mkdir -p "$project"
names=()
for doc in docs/api.md docs/ddp.md; do
  stem=$(basename "$doc" .md)
  # Block k of the doc goes to <stem>_<k>.cpp, starting with a #line so that
  # compiler errors name the doc and its line.
  awk -v dir="$project" -v stem="$stem" -v doc="$doc" '
    /^```cpp[[:space:]]*$/ { k++; file = sprintf("%s/%s_%d.cpp", dir, stem, k);
                             printf "#line %d \"%s\"\n", NR + 1, doc > file; inside = 1; next }
    /^```/ && inside { inside = 0; close(file); next }
    inside { print > file }' "$source/$doc"
done
for f in "$project"/*.cpp; do
  [ -e "$f" ] || continue
  grep -q 'int main' "$f" || fail "$(sed -n '1s/.*"\(.*\)"/\1/p' "$f") has a \`\`\`cpp block without main() ($(basename "$f")); make it a whole program or mark it \`\`\`text"
  names+=("$(basename "$f" .cpp)")
done
[ "${#names[@]}" -ge 2 ] || fail "found ${#names[@]} \`\`\`cpp blocks in docs/api.md and docs/ddp.md"
fail_names=()
for f in "$source"/tests/e2e/compile_fail/*.cpp; do
  n=fail_$(basename "$f" .cpp)
  cp "$f" "$project/$n.cpp.in"
  fail_names+=("$n")
done
{
  echo 'cmake_minimum_required(VERSION 3.25)'
  echo 'project(doc_examples LANGUAGES CXX)'
  echo 'set(CMAKE_CXX_STANDARD 20)'
  echo 'set(CMAKE_CXX_STANDARD_REQUIRED ON)'
  echo 'find_package(ddp 0.1 REQUIRED)'
  for n in "${names[@]}"; do
    echo "add_executable($n $n.cpp)"
    echo "target_link_libraries($n PRIVATE ddp::ddp)"
  done
  for n in "${fail_names[@]}"; do
    echo "configure_file($n.cpp.in $n.cpp COPYONLY)"
    echo "add_executable($n EXCLUDE_FROM_ALL \${CMAKE_CURRENT_BINARY_DIR}/$n.cpp)"
    echo "target_link_libraries($n PRIVATE ddp::ddp)"
  done
} >"$project/CMakeLists.txt"

"$cmake" -S "$project" -B "$work/out" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configure"; }
"$cmake" --build "$work/out" --parallel 2 >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "a doc example does not compile (the log above names the doc and line)"; }
for n in "${names[@]}"; do
  # Alone: no launcher variables, so init_process_group gives world size 1.
  code=0
  out=$(cd "$work" && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u MASTER_ADDR -u MASTER_PORT \
    timeout 120 "$work/out/$n" 2>&1) || code=$?
  [ "$code" -eq 0 ] || { printf '%s\n' "$out" >&2; fail "$n exited $code"; }
  echo "doc example $n: ran ($(wc -l <<<"$out") lines of output)"
done
for n in "${fail_names[@]}"; do
  want=$(sed -n 's|^// expect-error: ||p' "$project/$n.cpp.in")
  [ -n "$want" ] || fail "$n.cpp has no // expect-error: line"
  if "$cmake" --build "$work/out" --target "$n" >"$work/$n.log" 2>&1; then
    fail "$n compiled, but it must not: $want"
  fi
  grep -qF -- "$want" "$work/$n.log" || { cat "$work/$n.log" >&2; fail "$n failed without '$want'"; }
  echo "compile-fail $n: rejected with '$want'"
done
echo "doc_examples.sh: ok (${#names[@]} doc examples compiled and ran, ${#fail_names[@]} misuses rejected)"
