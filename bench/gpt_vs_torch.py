#!/usr/bin/python3
"""GPT training throughput: ddp next to PyTorch 1.13 in one run, alternating.

    bench/gpt_vs_torch.py [--model gpt-mini] [--batch 8] [--steps 8] [--rounds 3]
                          [--threads 1,2] [--buckets 1,5,25] [--world 2] [--skip-ddp]

One process, for each thread count N (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = N on both
sides), --rounds rounds of
  ours   bench gpt --model M --batch-size B --warmup 2 --repeats S --json
         (median step: forward with loss, backward, clipping at 1.0, AdamW with decay groups)
  torch  bench/peer/torch_gpt_train.py --model M --batch B --warmup 2 --steps S --threads N
         (the same step on torch_gpt.Gpt; mean over S steps)
Then DDP over --world processes launched by ddprun (one thread each), for each bucket cap
C in --buckets:
  ours   ddprun -n W bench train --model M --batch-size B --steps S --bucket-cap-mb C --json
         (median epoch: tokens/s of all ranks, the step split, comm time and overlap)
  torch  ddprun -n W torch_gpt_train.py --bucket-cap-mb C (gloo DDP, the same recipe)
Prints markdown tables of medians (tokens/s, ratio ours / torch) for docs/benchmarks.md,
and the raw JSON rows to --raw FILE if given. Environment: BUILD (default build),
PYTHON (default /usr/bin/python3, needs torch).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")
PEER = os.path.join(ROOT, "bench", "peer", "torch_gpt_train.py")


def csv_ints(text):
    try:
        values = [int(x) for x in text.split(",")]
        assert values and all(v > 0 for v in values)
        return values
    except (ValueError, AssertionError):
        raise argparse.ArgumentTypeError(f"'{text}': expected positive integers like 1,2")


def csv_floats(text):
    try:
        values = [float(x) for x in text.split(",")]
        assert values and all(v > 0 for v in values)
        return values
    except (ValueError, AssertionError):
        raise argparse.ArgumentTypeError(f"'{text}': expected positive numbers like 1,5,25")


def run_json(cmd, env_extra, label):
    """The last JSON line of cmd's stdout (progress on stderr passes through)."""
    env = dict(os.environ, **env_extra)
    print(f"gpt_vs_torch: {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    # Under ddprun every line carries a "[rank N] " prefix.
    rows = [json.loads(line[line.index("{"):]) for line in out.splitlines() if "{" in line]
    if not rows:
        sys.exit(f"gpt_vs_torch: {label} printed no JSON row")
    return rows[-1]


def single(args, raw):
    lines = ["| threads | ours tokens/s (median) | torch tokens/s (median) | ours / torch | "
             "ours ms/step (fwd / bwd / clip / opt) | ours GFLOP/s |",
             "|---|---|---|---|---|---|"]
    for threads in args.threads:
        env = {"OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        ours, theirs = [], []
        for r in range(args.rounds):
            ours.append(run_json([os.path.join(BUILD, "bin", "bench"), "gpt", "--device", "cpu",
                                  "--model", args.model, "--batch-size", str(args.batch),
                                  "--warmup", "2", "--repeats", str(args.steps), "--json"],
                                 env, f"ours {threads} thread(s), round {r + 1}"))
            theirs.append(run_json([PYTHON, PEER, "--model", args.model, "--batch",
                                    str(args.batch), "--warmup", "2", "--steps", str(args.steps),
                                    "--threads", str(threads)],
                                   env, f"torch {threads} thread(s), round {r + 1}"))
        raw += ours + theirs
        o = statistics.median(x["tokens_per_s"] for x in ours)
        t = statistics.median(x["tokens_per_s"] for x in theirs)
        mid = sorted(ours, key=lambda x: x["tokens_per_s"])[len(ours) // 2]
        lines.append(f"| {threads} | {o:.0f} | {t:.0f} | **{o / t:.2f}x** | {mid['step_ms']:.0f} "
                     f"({mid['forward_ms']:.0f} / {mid['backward_ms']:.0f} / {mid['clip_ms']:.0f}"
                     f" / {mid['optimizer_ms']:.0f}) | {mid['gflops']:.0f} |")
    return lines


def ddp(args, raw):
    ddprun = os.path.join(BUILD, "bin", "ddprun")
    lines = [f"| bucket cap MB | ours tokens/s | torch DDP tokens/s | ours / torch | ours ms/step "
             f"| exposed comm ms | comm ms | overlap |",
             "|---|---|---|---|---|---|---|---|"]
    for cap in args.buckets:
        ours, theirs = [], []
        for r in range(args.rounds):
            ours.append(run_json([ddprun, "-n", str(args.world), os.path.join(BUILD, "bin", "bench"),
                                  "train", "--device", "cpu", "--model", args.model,
                                  "--batch-size", str(args.batch), "--steps", str(args.steps),
                                  "--bucket-cap-mb", f"{cap:g}", "--json"],
                                 {}, f"ours ddp W={args.world} cap {cap:g}, round {r + 1}"))
            theirs.append(run_json([ddprun, "-n", str(args.world), PYTHON, PEER, "--model",
                                    args.model, "--batch", str(args.batch), "--warmup", "2",
                                    "--steps", str(args.steps), "--bucket-cap-mb", f"{cap:g}"],
                                   {}, f"torch ddp W={args.world} cap {cap:g}, round {r + 1}"))
        raw += ours + theirs
        o = statistics.median(x["tokens_per_s"] for x in ours)
        t = statistics.median(x["tokens_per_s"] for x in theirs)
        mid = sorted(ours, key=lambda x: x["tokens_per_s"])[len(ours) // 2]
        lines.append(f"| {cap:g} | {o:.0f} | {t:.0f} | **{o / t:.2f}x** | {mid['step_ms']:.0f} | "
                     f"{mid['exposed_ms']:.1f} | {mid['comm_ms']:.1f} | {mid['overlap']:.2f} |")
    return lines


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="See the module docstring for what each side times.")
    parser.add_argument("--model", default="gpt-mini")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (per rank)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=csv_ints, default=[1, 2])
    parser.add_argument("--buckets", type=csv_floats, default=[1.0, 5.0, 25.0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--skip-single", action="store_true")
    parser.add_argument("--skip-ddp", action="store_true")
    parser.add_argument("--raw", default="", help="write every JSON row here")
    args = parser.parse_args(argv)
    for name in ("batch", "steps", "rounds", "world"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    raw = []
    out = [f"model {args.model}, batch {args.batch} sequences per rank, {args.steps} timed "
           f"steps per run, median of {args.rounds} alternating rounds"]
    if not args.skip_single:
        out += ["", "One process:", ""] + single(args, raw)
    if not args.skip_ddp:
        out += ["", f"ddprun -n {args.world} (one thread per rank):", ""] + ddp(args, raw)
    print("\n".join(out))
    if args.raw:
        with open(args.raw, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in raw)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
