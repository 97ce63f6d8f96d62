#!/usr/bin/env bash
# What --zero-replicas 2 costs a run without failures (docs/benchmarks.md, "ZeRO
# replicas"; docs/elastic.md): `ddprun --standalone -n 4 train --backend shm --zero
# Z` next to the same with `--zero-replicas 2`, for Z = 1 and 2, in back-to-back
# pairs (the order alternating), RUNS pairs per stage (default 9). The job: the
# mlp 784-HIDDEN-HIDDEN-10 (default HIDDEN 1024: 1.9M parameters, so that the
# optimizer's share of a step is not lost in the noise), --data synthetic
# --synthetic-size 16000 --epochs 1 --batch-size 64 --optimizer adamw (62 steps
# at 4 ranks), --metrics. Reported per stage: ms/step (the --metrics rows'
# step_ms weighted by their steps), optimizer_ms (the update and the
# all-gather, where the replica's update and the commit land), backward_ms and
# comm_exposed_ms (where ZeRO-2's gradient all-gather for the replica waits), and
# the optimizer state held by a rank (rank_optimizer_state, bytes); medians, and
# replicas / none as the ratio of the medians and the median of the pairs'
# ratios. Raw figures per run go to stderr. About 1 minute on 2 cores.
# usage: bench/zero_replicas.sh DDPRUN TRAIN [RUNS]   environment: HIDDEN
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case ${1:-} in -h | --help) usage; exit 0 ;; esac
if (($# < 2 || $# > 3)); then usage >&2; exit 2; fi
ddprun=$1 train=$2 runs=${3:-9} hidden=${HIDDEN:-1024}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--backend shm --data synthetic --synthetic-size 16000 --epochs 1 --seed 5 --batch-size 64
        --optimizer adamw --hidden "$hidden,$hidden")

# job FILE ZERO REPLICAS: one run, its --metrics in FILE.
job() {
  "$ddprun" --standalone -n 4 "$train" "${common[@]}" --zero "$2" --zero-replicas "$3" \
    --metrics "$1" >"$1.log" 2>&1 || { echo "zero_replicas.sh: $1 exited $?:" >&2; tail -20 "$1.log" >&2; exit 1; }
}

for zero in 1 2; do
  for i in $(seq "$runs"); do
    order=(1 2)
    ((i % 2)) && order=(2 1)
    for replicas in "${order[@]}"; do job "$dir/z${zero}_r${replicas}_$i.jsonl" "$zero" "$replicas"; done
  done
done

python3 - "$dir" "$runs" <<'PY'
import json, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
def figures(path):
    rows = [json.loads(l) for l in open(path) if l.startswith("{") and '"step_ms"' in l]
    steps = sum(r["steps"] for r in rows)
    w = lambda k: sum(r[k] * r["steps"] for r in rows) / steps
    return {"step": w("step_ms"), "opt": w("optimizer_ms"), "bwd": w("backward_ms"),
            "exposed": w("comm_exposed_ms"), "state": max(rows[-1]["rank_optimizer_state"])}
med = statistics.median
print("| --zero | --zero-replicas | ms/step median | min - max | optimizer_ms | backward_ms | comm_exposed_ms | optimizer state per rank (bytes) |")
print("|---|---|---|---|---|---|---|---|")
for zero in (1, 2):
    f = {rep: [figures(f"{d}/z{zero}_r{rep}_{i}.jsonl") for i in range(1, runs + 1)] for rep in (1, 2)}
    for rep in (1, 2):
        for i, x in enumerate(f[rep], 1):
            print(f"zero {zero} replicas {rep} run {i}: {x}", file=sys.stderr)
        s = [x["step"] for x in f[rep]]
        print(f"| {zero} | {rep} | {med(s):.3f} | {min(s):.3f} - {max(s):.3f} | "
              f"{med(x['opt'] for x in f[rep]):.3f} | {med(x['bwd'] for x in f[rep]):.3f} | "
              f"{med(x['exposed'] for x in f[rep]):.3f} | {f[rep][0]['state']} |")
    pairs = [b["step"] / a["step"] for a, b in zip(f[1], f[2])]
    print(f"| {zero} | 2 / 1 | {med(x['step'] for x in f[2]) / med(x['step'] for x in f[1]):.3f}; "
          f"pairs {med(pairs):.3f} | {min(pairs):.3f} - {max(pairs):.3f} | | | | |")
PY
