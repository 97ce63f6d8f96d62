#!/usr/bin/env bash
# Training throughput of ddp's `train` next to the PyTorch peer (bench/peer/torch_train.py),
# same model, data, batch, optimizer and step count, runs alternating in one invocation.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
  cat <<EOF
usage: bench/train_vs_torch.sh [options]

Runs ddp's train and PyTorch alternately (ours, torch, ours, torch, ...) for the same
model, data, batch and number of steps, and prints the median samples/s and ms/step of
each, the ratio ours/torch, and the fraction of the single-thread sgemm peak that one
training step reaches.

options:
  --model mlp|cnn      model (default mlp: 784-256-10)
  --batch N            samples per step (default 64)
  --steps S            training steps per run, at most one epoch (default 600)
  --threads N          BLAS / torch threads of both sides (default 1)
  --rounds R           runs of each side (default 3)
  --data DIR|synthetic Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist)
  --torch-warmup W     untimed torch steps before timing (default 0, like ours: see below)
  --precision fp32|bf16  bf16: ours with train --precision bf16, torch under
                       torch.autocast("cpu", torch.bfloat16) (default fp32)
  --peak-gflops X      sgemm peak per thread to compare with (default: measured with
                       \`bench gemm --json\` and OPENBLAS_NUM_THREADS=1, ~10 s)
  --json               JSON lines on stdout instead of the table
  -h, --help           this text

environment: TRAIN (default build-cpu/bin/train), BENCH (default build-cpu/bin/bench),
PYTHON (default /usr/bin/python3, needs torch).

What each side times:
  ours   train --epochs 1 --max-steps S --lr-schedule constant --quiet --metrics FILE with
         OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=N; its samples_per_s is the epoch's
         training loop: the data loader (gathering each batch on a prefetch thread, a new
         std::async thread per batch), every step from the first one (no warmup),
         forward, loss, backward, SGD step and loss accumulation. Not included: reading
         the data set, building the model, the test evaluation.
  torch  torch_train.py --steps S --warmup W --threads N: forward, loss, backward,
         SGD step, loss.item() per step and batch slicing; the epoch's permutation
         gather (x[perm], one copy of the data set) is inside the timed window when
         W = 0. Not included: reading the data set, import, model construction.
GEMM fraction: FLOPs of a step's GEMMs (MLP: forward 2B(784*256 + 256*10), weight
gradients the same, the second layer's input gradient 2B*256*10; the first layer's input
gradient is not computed; CNN: convolutions as implicit GEMMs the same way) divided by
ms/step gives GFLOP/s, compared with the 2048^3 cblas_sgemm of \`bench gemm\` on one
thread (times N threads when --threads N > 1).
EOF
}

model=mlp batch=64 steps=600 threads=1 rounds=3 json=0 torch_warmup=0 peak="" precision=fp32
data=/usr/share/datasets/fashion-mnist
die() { echo "train_vs_torch.sh: $*" >&2; exit 2; }
need_int() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 '$2': expected a positive integer"; }

while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --json) json=1; shift; continue ;;
  esac
  (($# >= 2)) || die "$1 needs a value (or unknown option; see --help)"
  case $1 in
    --model) model=$2 ;;
    --batch) batch=$2 ;;
    --steps) steps=$2 ;;
    --threads) threads=$2 ;;
    --rounds) rounds=$2 ;;
    --data) data=$2 ;;
    --torch-warmup) torch_warmup=$2 ;;
    --peak-gflops) peak=$2 ;;
    --precision) precision=$2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
[[ $model == mlp || $model == cnn ]] || die "--model '$model': valid values are mlp, cnn"
[[ $precision == fp32 || $precision == bf16 ]] || die "--precision '$precision': valid values are fp32, bf16"
for v in batch steps threads rounds; do need_int "--$v" "${!v}"; done
[[ $torch_warmup =~ ^[0-9]+$ ]] || die "--torch-warmup '$torch_warmup': expected an integer >= 0"
[[ -z $peak || $peak =~ ^[0-9]+(\.[0-9]*)?$ ]] || die "--peak-gflops '$peak': expected a number"

TRAIN=${TRAIN:-$ROOT/build-cpu/bin/train}
BENCH=${BENCH:-$ROOT/build-cpu/bin/bench}
PYTHON=${PYTHON:-/usr/bin/python3}
PEER=$ROOT/bench/peer/torch_train.py
[[ -x $TRAIN ]] || die "$TRAIN not found; build it: ninja -C build-cpu train (or set TRAIN)"
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch (set PYTHON)"

# Enough synthetic samples for S steps in one epoch (train's default is 10000).
synthetic_args=()
if [[ $data == synthetic ]]; then
  synthetic_args=(--synthetic-size $((steps * batch > 10000 ? steps * batch : 10000)))
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=$tmp/results.jsonl
progress() { echo "train_vs_torch: $*" >&2; }

if [[ -z $peak ]]; then
  [[ -x $BENCH ]] || die "$BENCH not found; build it (ninja -C build-cpu bench) or pass --peak-gflops"
  progress "measuring the single-thread sgemm peak (bench gemm --json)"
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$BENCH" gemm --device cpu --json >"$tmp/gemm.jsonl" 2>/dev/null ||
    die "bench gemm failed; pass --peak-gflops"
fi

for ((r = 1; r <= rounds; r++)); do
  progress "round $r/$rounds: ours"
  metrics=$tmp/ours_$r.jsonl
  OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$TRAIN" --model "$model" \
    --batch-size "$batch" --epochs 1 --max-steps "$steps" --lr-schedule constant --quiet \
    --data "$data" "${synthetic_args[@]}" --device cpu --precision "$precision" --metrics "$metrics" >/dev/null
  "$PYTHON" -c 'import json,sys; m=json.loads(open(sys.argv[1]).readline())
print(json.dumps({"impl": "ours", "samples_per_s": m["samples_per_s"], "step_ms": m["step_ms"], "steps": m["steps"]}))' \
    "$metrics" >>"$results"
  progress "round $r/$rounds: torch"
  OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$PYTHON" "$PEER" --model "$model" --batch "$batch" --steps "$steps" \
    --warmup "$torch_warmup" --threads "$threads" --data "$data" "${synthetic_args[@]}" \
    --precision "$precision" >>"$results"
done

"$PYTHON" - "$results" "$tmp/gemm.jsonl" "$model" "$batch" "$threads" "$steps" "$json" "$peak" \
  "$rounds" "$precision" <<'EOF'
import json
import statistics
import sys

results_path, gemm_path, model, batch, threads, steps, as_json, peak, rounds, precision = sys.argv[1:]
batch, threads, steps, rounds = int(batch), int(threads), int(steps), int(rounds)
runs = [json.loads(line) for line in open(results_path)]

# Peak: the 2048^3 cblas_sgemm of `bench gemm` on one thread (the better of ours/bare).
peak_source = "--peak-gflops"
if peak:
    peak = float(peak)
else:
    rows = [json.loads(line) for line in open(gemm_path)]
    square = [r for r in rows if r.get("gemm") == "square"][0]
    peak = max(square["bare_gflops"], square["ours_gflops"])
    peak_source = "bench gemm square 2048^3, 1 thread"


def step_flops(model, b):
    """FLOPs of one training step's GEMMs (forward + weight grads + needed input grads)."""
    if model == "mlp":
        layers = [(784, 256), (256, 10)]
        fwd = sum(2 * b * i * o for i, o in layers)
        input_grads = sum(2 * b * i * o for i, o in layers[1:])  # not for the first layer
        return 2 * fwd + input_grads
    # cnn: conv k*k*cin*cout per output pixel, then the two linear layers
    gemms = [2 * b * 28 * 28 * 9 * 1 * 32, 2 * b * 14 * 14 * 9 * 32 * 64,
             2 * b * 3136 * 128, 2 * b * 128 * 10]
    return 2 * sum(gemms) + sum(gemms[1:])


flops = step_flops(model, batch)
summary = {}
for impl in ("ours", "torch"):
    mine = [r for r in runs if r["impl"] == impl]
    sps = [r["samples_per_s"] for r in mine]
    ms = [r["step_ms"] for r in mine]
    step_ms = statistics.median(ms)
    gflops = flops / (step_ms * 1e6)
    summary[impl] = {
        "impl": impl, "model": model, "batch": batch, "threads": threads, "precision": precision,
        "steps": mine[0].get("steps", steps), "rounds": len(mine),
        "samples_per_s": round(statistics.median(sps), 1),
        "samples_per_s_min": min(sps), "samples_per_s_max": max(sps),
        "step_ms": round(step_ms, 4),
        "gemm_gflops": round(gflops, 2),
        "gemm_peak_fraction": round(gflops / (peak * threads), 4),
    }
ratio = summary["ours"]["samples_per_s"] / summary["torch"]["samples_per_s"]
if summary["ours"]["steps"] != steps:
    print(f"train_vs_torch: note: ours ran {summary['ours']['steps']} steps, not {steps} "
          "(--steps is capped at one epoch)", file=sys.stderr)

if as_json == "1":
    for impl in ("ours", "torch"):
        print(json.dumps(summary[impl]))
    print(json.dumps({"ratio_ours_over_torch": round(ratio, 4), "step_mflop": flops / 1e6,
                      "peak_gflops_per_thread": peak, "peak_source": peak_source}))
    sys.exit(0)

header = ["impl", "model", "batch", "threads", "steps", "samples/s (median)", "min..max",
          "step_ms", "GEMM GFLOP/s", "of peak"]
table = [header]
for impl in ("ours", "torch"):
    s = summary[impl]
    table.append([impl, model, str(batch), str(threads), str(s["steps"]),
                  f"{s['samples_per_s']:.0f}",
                  f"{s['samples_per_s_min']:.0f}..{s['samples_per_s_max']:.0f}",
                  f"{s['step_ms']:.3f}", f"{s['gemm_gflops']:.1f}",
                  f"{100 * s['gemm_peak_fraction']:.1f}%"])
widths = [max(len(row[i]) for row in table) for i in range(len(header))]
for row in table:
    print("  ".join(cell.rjust(w) if i else cell.ljust(w)
                    for i, (cell, w) in enumerate(zip(row, widths))))
print(f"ratio ours/torch (samples/s): {ratio:.3f}  (median of {rounds} alternating runs each)")
print(f"GEMM work per step: {flops / 1e6:.2f} MFLOP; peak {peak:.1f} GFLOP/s per thread "
      f"({peak_source}); ideal step at peak {flops / (peak * threads * 1e6):.3f} ms")
if precision == "bf16":
    print("precision bf16: ours --precision bf16, torch under autocast(cpu, bfloat16); the peak "
          "and 'of peak' are the f32 sgemm's (bf16 dot products can go twice as fast)")
print("ours includes the data loader and the epoch's first steps (no warmup); "
      "torch includes its first steps and the epoch's shuffle gather only with --torch-warmup 0")
EOF
