#!/usr/bin/env python3
"""Compares two safetensors checkpoints written by `train --save`.

usage: compare_checkpoints.py A B [--rtol X]

Both must hold the same tensor names, dtypes and shapes, and for every float
tensor max |a - b| <= rtol * max |a| (the tolerance of the DDP parity tests,
Note [parity tolerance] in tests/multirank/ddp_parity.h: summation order
differs between backends, about 1e-7 relative per step). Other dtypes must be
equal. Metadata 'epoch' and 'step' must be equal too.

Prints one line per tensor (its max difference relative to max |a|) and a verdict:
"identical" when all raw bytes agree, "within rtol" otherwise.
Exit 0 when they agree, 1 when not, 2 on a malformed file.

The format (https://huggingface.co/docs/safetensors): 8 bytes little-endian
header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, ...,
"__metadata__": {...}}, then the raw little-endian data.
"""

import argparse
import json
import struct
import sys

FORMATS = {"F32": "f", "F64": "d", "I32": "i", "I64": "q", "U8": "B"}


def load(path):
    try:
        with open(path, "rb") as f:
            blob = f.read()
        (n,) = struct.unpack_from("<Q", blob, 0)
        header = json.loads(blob[8:8 + n])
    except (OSError, struct.error, ValueError) as e:
        sys.exit(f"compare_checkpoints: {path}: not a readable safetensors file: {e}")
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        tensors[name] = (info["dtype"], tuple(info["shape"]), data[begin:end])
    return tensors, metadata


def values(dtype, raw):
    fmt = FORMATS.get(dtype)
    if fmt is None:
        return None
    count = len(raw) // struct.calcsize(fmt)
    return struct.unpack(f"<{count}{fmt}", raw)


def max_relative_difference(a, b):
    """(max |a - b| / max |a|, index of the largest difference)."""
    scale = max((abs(x) for x in a), default=0.0)
    worst, where = 0.0, -1
    for i, (x, y) in enumerate(zip(a, b)):
        d = abs(x - y)
        if d > worst:
            worst, where = d, i
    if worst == 0.0:
        return 0.0, where
    return (worst / scale if scale > 0.0 else float("inf")), where


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rtol", type=float, default=1e-5)
    args = parser.parse_args(argv)
    ta, ma = load(args.a)
    tb, mb = load(args.b)
    ok, identical = True, True
    for key in ("epoch", "step"):
        if ma.get(key) != mb.get(key):
            print(f"metadata {key}: {ma.get(key)} vs {mb.get(key)}")
            ok = False
    if set(ta) != set(tb):
        print(f"tensor names differ: only in A {sorted(set(ta) - set(tb))}, "
              f"only in B {sorted(set(tb) - set(ta))}")
        ok = False
    for name in sorted(set(ta) & set(tb)):
        (da, sa, ra), (db, sb, rb) = ta[name], tb[name]
        if (da, sa) != (db, sb):
            print(f"{name}: {da}{list(sa)} vs {db}{list(sb)}")
            ok = False
            continue
        if ra == rb:
            print(f"{name}: identical ({da}{list(sa)})")
            continue
        identical = False
        va, vb = values(da, ra), values(db, rb)
        if va is None or da not in ("F32", "F64"):
            print(f"{name}: {da} tensors differ")
            ok = False
            continue
        worst, where = max_relative_difference(va, vb)
        verdict = "ok" if worst <= args.rtol else "DIFFERS"
        print(f"{name}: max difference {worst:.3g} of max |a| at element {where} "
              f"({va[where]!r} vs {vb[where]!r}) {verdict}")
        ok = ok and worst <= args.rtol
    if not ok:
        print(f"compare_checkpoints: {args.a} and {args.b} differ (rtol {args.rtol})")
        return 1
    print("compare_checkpoints: " + ("identical" if identical else f"within rtol {args.rtol}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
