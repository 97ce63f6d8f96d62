#!/usr/bin/env bash
# A folder of x.npy and y.npy beside a stray .bin (notes.bin) is file data, not
# token shards: train reads the arrays. The .npy files are written here byte by
# byte (format 1.0), so the test needs no NumPy.
# usage: npy_beside_bin.sh TRAIN
set -euo pipefail
train=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import struct, sys
def save(path, descr, shape, fmt, values):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pad = 64 - (10 + len(header) + 1) % 64
    header += " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))
d = sys.argv[1]
save(d + "/x.npy", "<f4", "(20, 2)", "f", [float(i) for i in range(40)])
save(d + "/y.npy", "<i8", "(20,)", "q", [i % 2 for i in range(20)])
PY
echo notes >"$dir/notes.bin"
out=$("$train" --data "$dir" --epochs 1 2>&1) || { echo "train exited $?: $out" >&2; exit 1; }
grep -q "summary: 1 epoch" <<<"$out" || { echo "no summary: $out" >&2; exit 1; }
echo "npy_beside_bin.sh: PASS (the folder of x.npy, y.npy and notes.bin trained as file data)"
