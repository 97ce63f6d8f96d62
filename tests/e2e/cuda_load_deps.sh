#!/usr/bin/env bash
# cuda_load_deps.sh PROGRAM...: passes when no PROGRAM needs a CUDA library to
# start: ldd lists neither libcudart (linked statically) nor libcublas,
# libcublasLt or libnccl (opened on first use; Note [vendor libraries on first
# use] in runtime/dynamic_library.h). So ddprun and `train --device cpu` run on
# a machine without CUDA, and a missing or too old CUDA gives ddp's message
# instead of the loader's "error while loading shared libraries".
set -uo pipefail
status=0
for exe in "$@"; do
  deps=$(ldd "$exe") || { echo "cuda_load_deps.sh: FAIL: ldd $exe failed" >&2; exit 1; }
  cuda=$(grep -E 'lib(cudart|cublas|cublasLt|nccl)\.so' <<<"$deps")
  if [ -n "$cuda" ]; then
    echo "cuda_load_deps.sh: FAIL: $(basename "$exe") needs CUDA libraries to start:" >&2
    echo "$cuda" >&2
    status=1
  else
    echo "$(basename "$exe"): no CUDA library at load time ($(grep -c '=>' <<<"$deps") libraries)"
  fi
done
[ "$status" -eq 0 ] && echo "cuda_load_deps.sh: ok"
exit "$status"
