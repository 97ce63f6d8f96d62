#!/usr/bin/env bash
# bench/trace_instructions.sh TRAIN [BASE_TRAIN]: the instructions a training
# step executes with the timeline off and on (and, given BASE_TRAIN, in a build
# without the timeline), counted by valgrind's callgrind: exact and unmoved by
# the load of a shared machine, where step times are not (docs/observability.md,
# "Overhead").
#
# Each binary runs `train --mode ddp` (DDP over one rank: the step, its phases,
# DDP's buckets and the collective all record) for 10 and for 30 steps of the
# MLP on the synthetic set (MODEL=gpt-mini: 1 and 3 steps of gpt-mini, batch 2 x
# 256 tokens, a few minutes each under valgrind); the difference is the per-step count,
# without start-up, data generation and evaluation. Counting stops where the
# trace file is first written (--dump-before): its writing, at the end of the
# run, is reported apart (per record) by `bench trace`.
set -euo pipefail
usage_error() {
  echo "bench/trace_instructions.sh: $*" >&2
  echo "usage: bench/trace_instructions.sh TRAIN [BASE_TRAIN] (see --help)" >&2
  exit 2
}
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
  -*) usage_error "unknown option '$1'" ;;
esac
if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage_error "expected 1 or 2 arguments, got $#"; fi
train=$1 base=${2:-}
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
model=${MODEL:-mlp}
if [ "$model" = mlp ]; then
  args=(--data synthetic --synthetic-size 1920 --epochs 1) short_steps=10 long_steps=30
  what="MLP 784-256-10, batch 64"
else
  args=(--model "$model" --data synthetic --batch-size 2 --eval-batches 1 --epochs 1)
  short_steps=1 long_steps=3 what="$model, batch 2"
fi

# count BINARY STEPS [trace]: instructions of one run, up to the trace file's writing.
count() {
  local env=() out="$work/cg.$RANDOM"
  [ "${3:-}" = trace ] && env=(DDP_TRACE="$work/trace")
  env "${env[@]}" valgrind --tool=callgrind --dump-before='ddp::trace::write_file*' \
    --callgrind-out-file="$out" "$1" "${args[@]}" --max-steps "$2" --mode ddp --quiet \
    >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
  [ -f "$out.1" ] && out="$out.1"  # the part before the first write
  sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$out"
}

per_step() {
  local short long
  short=$(count "$1" "$short_steps" "${2:-}")
  long=$(count "$1" "$long_steps" "${2:-}")
  echo $(((long - short) / (long_steps - short_steps)))
}

off=$(per_step "$train")
on=$(per_step "$train" trace)
echo "# instructions per step (callgrind), train --mode ddp, $what"
printf '%-6s %14s %10s\n' run instructions vs_off
printf '%-6s %14d %10s\n' off "$off" "-"
printf '%-6s %14d %+9.3f%%\n' on "$on" "$(awk -v a="$off" -v b="$on" 'BEGIN { print 100 * (b - a) / a }')"
if [ -n "$base" ]; then
  b=$(per_step "$base")
  printf '%-6s %14d %+9.3f%%\n' base "$b" "$(awk -v a="$off" -v b="$b" 'BEGIN { print 100 * (b - a) / a }')"
fi
