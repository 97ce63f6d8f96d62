#!/usr/bin/env bash
# Makes, on a machine with the build's packages (no GPU needed), the folder that
# `bench/gpu/run.sh --prebuilt DIR` runs on a GPU machine that lacks them. See
# --help and docs/building.md ("Checking the GPU path").
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

usage() {
  cat <<'EOF'
usage: bench/gpu/prepare.sh [options]

Builds the programs and the gpu tests of a CUDA build here and packs them, with
the shared libraries a GPU machine lacks, into one folder (default .gpu-carry in
the repository, which .git/info/exclude lists) of about 40 MiB:

  ddp.tar.xz   one relocatable folder ddp/ (run.sh unpacks it; OpenBLAS alone is
               37 MB unpacked, so it travels compressed):
                 bin/  train, bench, ddprun, scale, sample, ddp_gpu_tests, ddp_unit_tests;
                       stripped, RUNPATH $ORIGIN/../lib and the CUDA toolkit's folders
                 lib/  every shared library they load except glibc and CUDA's
                       (cudart, cuBLAS, NCCL, the driver), which the GPU machine
                       provides: spdlog, fmt, OpenBLAS, gfortran, Open MPI, gloo, ...
                       (the cpack bundle's rule, cmake/bundle_runtime_deps.cmake),
                       each with RUNPATH $ORIGIN
                 share/ddp/  the PyTorch peer (as installed)
  data/fashion-mnist/  the four IDX .gz files, for train --data
  BUILD_INFO   version, commit, CUDA architectures, build type, glibc

Before packing it checks ddp/ as the GPU machine will see it: with LD_LIBRARY_PATH
unset, ldd resolves every library inside it or to glibc and CUDA; as root, the
programs also run in a chroot of only that folder, glibc and the CUDA libraries
(train on the CPU, ddprun with two ranks, the gpu tests skipping). On the GPU
machine (carry .gpu-carry along with the repository):

  bench/gpu/run.sh --prebuilt .gpu-carry

options:
  --build-dir DIR   a CUDA build of this repository (default: build); must include --arch
  --arch N          the GPU machine's architecture (default: 90, H100/H200)
  --out DIR         the folder (default: .gpu-carry in the repository root)
  --data DIR        Fashion-MNIST to carry (default: /usr/share/datasets/fashion-mnist)
  --no-data         carry no data set (run.sh then needs --data on the GPU machine)
  --no-build        take the programs as they are in --build-dir
  --keep-unpacked   leave ddp/ unpacked next to ddp.tar.xz (for looking inside;
                    do not carry it so)
  --max-mib N       fail when the folder is larger (default: 60; a device machine
                    takes 64 MiB with the working tree)
  --no-chroot       skip the chroot check
  -h, --help        this help
EOF
}

build="$repo_root/build" arch=90 out="$repo_root/.gpu-carry" data=/usr/share/datasets/fashion-mnist
with_data=1 do_build=1 max_mib=60 chroot_check=1 keep_unpacked=0
die() { echo "prepare.sh: $*" >&2; exit 1; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || { echo "prepare.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) need_value "$@"; build="$2"; shift 2 ;;
    --arch) need_value "$@"; arch="$2"; shift 2 ;;
    --out) need_value "$@"; out="$2"; shift 2 ;;
    --data) need_value "$@"; data="$2"; shift 2 ;;
    --no-data) with_data=0; shift ;;
    --no-build) do_build=0; shift ;;
    --max-mib) need_value "$@"; max_mib="$2"; shift 2 ;;
    --no-chroot) chroot_check=0; shift ;;
    --keep-unpacked) keep_unpacked=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "prepare.sh: unknown option '$1'; valid: --build-dir, --arch, --out, --data, --no-data," \
         "--no-build, --keep-unpacked, --max-mib, --no-chroot, --help" >&2; exit 2 ;;
  esac
done
[[ "$max_mib" =~ ^[0-9]+$ ]] || die "--max-mib '$max_mib': expected a whole number of MiB"
command -v patchelf >/dev/null || die "patchelf is needed (apt-get install patchelf, or deploy/install-deps.sh)"
command -v xz >/dev/null || die "xz is needed (apt-get install xz-utils)"
unset LD_LIBRARY_PATH # resolve as the GPU machine will: RUNPATH and the system's paths only

# ---- the build: CUDA, with the GPU machine's architecture ------------------------
config="$build/generated/ddp/config.h"
[[ -f "$config" ]] || die "$build is not a configured build of ddp (no $config). Configure one:
  cmake -S . -B build-gpu -G Ninja -DDDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$arch -DCMAKE_BUILD_TYPE=Release"
grep -q '^#define DDP_HAVE_CUDA 1' "$config" ||
  die "$build was configured without CUDA (DDP_HAVE_CUDA 0): configure with -DDDP_CUDA=ON (needs nvcc)"
archs=$(sed -nE 's/^#define DDP_CUDA_ARCHITECTURES "(.*)"/\1/p' "$config")
[[ ",${archs//-real/}," == *",$arch,"* ]] ||
  die "$build compiles CUDA for $archs, not $arch: reconfigure with -DCMAKE_CUDA_ARCHITECTURES=$arch (or pass --arch)"
programs=(train bench ddprun scale sample)
tests=(ddp_gpu_tests ddp_unit_tests)
if [[ $do_build -eq 1 ]]; then
  echo "prepare.sh: building ${programs[*]} ${tests[*]} in $build"
  cmake --build "$build" --target "${programs[@]}" "${tests[@]}"
fi
for t in "${programs[@]}" ddp_gpu_tests; do
  [[ -x "$build/bin/$t" ]] || die "$build/bin/$t is missing (build it, or drop --no-build)"
done

# ---- install into a staging folder: programs (stripped) + bundled libraries ---------
rm -rf "$out"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage="$work/ddp"
cmake --install "$build" --prefix "$stage" --component runtime --strip >/dev/null
cmake --install "$build" --prefix "$stage" --component bundle >"$work/bundle.log" 2>&1 ||
  { cat "$work/bundle.log" >&2; die "the bundle step failed"; }
rpath=$(patchelf --print-rpath "$stage/bin/train")

# The libraries left to the GPU machine (cmake/bundle_runtime_deps.cmake's list).
target_lib='^(ld-linux|linux-vdso|libc\.so|libm\.so|libmvec\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnsl\.so|libnss_|libthread_db\.so|libBrokenLocale\.so|libc_malloc_debug\.so|libcuda\.so|libnvidia-|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'

# add_program SRC: copies a build-tree program into bin/, stripped, with the
# installed programs' RUNPATH.
add_program() {
  local dest
  dest="$stage/bin/$(basename "$1")"
  cp "$1" "$dest"
  strip --strip-unneeded "$dest"
  patchelf --set-rpath "$rpath" "$dest"
}
add_program "$build/bin/ddp_gpu_tests"
[[ -x "$build/bin/ddp_unit_tests" ]] && add_program "$build/bin/ddp_unit_tests"

# bundle_missing: copies every library the programs load from outside the folder
# (and not left to the target) into lib/, until none is left (the test binaries
# may need one the installed programs do not).
bundle_missing() {
  local exe name path round copied
  for round in 1 2 3 4 5; do
    copied=0
    for exe in "$stage"/bin/*; do
      while read -r name path; do
        [[ "$name" =~ $target_lib ]] && continue
        path=$(realpath -m -s "$path")
        [[ "$path" == "$stage"/lib/* || -e "$stage/lib/$name" ]] && continue
        cp -L "$path" "$stage/lib/$name"
        # shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader
        patchelf --set-rpath '$ORIGIN' "$stage/lib/$name"
        echo "prepare.sh: bundled $name (from $path, needed by $(basename "$exe"))"
        copied=1
      done < <(ldd "$exe" | sed -nE 's/^\s*(\S+) => (\/\S+) \(0x[0-9a-f]+\)$/\1 \2/p')
    done
    [[ $copied -eq 0 ]] && return 0
  done
  die "libraries still missing after $round rounds"
}
bundle_missing

# ---- build information and data ------------------------------------------------------
commit=$(git -C "$repo_root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$repo_root" diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted"
{
  echo "# Made by bench/gpu/prepare.sh; on a GPU machine: bench/gpu/run.sh --prebuilt <this folder>"
  echo "version=$(sed -nE 's/^#define DDP_VERSION "(.*)"/\1/p' "$config")"
  echo "commit=$commit"
  echo "built=$(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -srm)"
  echo "cuda_archs=$archs"
  echo "build_type=$(sed -nE 's/^CMAKE_BUILD_TYPE:STRING=(.*)/\1/p' "$build/CMakeCache.txt")"
  echo "nvcc=$(sed -nE 's/^CMAKE_CUDA_COMPILER_VERSION:[A-Z]*=(.*)/\1/p' "$build/CMakeCache.txt" | head -1)"
  grep -E '^#define DDP_HAVE_(NCCL|MPI|GLOO) ' "$config" | sed -E 's/^#define DDP_HAVE_([A-Z]+) /have_\L\1\E=/'
  echo "glibc=$(ldd --version | head -1 | awk '{ print $NF }') (the GPU machine needs this or newer)"
} >"$stage/BUILD_INFO"
cp "$stage/BUILD_INFO" "$out/BUILD_INFO"
if [[ $with_data -eq 1 ]]; then
  mkdir -p "$out/data/fashion-mnist"
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [[ -s "$data/$f.gz" ]] || die "$data/$f.gz is missing (apt-get install dataset-fashion-mnist, or --data DIR, or --no-data)"
    cp "$data/$f.gz" "$out/data/fashion-mnist/"
  done
fi

# ---- checks: as the GPU machine sees it ----------------------------------------------
# CUDA's own libraries (target_lib) may be missing here and present there; anything
# else not found, or found outside the folder, is a defect.
outside="$work/outside"
: >"$outside"
for exe in "$stage"/bin/*; do
  ldd_out=$(ldd "$exe")
  while read -r name; do
    [[ "$name" =~ $target_lib ]] || { echo "$ldd_out" >&2; die "$(basename "$exe"): $name is not found"; }
  done < <(sed -nE 's/^\s*(\S+) => not found.*/\1/p' <<<"$ldd_out")
  while read -r name path; do
    path=$(realpath -m -s "$path") # $ORIGIN/../lib/x stays inside; symlinks are kept (the chroot mounts them)
    [[ "$path" == "$stage"/lib/* ]] && continue
    [[ "$name" =~ $target_lib ]] || die "$(basename "$exe") loads $name from $path, outside the folder"
    echo "$path" >>"$outside"
  done < <(sed -nE 's/^\s*(\S+) => (\/\S+) \(0x[0-9a-f]+\)$/\1 \2/p' <<<"$ldd_out")
  sed -nE 's/^\s*(\/\S*ld-linux\S*) \(0x[0-9a-f]+\)$/\1/p' <<<"$ldd_out" >>"$outside"
done
for f in "$stage"/lib/*; do
  [[ "$(basename "$f")" =~ ^(ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so) ]] &&
    die "the folder carries glibc's $(basename "$f")"
done
echo "prepare.sh: ldd: $(find "$stage/bin" -type f | wc -l) programs load $(find "$stage/lib" -name '*.so*' | wc -l)" \
  "libraries from the folder, and from the GPU machine only: $(sort -u "$outside" | xargs -n1 basename | tr '\n' ' ')"

# The programs in a root holding nothing but the folder, the data and the libraries above.
if [[ $chroot_check -eq 1 ]]; then
  if [[ "$(id -u)" -ne 0 ]] || ! command -v unshare >/dev/null || ! unshare -m true 2>/dev/null; then
    echo "prepare.sh: chroot check skipped: needs root and mount namespaces (unshare -m)"
  else
    root="$work/root"
    mkdir -p "$root/ddp" "$root/data" "$root/dev/shm" "$root/proc" "$root/tmp"
    touch "$root/dev/null"
    # Each library left to the target is bind-mounted at its own path (as tests/e2e/bundle.sh does).
    mounts="mount --bind '$stage' '$root/ddp'"
    [[ $with_data -eq 1 ]] && mounts+=" && mount --bind '$out/data' '$root/data'"
    while read -r p; do
      mounts+=" && mkdir -p '$root$(dirname "$p")' && touch '$root$p' && mount --bind '$p' '$root$p'"
    done < <(sort -u "$outside")
    mounts+=" && mount --bind /dev/null '$root/dev/null' && mount -t tmpfs tmpfs '$root/dev/shm'"
    mounts+=" && mount -t proc proc '$root/proc'"
    # in_chroot CMD...: runs CMD (its paths inside the chroot) in a private mount namespace.
    in_chroot() {
      local cmd
      printf -v cmd '%q ' "$@"
      unshare -m --propagation private sh -c "set -e; $mounts; cd '$root'; exec chroot '$root' $cmd" \
        >"$work/chroot.log" 2>&1 || { cat "$work/chroot.log" >&2; die "in the chroot: $* failed"; }
      echo "prepare.sh: chroot: $*: $(grep -v '^\s*$' "$work/chroot.log" | tail -1)"
    }
    train_data=(--data synthetic --synthetic-size 512)
    [[ $with_data -eq 1 ]] && train_data=(--data /data/fashion-mnist)
    in_chroot /ddp/bin/train "${train_data[@]}" --epochs 1 --max-steps 20 --device cpu --quiet
    in_chroot /ddp/bin/ddprun --standalone -n 2 /ddp/bin/train --data synthetic --synthetic-size 512 --epochs 1 \
      --device cpu --quiet
    in_chroot /ddp/bin/ddp_gpu_tests --gtest_brief=1
    echo "prepare.sh: chroot check ok: nothing outside the folder but glibc and CUDA's libraries was used"
  fi
fi

# ---- pack, check the size, keep the folder out of git ---------------------------------
tar -cf - -C "$work" ddp | xz -T0 -6 >"$out/ddp.tar.xz"
[[ $keep_unpacked -eq 1 ]] && cp -a "$stage" "$out/ddp"
size_mib() { du -sm "$1" | cut -f1; }
size=$(size_mib "$out")
[[ $size -le $max_mib ]] || die "$out is $size MiB, over --max-mib $max_mib"
case "$out/" in
  "$repo_root"/*)
    entry="/${out#"$repo_root"/}/"
    exclude=$(git -C "$repo_root" rev-parse --git-path info/exclude)
    [[ "$exclude" == /* ]] || exclude="$repo_root/$exclude"
    mkdir -p "$(dirname "$exclude")"
    grep -qxF "$entry" "$exclude" 2>/dev/null || { echo "$entry" >>"$exclude"; echo "prepare.sh: added $entry to $exclude"; }
    ;;
esac
echo "prepare.sh: $out: $size MiB (ddp.tar.xz $(du -h "$out/ddp.tar.xz" | cut -f1), unpacked $(du -sh "$stage" | cut -f1);" \
  "build $commit, CUDA archs $archs)"
echo "prepare.sh: on the GPU machine: bench/gpu/run.sh --prebuilt ${out#"$repo_root"/}"
