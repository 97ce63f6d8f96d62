#!/usr/bin/env bash
# bundle.sh CPACK BUILD_DIR: makes the relocatable bundle (cpack, TGZ), unpacks
# it, moves the unpacked folder elsewhere and checks, with LD_LIBRARY_PATH unset:
#  1. ldd of each program resolves every library either inside the bundle or to
#     one the bundle leaves to the target on purpose (glibc; the CUDA toolkit
#     and driver), and nothing is "not found";
#  2. the bundle holds no glibc library, and no program needs a CUDA library
#     from the target to start;
#  3. `bin/ddprun -n 2 bin/train --data synthetic --epochs 1` trains;
#  4. as root, the same run inside a chroot that holds only the bundle and the
#     libraries of (1) left to the target: proof that no -dev package (or any
#     other file of this machine) is used. Without root or mount namespaces this
#     step is skipped and says so; 1-3 still decide the verdict.
set -uo pipefail
cpack=$1 build=$2
work=$(mktemp -d)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "bundle.sh: FAIL: $*" >&2; exit 1; }
unset LD_LIBRARY_PATH

if ! command -v patchelf >/dev/null; then
  echo "bundle.sh: SKIP: patchelf is not installed (apt-get install patchelf, or deploy/install-deps.sh)"
  exit 77
fi

# The libraries a target machine is expected to provide (cmake/bundle_runtime_deps.cmake).
target_lib='^(ld-linux|linux-vdso|libc\.so|libm\.so|libmvec\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnsl\.so|libnss_|libthread_db\.so|libBrokenLocale\.so|libc_malloc_debug\.so|libcuda\.so|libnvidia-|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'

t0=$SECONDS
"$cpack" -G TGZ --config "$build/CPackConfig.cmake" -B "$work/pkg" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; fail "cpack failed"; }
tarball=$(find "$work/pkg" -maxdepth 1 -name 'ddp-*.tar.gz' -print -quit)
[ -n "$tarball" ] || { cat "$work/cpack.log" >&2; fail "cpack made no ddp-*.tar.gz"; }
mkdir "$work/unpacked" "$work/moved"
tar -xzf "$tarball" -C "$work/unpacked" || fail "cannot unpack $tarball"
top=$(find "$work/unpacked" -mindepth 1 -maxdepth 1 -type d -print -quit)
# Moved after unpacking: nothing may depend on where cpack or tar put it.
mv "$top" "$work/moved/ddp" || fail "cannot move the unpacked bundle"
rm -rf "$work/unpacked" "$work/pkg/_CPack_Packages"
b=$work/moved/ddp
echo "bundle $(basename "$tarball"): $(du -sh "$tarball" | cut -f1) packed, $(find "$b/lib" -maxdepth 1 -name '*.so*' | wc -l) libraries, made in $((SECONDS - t0)) s"

# 1. ldd: every library from the bundle or left to the target.
: >"$work/outside"
for exe in "$b"/bin/*; do
  # bin/ddp-load is a Python script (python/ddp_checkpoint.py): no libraries to resolve.
  [ "$(head -c 4 "$exe" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  ldd_out=$(ldd "$exe") || fail "ldd $exe failed"
  grep -q 'not found' <<<"$ldd_out" && { echo "$ldd_out" >&2; fail "$(basename "$exe"): a library is not found"; }
  while read -r name path; do
    path=$(realpath -m -s "$path")  # $ORIGIN gives .../bin/../lib/...
    case "$path" in
      "$b"/lib/*) ;;
      *) grep -qE "$target_lib" <<<"$name" ||
           fail "$(basename "$exe") loads $name from $path, outside the bundle"
         echo "$path" >>"$work/outside" ;;
    esac
  done < <(sed -nE 's/^\s*(\S+) => (\S+) \(0x[0-9a-f]+\)$/\1 \2/p' <<<"$ldd_out")
  interp=$(sed -nE 's/^\s*(\/\S*ld-linux\S*) \(0x[0-9a-f]+\)$/\1/p' <<<"$ldd_out")
  [ -n "$interp" ] && echo "$interp" >>"$work/outside"
  echo "ldd $(basename "$exe"): $(grep -c " => $b/bin/../lib/" <<<"$ldd_out") libraries from the bundle"
done

# No program needs a CUDA library to start (runtime/dynamic_library.h): none is
# left to the target, so the chroot run of step 4 has none at all.
if grep -E '/lib(cudart|cublas|cublasLt|nccl)\.so' "$work/outside"; then
  fail "the programs need CUDA libraries from the target to start (listed above)"
fi

# 2. No glibc inside.
for f in "$b"/lib/*; do
  grep -qE '^(ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so)' <<<"$(basename "$f")" &&
    fail "the bundle carries glibc's $(basename "$f")"
done

# 3. The documented command, from the moved folder.
train_args=(--data synthetic --epochs 1 --synthetic-size 2000)
output=$(cd "$work" && "$b/bin/ddprun" --standalone -n 2 "$b/bin/train" "${train_args[@]}" 2>&1)
status=$?
printf '%s\n' "$output" | tail -4
[ "$status" -eq 0 ] || { printf '%s\n' "$output" >&2; fail "bin/ddprun -n 2 bin/train exited $status"; }
grep -q '^\[rank 0\] summary:' <<<"$output" || fail "no summary line from rank 0"

# 4. A root with nothing but the bundle and the target's libraries.
if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null || ! unshare -m true 2>/dev/null; then
  echo "bundle.sh: chroot check skipped: needs root and mount namespaces (unshare -m)"
  echo "bundle.sh: ok (ldd and run from a moved folder)"
  exit 0
fi
root=$work/root
mkdir -p "$root/opt" "$root/dev/shm" "$root/proc" "$root/tmp"
mv "$b" "$root/opt/ddp"
# Each library left to the target is bind-mounted at its own path (the CUDA ones
# can be large); glibc's dynamic loader and /dev/null likewise.
mounts=$(sort -u "$work/outside" | while read -r p; do
  printf 'mkdir -p "%s" && touch "%s" && mount --bind "%s" "%s" && ' \
    "$root$(dirname "$p")" "$root$p" "$p" "$root$p"
done)
touch "$root/dev/null"
script="set -e; ${mounts} mount --bind /dev/null '$root/dev/null' && mount -t tmpfs tmpfs '$root/dev/shm' &&
  mount -t proc proc '$root/proc' && cd '$root' &&
  exec chroot '$root' /opt/ddp/bin/ddprun --standalone -n 2 /opt/ddp/bin/train ${train_args[*]}"
output=$(unshare -m --propagation private sh -c "$script" 2>&1)
status=$?
printf '%s\n' "$output" | tail -4
[ "$status" -eq 0 ] || { printf '%s\n' "$output" >&2; fail "the run inside the chroot exited $status"; }
grep -q '^\[rank 0\] summary:' <<<"$output" || fail "no summary line from rank 0 inside the chroot"
echo "bundle.sh: ok (ldd, run from a moved folder, run in a chroot of only the bundle and $(sort -u "$work/outside" | wc -l) target libraries)"
