#!/usr/bin/env python3
"""Reads the files that bench/gpu/run.sh's steps write and prints one line for its table.

usage: results.py COMMAND ARGS...

  gtest XML                  "P passed, F failed, S skipped" of a --gtest_output=xml file;
                             the failed tests' names on stderr. Exit 1 when any failed
                             or the file is unreadable.
  no-cuda-skips XML          the number of tests skipped for "no CUDA device" (run.sh
                             fails the step when nvidia-smi sees a GPU and this is > 0).
  losses A B TOL             compares two `train --loss-log` files step by step: prints
                             "max abs difference X over N steps"; exit 1 when the steps differ or
                             X > TOL.
  loss-gap A B LAST TOL      the mean loss of the last LAST steps of two loss logs (A the
                             fp32 run, B the bf16 one) and their relative gap; exit 1 when
                             the gap exceeds TOL or the steps differ.
  summary-acc LOG            the final test accuracy of `train`'s summary line.
  metric FILE KEY            KEY of the last line of a `train --metrics` file.
  json-key FILE KEY          KEY of the first JSON line of FILE that has it.
  top-ops JSONL N            the N ops with the largest ms_per_step of `bench gpt --ops yes
                             --json` (Note [gpt op breakdown]), with their share of the
                             step's forward + backward, and the ops' sum.
  profile-top JSONL N        the N longest entries of an op profile, `bench gpt
                             --profile-steps --json` (by op) or torch_gpt_train.py
                             --profile-out (kernels), and all entries against the step.
  bench-device JSONL         "figure<TAB>reference" lines of `bench device --json`.
  bench-gemm JSONL           the same for `bench gemm --json`.
  copy-peak DEVICE           pinned 256 MiB host-to-device and device-to-host GB/s with
                             PyTorch (CUDA events, median of 20): the copy peak that
                             `bench device` is compared with. Exit 3 without CUDA torch.

Only the standard library, except copy-peak (torch).
"""

import glob
import json
import math
import sys
import xml.etree.ElementTree as ET


def fail(message, code=1):
    print(f"results.py: {message}", file=sys.stderr)
    sys.exit(code)


def testcases(path):
    """The testcases of a gtest XML file, or of every file a glob pattern matches (the
    gpu_tests step writes one file per test suite)."""
    paths = sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]
    if not paths:
        fail(f"{path}: no gtest XML file matches")
    cases = []
    for p in paths:
        try:
            cases.extend(ET.parse(p).getroot().iter("testcase"))
        except (OSError, ET.ParseError) as e:
            fail(f"{p}: not a readable gtest XML file: {e}")
    return cases


def cmd_gtest(path):
    passed = failed = skipped = 0
    for case in testcases(path):
        name = f"{case.get('classname')}.{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            print(f"FAILED {name}", file=sys.stderr)
        elif case.find("skipped") is not None or case.get("result") == "skipped":
            skipped += 1
        elif case.get("status", "run") == "run":
            passed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def cmd_no_cuda_skips(path):
    count = 0
    for case in testcases(path):
        skipped = case.find("skipped")
        if skipped is not None and "no CUDA device" in (skipped.get("message", "") +
                                                        (skipped.text or "")):
            count += 1
    print(count)
    return 0


def read_losses(path):
    rows = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3:
                fail(f"{path}: expected 'epoch step loss', got '{line.strip()}'")
            rows[(int(parts[0]), int(parts[1]))] = float(parts[2])
    return rows


def cmd_losses(a, b, tol):
    ra, rb = read_losses(a), read_losses(b)
    if not ra or ra.keys() != rb.keys():
        print(f"steps differ: {len(ra)} in {a}, {len(rb)} in {b}")
        return 1
    worst, where = -1.0, None
    for key in sorted(ra):
        d = abs(ra[key] - rb[key]) if math.isfinite(ra[key] + rb[key]) else math.inf
        if d > worst:
            worst, where = d, key
    print(f"max abs difference {worst:.2g} over {len(ra)} steps (largest at step {where[1]}: "
          f"{ra[where]:.6f} vs {rb[where]:.6f})")
    return 0 if worst <= float(tol) else 1


def cmd_loss_gap(a, b, last, tol):
    """The mean loss of the last LAST steps of A (reference) and B, and their relative gap."""
    ra, rb = read_losses(a), read_losses(b)
    last = int(last)
    if len(ra) < last or ra.keys() != rb.keys():
        print(f"steps differ or fewer than {last}: {len(ra)} in {a}, {len(rb)} in {b}")
        return 1
    keys = sorted(ra)[-last:]
    ma = sum(ra[k] for k in keys) / last
    mb = sum(rb[k] for k in keys) / last
    gap = abs(mb - ma) / abs(ma) if math.isfinite(ma + mb) and ma != 0 else math.inf
    print(f"mean loss of the last {last} steps {ma:.4f} (fp32) vs {mb:.4f} (bf16), gap "
          f"{100 * gap:.2f}%")
    return 0 if gap <= float(tol) else 1


def cmd_summary_acc(path):
    with open(path, errors="replace") as f:
        for line in f:
            if "final test_acc" in line:
                print(line.split("final test_acc", 1)[1].split()[0].rstrip(";,"))
                return 0
    fail(f"{path}: no 'final test_acc' summary line")


def cmd_metric(path, key):
    with open(path) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    if not lines or key not in lines[-1]:
        fail(f"{path}: no '{key}' in the last metrics line")
    print(lines[-1][key])
    return 0


def cmd_json_key(path, key):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                row = json.loads(line)
                if key in row:
                    print(row[key])
                    return 0
    fail(f"{path}: no JSON line with '{key}'")


def cmd_top_ops(path, n):
    ops = [r for r in rows(path) if "ms_per_step" in r and r.get("per_step", 0) > 0]
    if not ops:
        fail(f"{path}: no op rows (bench gpt --ops yes --json)")
    total = sum(r["ms_per_step"] for r in ops)
    share = sum(r["share_of_forward_backward"] for r in ops)
    ops.sort(key=lambda r: r["ms_per_step"], reverse=True)
    top = ", ".join(f"{r['op'].split(' [')[0]} {r['ms_per_step']:.1f} ms "
                    f"({100 * r['share_of_forward_backward']:.0f}%)" for r in ops[:int(n)])
    print(f"top ops (alone, fwd+bwd): {top}; all {len(ops)} ops {total:.1f} ms "
          f"({100 * share:.0f}% of the step's fwd+bwd){fusion_figures(rows(path))}")
    return 0


def cmd_profile_top(path, n):
    """The longest entries of an op profile: bench gpt --profile-steps (by op) or
    torch_gpt_train.py --profile-out (kernels); then every entry's share of the step."""
    found = [r for r in rows(path) if "share_of_step" in r
             and r.get("section") in ("gpt step op profile: by op (summed over shapes)",
                                      "op profile")]
    if not found:
        fail(f"{path}: no op profile rows (bench gpt --profile-steps N --json, or "
             "torch_gpt_train.py --profile-steps N --profile-out FILE)")
    entries = [r for r in found if not r["op"].startswith("(")]
    every = [r for r in found if r["op"] in ("(every op)", "(every entry)")]
    whole = [r for r in found if r["op"] == "(the whole step)"]
    top = ", ".join(f"{r['op'][:60]} {r['ms_per_step']:.2f} ms ({100 * r['share_of_step']:.0f}%)"
                    for r in entries[:int(n)])
    tail = ""
    if every and whole:
        tail = (f"; every entry {every[0]['ms_per_step']:.2f} of "
                f"{whole[0]['ms_per_step']:.2f} ms/step")
    print(f"in the step: {top}{tail}")
    return 0


def fusion_figures(all_rows):
    """The alternatives bench gpt --ops times (rows counted 0 times, in parentheses):
    each linear layer with its bias gradient as a column sum, summed over the step,
    against the fused form; the MLP with its GELU in the matmuls against its three ops."""
    ops = [r for r in all_rows if "ms_each" in r and r.get("op") != "sum of the ops"]
    main = {r["op"]: r for r in ops if r.get("per_step", 0) > 0}
    fused_ms = apart_ms = 0.0
    out = ""
    for r in ops:
        name = r["op"]
        if r.get("per_step", 0) != 0 or not name.startswith("("):
            continue
        if "bias gradient as a column sum" in name:
            base = name[1:].split(", bias gradient")[0]
            if base in main:
                fused_ms += main[base]["ms_per_step"]
                apart_ms += r["ms_each"] * main[base]["per_step"]
        elif "GELU in the matmuls" in name:
            parts = [m for op, m in main.items()
                     if op.startswith(("linear c_fc", "gelu", "linear mlp c_proj"))]
            if len(parts) == 3:
                apart = sum(m["ms_each"] for m in parts)
                out += (f"; GELU epilogues: one MLP {r['ms_each']:.3f} ms vs c_fc + gelu + "
                        f"c_proj {apart:.3f} ms")
    if apart_ms > 0:
        out = (f"; bias gradient in the matmul: linear layers {fused_ms:.1f} ms/step vs "
               f"{apart_ms:.1f} as column sums") + out
    return out


def rows(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip().startswith("{")]


def rate(gb_per_s):
    """A bytes-per-second figure: whole GB/s from 100 up, 3 digits below (a CPU's)."""
    return f"{gb_per_s:.0f}" if gb_per_s >= 100 else f"{gb_per_s:.3g}"


def cmd_bench_device(path):
    """Lines 'label<TAB>figure': the rand speedup, the 256 MiB copies, the allocator
    and each memory-bound kernel's bytes per second against a copy's (Note [kernel
    bandwidth] in bench/device_bench.cpp)."""
    out = []
    for r in rows(path):
        section = r.get("section")
        if section == "rand" and "speedup" in r:
            out.append(("rand 10000^2: on device vs host + copy",
                        f"{r['ms_median']:.2f} ms, {r['speedup']:.1f}x faster than host + copy"))
        elif section == "host-device bandwidth" and r.get("bytes") == 256 << 20:
            label = f"{r['direction']} 256 MiB {r['host_memory']}"
            figure = f"{r['gb_per_s']:.1f} GB/s"
            if "vs_pageable" in r:
                figure += f" ({r['vs_pageable']:.1f}x pageable)"
            out.append((label, figure))
        elif section == "allocate+free pair" and "speedup_vs_raw" in r:
            out.append((f"allocate+free {r['size']} (caching allocator)",
                        f"{r['us_median']:.2f} us, {r['speedup_vs_raw']:.1f}x faster than raw"))
        elif (section or "").startswith("kernel bandwidth") and "gb_per_s" in r:
            out.append((f"kernel {r['op']}",
                        f"{rate(r['gb_per_s'])} GB/s, {r['vs_copy']:.2f} of the copy's"))
    for label, figure in out:
        print(f"{label}\t{figure}")
    return 0 if out else 1


def cmd_bench_gemm(path):
    out = []
    for r in rows(path):
        if r.get("section") != "gflops":
            continue
        figure = f"{r.get('ours_gflops', float('nan')):.0f} GFLOP/s"
        reference = "-"
        if r.get("bare_gflops") is not None:
            reference = (f"bare {r.get('bare', 'vendor call')} {r['bare_gflops']:.0f} GFLOP/s "
                         f"(overhead {r.get('overhead_pct', float('nan')):+.1f}%)")
        out.append((f"gemm {r.get('gemm')} {r.get('dtype')} {r.get('shape')}", figure, reference))
    for label, figure, reference in out:
        print(f"{label}\t{figure}\t{reference}")
    return 0 if out else 1


def cmd_copy_peak(device):
    try:
        import torch
    except ImportError:
        fail("no torch", 3)
    if not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False", 3)
    dev = torch.device(device)
    n = (256 << 20) // 4
    host = torch.rand(n).pin_memory()
    gpu = torch.empty(n, device=dev)
    result = {}
    for name, dst, src in (("h2d", gpu, host), ("d2h", host, gpu)):
        times = []
        for i in range(23):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            if i >= 3:  # warmup
                times.append(start.elapsed_time(end))
        times.sort()
        result[name] = (256 << 20) / (times[len(times) // 2] * 1e-3) / 1e9
    print(f"{result['h2d']:.1f} {result['d2h']:.1f}")
    return 0


COMMANDS = {
    "gtest": (cmd_gtest, 1),
    "no-cuda-skips": (cmd_no_cuda_skips, 1),
    "losses": (cmd_losses, 3),
    "loss-gap": (cmd_loss_gap, 4),
    "summary-acc": (cmd_summary_acc, 1),
    "metric": (cmd_metric, 2),
    "json-key": (cmd_json_key, 2),
    "top-ops": (cmd_top_ops, 2),
    "profile-top": (cmd_profile_top, 2),
    "bench-device": (cmd_bench_device, 1),
    "bench-gemm": (cmd_bench_gemm, 1),
    "copy-peak": (cmd_copy_peak, 1),
}


def main(argv):
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    function, nargs = COMMANDS[argv[0]]
    if len(argv) - 1 != nargs:
        fail(f"{argv[0]} takes {nargs} argument(s), got {len(argv) - 1}", 2)
    try:
        return function(*argv[1:])
    except (OSError, ValueError, KeyError) as e:
        fail(f"{argv[0]}: {e}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
