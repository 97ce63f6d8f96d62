#!/usr/bin/env bash
# The loss-curve benchmark: ddp's GPT and PyTorch's from the same initial weights and
# the same data order, step by step, plotted into one SVG.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
  cat <<USAGE
usage: bench/gpt_loss_curve.sh [options]

Runs gpt_parity --curve STEPS (ddp: STEPS AdamW steps, each on the next --batch windows
of a TextWindowSampler epoch over the Brown train split; init, batches, learning rates
and losses written to a folder), then torch_gpt.py curve (PyTorch replays the same init,
batches and learning rates), and plots both loss curves with bench/plot_loss_curve.py.
Recipe: Note [parity steps] in models/gpt_parity.cpp (AdamW betas (0.9, 0.95), weight
decay 0.1 on 2-D weights, lr 1e-3 warmed up over STEPS/10 then cosine to 1e-4,
gradient-norm clipping at 1.0).

options:
  --model M     gpt config (default gpt-mini)
  --steps S     optimizer steps (default 200)
  --batch N     windows per step (default 8)
  --threads N   OpenBLAS / torch threads of both sides (default 2)
  --seed S      init and data order (default 1234)
  --out FILE    the SVG (default docs/gpt_loss_curve.svg)
  --keep DIR    keep the run's files in DIR (default: a temporary folder)
  -h, --help    this text
environment: BUILD (default build), PYTHON (default /usr/bin/python3, needs torch).
USAGE
}

model=gpt-mini steps=200 batch=8 threads=2 seed=1234 out=$ROOT/docs/gpt_loss_curve.svg keep=""
die() { echo "gpt_loss_curve.sh: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
  esac
  (($# >= 2)) || die "$1 needs a value (or unknown option; see --help)"
  case $1 in
    --model) model=$2 ;;
    --steps) steps=$2 ;;
    --batch) batch=$2 ;;
    --threads) threads=$2 ;;
    --seed) seed=$2 ;;
    --out) out=$2 ;;
    --keep) keep=$2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
for v in steps batch threads; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--$v '${!v}': expected a positive integer"
done
BUILD=${BUILD:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
[[ -x $BUILD/bin/gpt_parity ]] || die "$BUILD/bin/gpt_parity not found; build it (or set BUILD)"
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch (set PYTHON)"

if [[ -n $keep ]]; then
  dir=$keep
  mkdir -p "$dir"
else
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
fi
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
start=$(date +%s)
"$BUILD/bin/gpt_parity" --out "$dir" --curve "$steps" --batch-size "$batch" --model "$model" \
  --seed "$seed"
ours_s=$(($(date +%s) - start))
"$PYTHON" "$ROOT/models/torch_gpt.py" curve --dir "$dir" --threads "$threads"
torch_s=$(($(date +%s) - start - ours_s))
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
"$PYTHON" "$ROOT/bench/plot_loss_curve.py" "$dir/curve.tsv" "$dir/torch_curve.tsv" "$out" \
  --title "GPT training loss: ddp vs PyTorch 1.13 ($model, $steps steps x $batch windows, Brown corpus)" \
  --subtitle "same init and data order; $cpu, $threads threads; ours ${ours_s} s, torch ${torch_s} s"
