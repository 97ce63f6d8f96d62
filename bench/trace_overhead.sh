#!/usr/bin/env bash
# bench/trace_overhead.sh DDPRUN TRAIN [BASE_TRAIN]: what the timeline costs a
# training step (docs/observability.md, "Overhead").
#
# Runs `ddprun -n 2 train` on the MLP and on gpt-mini, alternating in one run:
#   off   DDP_TRACE unset
#   on    ddprun --trace DIR (every rank records and writes its file; ddprun merges)
#   base  BASE_TRAIN, when given: train built from the commit before the timeline,
#         so that "off" can be compared with a build that has no tracing at all
# and reports the median step time of each (train's --metrics step_ms: the
# epoch's training time over its steps, evaluation excluded), the overhead of
# "on" over "off" and of "off" over "base", and the records per step.
#
# Environment: MLP_PAIRS (default 9) and GPT_PAIRS (default 3) rounds; the order
# within a round alternates so that drift does not favour one side.
set -euo pipefail
usage_error() {
  echo "bench/trace_overhead.sh: $*" >&2
  echo "usage: bench/trace_overhead.sh DDPRUN TRAIN [BASE_TRAIN] (see --help)" >&2
  exit 2
}
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
  -*) usage_error "unknown option '$1'" ;;
esac
if [ $# -lt 2 ] || [ $# -gt 3 ]; then usage_error "expected 2 or 3 arguments, got $#"; fi
ddprun=$1 train=$2 base=${3:-}
mlp_pairs=${MLP_PAIRS:-9} gpt_pairs=${GPT_PAIRS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mlp_args=(--data synthetic --synthetic-size 25600 --batch-size 64 --epochs 1)
gpt_args=(--model gpt-mini --data synthetic --batch-size 2 --max-steps 8 --eval-batches 1
          --epochs 1)

# run_one KIND BINARY ARGS...: prints the step_ms of rank 0's metrics row.
run_one() {
  local kind=$1 binary=$2
  shift 2
  local metrics="$work/m.jsonl" trace=()
  rm -f "$metrics"
  rm -rf "$work/trace"
  [ "$kind" = on ] && trace=(--trace "$work/trace")
  "$ddprun" --standalone -n 2 "${trace[@]}" "$binary" "$@" --metrics "$metrics" >"$work/log" 2>&1 ||
    { cat "$work/log" >&2; exit 1; }
  if [ "$kind" = on ]; then
    python3 - "$work/trace/trace.json" >>"$work/records" <<'EOF'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
rank0 = [e["pid"] for e in events if e["ph"] == "M" and e["args"].get("name") == "rank 0"][0]
steps = sum(1 for e in events if e.get("name") == "step" and e["pid"] == rank0)
print(sum(1 for e in events if e["ph"] != "M" and e["pid"] == rank0) / max(steps, 1))
EOF
  fi
  sed -nE 's/.*"step_ms": ([0-9.]+).*/\1/p' "$metrics" | tail -1
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# bench NAME PAIRS ARGS...
bench() {
  local name=$1 pairs=$2
  shift 2
  : >"$work/off" ; : >"$work/on" ; : >"$work/base" ; : >"$work/records"
  local kinds=(off on)
  [ -n "$base" ] && kinds+=(base)
  for ((i = 0; i < pairs; i++)); do
    local order=("${kinds[@]}")
    ((i % 2)) && mapfile -t order < <(printf '%s\n' "${kinds[@]}" | tac)
    for kind in "${order[@]}"; do
      local binary=$train
      [ "$kind" = base ] && binary=$base
      run_one "$kind" "$binary" "$@" >>"$work/$kind"
    done
  done
  local off on
  off=$(median <"$work/off")
  on=$(median <"$work/on")
  local records
  records=$(median <"$work/records")
  printf '%-9s %6d %12.4f %12.4f %+9.2f%%' "$name" "$pairs" "$off" "$on" \
    "$(awk -v a="$off" -v b="$on" 'BEGIN { print 100 * (b - a) / a }')"
  if [ -n "$base" ]; then
    local b
    b=$(median <"$work/base")
    printf ' %12.4f %+9.2f%%' "$b" "$(awk -v a="$b" -v o="$off" 'BEGIN { print 100 * (o - a) / a }')"
  fi
  printf ' %9.1f\n' "$records"
  for kind in "${kinds[@]}"; do echo "  $kind: $(tr '\n' ' ' <"$work/$kind")" >&2; done
}

echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; ddprun -n 2 train, step_ms medians"
header='model      pairs  off step ms   on step ms  on - off'
[ -n "$base" ] && header+='  base step ms  off - base'
echo "$header  records/step"
bench mlp "$mlp_pairs" "${mlp_args[@]}"
bench gpt-mini "$gpt_pairs" "${gpt_args[@]}"
