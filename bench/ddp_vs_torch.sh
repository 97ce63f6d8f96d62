#!/usr/bin/env bash
# DDP training throughput and its step split: ours (`ddprun -n W bench train`) next
# to PyTorch DDP over gloo (bench/peer/torch_train.py) in one run, plus a bucket sweep.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
  cat <<EOF
usage: bench/ddp_vs_torch.sh [options]

For each model and world size W, alternating for --rounds rounds:
  ours   ddprun -n W bench train --mode ddp --json  (W = 1: DDP over one rank)
  torch  W processes of torch_train.py with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
         (gloo DDP; W = 1: plain torch), OMP/OPENBLAS threads = cores / W like ddprun
and, once per round, our single process (bench train --mode single) with the
default threads and with one thread, and two such one-thread processes at once
that do not communicate (the pair: the ceiling of 2 ranks on this machine, since
they share its cores, caches and memory as DDP's ranks do). Then the bucket sweep: ddprun -n 2 bench train
with --bucket-cap-mb 1, 5, 25, 100 (ours) and torch DDP with the same caps.
Prints medians: samples/s, ms per step, the phase split (forward, backward, exposed
communication, optimizer), comm time, overlap, and the ratios the DDP issue asks
for (ours W=2 over our single process; ours over torch DDP at the same W; ours
W=2 over the pair).

options:
  --models LIST    comma-separated: mlp,cnn (default mlp,cnn)
  --worlds LIST    world sizes (default 1,2,4)
  --batch N        per rank (default 64)
  --steps S        steps per measured epoch (default 300; torch: S timed steps)
  --cnn-steps S    steps for the CNN (default 60)
  --rounds R       alternating rounds (default 3)
  --buckets LIST   bucket caps of the sweep in MiB (default 1,5,25,100; "none" skips it)
  --data DIR|synthetic  (default Fashion-MNIST)
  -h, --help       this text
environment: BUILD (default build-cpu), PYTHON (default /usr/bin/python3, needs torch).
EOF
}

models=mlp,cnn worlds=1,2,4 batch=64 steps=300 cnn_steps=60 rounds=3 buckets=1,5,25,100
data=/usr/share/datasets/fashion-mnist
die() { echo "ddp_vs_torch.sh: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
  esac
  (($# >= 2)) || die "$1 needs a value (or unknown option; see --help)"
  case $1 in
    --models) models=$2 ;;
    --worlds) worlds=$2 ;;
    --batch) batch=$2 ;;
    --steps) steps=$2 ;;
    --cnn-steps) cnn_steps=$2 ;;
    --rounds) rounds=$2 ;;
    --buckets) buckets=$2 ;;
    --data) data=$2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
for v in batch steps cnn_steps rounds; do [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} '${!v}': expected a positive integer"; done

BUILD=${BUILD:-$ROOT/build-cpu}
PYTHON=${PYTHON:-/usr/bin/python3}
DDPRUN=$BUILD/bin/ddprun BENCH=$BUILD/bin/bench PEER=$ROOT/bench/peer/torch_train.py
[[ -x $DDPRUN && -x $BENCH ]] || die "$BUILD/bin/{ddprun,bench} not found; build them or set BUILD"
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch (set PYTHON)"
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=$tmp/results.jsonl
progress() { echo "ddp_vs_torch: $*" >&2; }

# ours KIND MODEL STEPS W [bench flags...]: one JSON row tagged with KIND.
ours() {
  local kind=$1 model=$2 s=$3 w=$4
  shift 4
  "$DDPRUN" --standalone -n "$w" "$BENCH" train --json --model "$model" --batch-size "$batch" \
    --steps "$s" --data "$data" "$@" 2>"$tmp/err" | sed -E 's/^\[rank 0\] //' |
    "$PYTHON" -c 'import json,sys; k=sys.argv[1]
for line in sys.stdin:
    r=json.loads(line)
    if "samples_per_s" in r: r["kind"]=k; r["impl"]="ours"; print(json.dumps(r))' "$kind" >>"$results" ||
    { cat "$tmp/err" >&2; die "ours $kind $model W=$w failed"; }
}

# torch KIND MODEL STEPS W [peer flags...]
torch_ddp() {
  local kind=$1 model=$2 s=$3 w=$4
  shift 4
  local threads=$((cores / w > 0 ? cores / w : 1)) port=$((20000 + RANDOM % 20000)) pids=() r
  for ((r = 0; r < w; r++)); do
    RANK=$r WORLD_SIZE=$w MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=$threads \
      OPENBLAS_NUM_THREADS=$threads "$PYTHON" "$PEER" --model "$model" --batch "$batch" \
      --steps "$s" --warmup 20 --threads "$threads" --data "$data" "$@" >"$tmp/torch_$r.out" \
      2>"$tmp/torch_$r.err" &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}" || { cat "$tmp/torch_$r.err" >&2; die "torch rank $r ($kind $model W=$w) failed"; }
  done
  "$PYTHON" -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); r["kind"]=sys.argv[2]
r["world"]=r["world_size"]; print(json.dumps(r))' "$tmp/torch_0.out" "$kind" >>"$results"
}

# pair MODEL STEPS: two one-thread single processes at once; one row, kind "pair",
# world 2, with their summed samples/s and mean step time.
pair() {
  local model=$1 s=$2 r pids=()
  for r in 0 1; do
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$BENCH" train --json --model "$model" --mode single \
      --batch-size "$batch" --steps "$s" --data "$data" >"$tmp/pair_$r.out" 2>"$tmp/pair_$r.err" &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}" || { cat "$tmp/pair_$r.err" >&2; die "pair $model (process $r) failed"; }
  done
  "$PYTHON" -c 'import json,sys
a,b=(json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:3])
r=dict(a); r["kind"]="pair"; r["impl"]="ours"; r["world"]=2
r["samples_per_s"]=a["samples_per_s"]+b["samples_per_s"]; r["step_ms"]=(a["step_ms"]+b["step_ms"])/2
print(json.dumps(r))' "$tmp/pair_0.out" "$tmp/pair_1.out" >>"$results"
}

IFS=, read -ra model_list <<<"$models"
IFS=, read -ra world_list <<<"$worlds"
IFS=, read -ra bucket_list <<<"$buckets"
[[ $buckets == none ]] && bucket_list=()
for ((round = 1; round <= rounds; round++)); do
  for model in "${model_list[@]}"; do
    s=$steps
    [[ $model == cnn ]] && s=$cnn_steps
    progress "round $round/$rounds $model: single process"
    ours single "$model" "$s" 1 --mode single
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ours single_1thread "$model" "$s" 1 --mode single
    progress "round $round/$rounds $model: two one-thread processes at once (the pair)"
    pair "$model" "$s"
    for w in "${world_list[@]}"; do
      progress "round $round/$rounds $model: W=$w ours, torch"
      ours ddp "$model" "$s" "$w" --mode ddp
      torch_ddp ddp "$model" "$s" "$w"
    done
    for cap in "${bucket_list[@]}"; do
      progress "round $round/$rounds $model: bucket cap $cap MiB"
      ours "bucket_$cap" "$model" "$s" 2 --mode ddp --bucket-cap-mb "$cap"
      torch_ddp "bucket_$cap" "$model" "$s" 2 --bucket-cap-mb "$cap"
    done
  done
done

"$PYTHON" - "$results" "$batch" "$rounds" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
batch, rounds = int(sys.argv[2]), int(sys.argv[3])
def med(sel, key):
    vals = [r[key] for r in sel if key in r]
    return statistics.median(vals) if vals else float("nan")
def pick(**kv):
    return [r for r in rows if all(r.get(k) == v for k, v in kv.items())]
print(f"batch {batch} per rank; medians of {rounds} alternating rounds\n")
hdr = ("model", "impl", "kind", "W", "samples/s", "step_ms", "fwd", "bwd", "exposed", "opt", "comm",
       "overlap", "exposed%")
table = [hdr]
keys = sorted({(r["model"], r["kind"], r["world"] if "world" in r else r["world_size"], r["impl"]) for r in rows},
              key=lambda k: (k[0], k[1] != "single", k[1] != "single_1thread", k[1], k[2], k[3]))
for model, kind, w, impl in keys:
    sel = [r for r in pick(model=model, kind=kind, impl=impl) if r.get("world", r.get("world_size")) == w]
    line = [model, impl, kind, str(w), f"{med(sel, 'samples_per_s'):.0f}", f"{med(sel, 'step_ms'):.3f}"]
    if impl == "ours":
        line += [f"{med(sel, k):.3f}" for k in ("forward_ms", "backward_ms", "exposed_ms", "optimizer_ms", "comm_ms")]
        line += [f"{med(sel, 'overlap'):.2f}", f"{med(sel, 'exposed_pct'):.1f}"]
    else:
        line += ["-"] * 7
    table.append(line)
widths = [max(len(r[i]) for r in table) for i in range(len(hdr))]
for r in table:
    print("  ".join(c.rjust(wd) if i > 2 else c.ljust(wd) for i, (c, wd) in enumerate(zip(r, widths))))
print()
for model in sorted({r["model"] for r in rows}):
    single = med(pick(model=model, kind="single", impl="ours"), "samples_per_s")
    single1 = med(pick(model=model, kind="single_1thread", impl="ours"), "samples_per_s")
    for w in sorted({r.get("world", 0) for r in pick(model=model, kind="ddp", impl="ours")}):
        ours_w = med([r for r in pick(model=model, kind="ddp", impl="ours") if r["world"] == w], "samples_per_s")
        torch_w = med([r for r in pick(model=model, kind="ddp", impl="torch") if r["world"] == w], "samples_per_s")
        print(f"{model} W={w}: ours/torch DDP {ours_w / torch_w:.2f}x; ours/our single process "
              f"{ours_w / single:.2f}x (default threads), {ours_w / single1:.2f}x (1 thread)")
    pair = med(pick(model=model, kind="pair", impl="ours"), "samples_per_s")
    ours_2 = med([r for r in pick(model=model, kind="ddp", impl="ours") if r["world"] == 2], "samples_per_s")
    if pair == pair and ours_2 == ours_2:
        print(f"{model} pair of independent one-thread processes: {pair / single1:.2f}x our single "
              f"process (the ceiling of 2 ranks here); ours W=2 reaches {ours_2 / pair:.1%} of it")
EOF
