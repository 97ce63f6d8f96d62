#!/usr/bin/env python3
"""The distance between training runs, for runs whose rounding differs (bf16).

usage: checkpoint_distance.py REF A [B]

Prints the relative L2 distance ||A - REF|| / ||REF|| over the model's float tensors
(the names without "optimizer."; safetensors files written by `train --save`). With
B, also prints ||B - REF|| / ||REF|| and exits 1 unless A's distance is at most twice
B's: a bf16 run A of another parallel layout (DDP ranks, DataParallel replicas)
strays from the one-process bf16 run REF no further than bf16 itself strays from
fp32 (B, the fp32 run), which is the noise a bf16 trajectory carries anyway. Exit 2
on unreadable files or different tensor sets.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_checkpoints import load, values  # noqa: E402


def model_values(path):
    tensors, _ = load(path)
    out = {}
    for name, (dtype, _, raw) in tensors.items():
        if name.startswith("optimizer."):
            continue
        v = values(dtype, raw)
        if v is not None and dtype in ("F32", "F64"):
            out[name] = v
    return out


def distance(ref, other):
    if ref.keys() != other.keys():
        sys.exit(f"checkpoint_distance: tensor names differ: {sorted(ref.keys() ^ other.keys())}")
    diff = norm = 0.0
    for name, r in ref.items():
        for x, y in zip(r, other[name]):
            diff += (x - y) ** 2
            norm += x * x
    return math.sqrt(diff) / math.sqrt(norm) if norm > 0 else math.inf


def main(argv):
    if len(argv) not in (2, 3) or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    ref = model_values(argv[0])
    d_a = distance(ref, model_values(argv[1]))
    if len(argv) == 2:
        print(f"relative L2 distance {d_a:.3g}")
        return 0
    d_b = distance(ref, model_values(argv[2]))
    verdict = d_a <= 2 * d_b
    print(f"relative L2 distance {d_a:.3g} (the fp32 run's: {d_b:.3g}; at most 2x allowed)")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
