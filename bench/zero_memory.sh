#!/usr/bin/env bash
# ZeRO-1/2/3 next to DDP (docs/benchmarks.md, "ZeRO"): the same GPT trained for a
# few steps at W = 1, 2, 4 with --zero 0, 1, 2 and 3, one run after another in
# this script; prints a markdown table of each rank's memory from --metrics
# (trainer/memory_report.h: parameters kept between steps, optimizer state,
# gradients held after the step, allocator peak) as ratios to DDP's at the same
# W, and tokens/s. With CAP (a DDP_MEMORY_LIMIT size, e.g. 900MiB): then DDP and
# ZeRO-3 at W = 4 under that cap per rank, each line saying whether it trained
# or ran out of memory (our message, naming the cap).
# usage: bench/zero_memory.sh TRAIN DDPRUN [MODEL] [STEPS] [CAP]
set -euo pipefail
usage_error() {
  echo "bench/zero_memory.sh: $*" >&2
  echo "usage: bench/zero_memory.sh TRAIN DDPRUN [MODEL] [STEPS] [CAP] (see --help)" >&2
  exit 2
}
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
  -*) usage_error "unknown option '$1'" ;;
esac
if [ $# -lt 2 ] || [ $# -gt 5 ]; then usage_error "expected 2 to 5 arguments, got $#"; fi
train=$1 ddprun=$2
model=${3:-gpt:layers=12,d=768,heads=12,ctx=128,vocab=50257}
steps=${4:-3}
cap=${5:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--model "$model" --epochs 1 --max-steps "$steps" --batch-size 1 --eval-batches 1 --quiet
      --device cpu)
for w in 1 2 4; do
  for z in 0 1 2 3; do
    out=$dir/w${w}_z${z}.jsonl
    if [ "$w" = 1 ]; then
      "$train" "${args[@]}" --mode ddp --zero "$z" --metrics "$out" >/dev/null
    else
      "$ddprun" --standalone -n "$w" "$train" "${args[@]}" --zero "$z" --metrics "$out" \
        >/dev/null 2>"$dir/err" || { cat "$dir/err" >&2; exit 1; }
    fi
  done
done
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
mib = lambda b: b / 2**20
print("| W | mode | parameters / rank (MiB) | vs DDP | optimizer state / rank (MiB) | vs DDP | gradients held / rank (MiB) | vs DDP | peak allocated / rank (MiB) | vs DDP | tokens/s (all ranks) | vs DDP |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for w in (1, 2, 4):
    rows = [json.loads(open(f"{d}/w{w}_z{z}.jsonl").readline()) for z in (0, 1, 2, 3)]
    base = rows[0]
    for z, r in enumerate(rows):
        keys = ("rank_parameter_bytes", "rank_optimizer_state", "rank_gradient_bytes", "rank_peak_allocated")
        q, s, g, p = (max(r[k]) for k in keys)
        q0, s0, g0, p0 = (max(base[k]) for k in keys)
        mode = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"][z]
        print(f"| {w} | {mode} | {mib(q):.1f} | {q / q0:.3f} | {mib(s):.1f} | {s / s0:.3f} | {mib(g):.1f} | {g / g0:.3f} | "
              f"{mib(p):.1f} | {p / p0:.3f} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f} |")
PY
if [ -n "$cap" ]; then
  echo
  echo "Under DDP_MEMORY_LIMIT=$cap per rank, W = 4:"
  for z in 0 3; do
    if DDP_MEMORY_LIMIT=$cap "$ddprun" --standalone -n 4 "$train" "${args[@]}" --zero "$z" \
         --metrics "$dir/cap_z$z.jsonl" >"$dir/out" 2>&1; then
      python3 - "$dir/cap_z$z.jsonl" "$z" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).readline())
peak = max(r["rank_peak_allocated"]) / 2**20
print(f"- --zero {sys.argv[2]}: trained, peak {peak:.1f} MiB per rank, {r['tokens_per_s']:.0f} tokens/s")
PY
    else
      echo "- --zero $z: $(grep -m1 -o 'out of memory.*' "$dir/out" | cut -c1-200)"
    fi
  done
fi
