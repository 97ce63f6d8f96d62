#!/usr/bin/env bash
# train --zero (docs/train.md, docs/ddp.md): ZeRO-1 and ZeRO-2 write the same
# checkpoint as DDP (parameters and the gathered AdamW state, compared tensor by
# tensor to 1e-6; clipping from the shards, accumulation, ZeRO-1 under a Join) at 3
# ranks, and the memory fields of --metrics show the sharding; a ZeRO-2 checkpoint of
# 4 ranks resumes at 2 ranks (--zero 1) and in one process (--zero 2), with the
# global batch kept (--batch-size x ranks = 32), to the checkpoint of the 4-rank
# DDP run that never stopped; so do --save-sharded's per-rank files (and a
# missing one is named); --zero with SGD without momentum says what it saves.
# With an mpirun command after `--`: ZeRO-2 over the mpi backend equals DDP over
# shm.
# usage: train_zero.sh DDPRUN TRAIN [-- MPIRUN...]
set -euo pipefail
ddprun=$1 train=$2
shift 2
[ "${1:-}" = -- ] && shift
mpirun=("$@")
compare="$(dirname "$0")/compare_checkpoints.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_zero.sh: FAIL: $*" >&2; exit 1; }
common=(--data synthetic --synthetic-size 600 --max-steps 4 --optimizer adamw --lr 0.001
        --lr-schedule constant --seed 3 --quiet --device cpu --bucket-cap-mb 0.05)
run() {  # run N OUT [train flags...]: ddprun -n N train, writing --save OUT
  local n=$1 out=$2
  shift 2
  "$ddprun" --standalone -n "$n" "$train" "${common[@]}" --save "$dir/$out" "$@" >"$dir/log" 2>&1 ||
    { cat "$dir/log" >&2; fail "ddprun -n $n train $* exited $?"; }
}
same() {  # same A B RTOL
  python3 "$compare" "$dir/$1" "$dir/$2" --rtol "$3" >"$dir/cmp" ||
    { cat "$dir/cmp" >&2; fail "$2 differs from $1"; }
  echo "$2 = $1: $(tail -1 "$dir/cmp")"
}

run 3 ddp --batch-size 10 --epochs 2
run 3 zero1 --batch-size 10 --epochs 2 --zero 1
run 3 zero2 --batch-size 10 --epochs 2 --zero 2
same ddp zero1 1e-6
same ddp zero2 1e-6
run 3 ddp_clip --batch-size 10 --epochs 2 --clip-grad-norm 0.1
run 3 zero2_clip --batch-size 10 --epochs 2 --clip-grad-norm 0.1 --zero 2
same ddp_clip zero2_clip 1e-6

run 3 ddp_accum --batch-size 5 --epochs 1 --grad-accum 2
run 3 zero2_accum --batch-size 5 --epochs 1 --grad-accum 2 --zero 2
same ddp_accum zero2_accum 1e-6

# Uneven shares under a Join (--drop-last false: ranks take 2 or 3 steps): a
# joined rank shadows the step and takes part in ZeRO-1's all-gather.
uneven=(--synthetic-size 601 --batch-size 100 --epochs 1 --drop-last false)
run 3 ddp_join "${uneven[@]}"
run 3 zero1_join "${uneven[@]}" --zero 1
same ddp_join zero1_join 1e-6

# Memory per rank in --metrics: ZeRO's optimizer state is 1/W of DDP's (within a
# padding element; DDP's AdamW also holds one 8-byte step count per parameter),
# ZeRO-2's gradients too.
for z in 0 1 2; do run 3 "mem$z" --batch-size 10 --epochs 1 --zero "$z" --metrics "$dir/mem$z.jsonl"; done
python3 - "$dir" <<'PY' || fail "the memory fields of --metrics do not show the sharding"
import json, sys
rows = [json.loads(open(f"{sys.argv[1]}/mem{z}.jsonl").readline()) for z in range(3)]
ddp = rows[0]
for z, r in enumerate(rows):
    for key in ("rank_peak_allocated", "rank_optimizer_state", "rank_gradient_bytes"):
        assert len(r[key]) == 3 and min(r[key]) > 0, f"--zero {z}: {key} = {r[key]}"
for z in (1, 2):
    for s, full in zip(rows[z]["rank_optimizer_state"], ddp["rank_optimizer_state"]):
        # DDP's step counts: 8 bytes per parameter tensor (a handful); padding: 8 per rank
        assert -3 * 8 <= full - 3 * s <= 8 * 16, f"--zero {z}: state {s} vs DDP's {full}"
grads = rows[2]["rank_gradient_bytes"]
for g, full in zip(grads, ddp["rank_gradient_bytes"]):
    assert abs(3 * g - full) <= 3 * 4, f"--zero 2: gradients {g} vs DDP's {full}"
assert rows[1]["rank_gradient_bytes"] == ddp["rank_gradient_bytes"], "--zero 1 keeps DDP's buckets"
print("memory: state/rank", [r["rank_optimizer_state"][0] for r in rows],
      "gradients/rank", [r["rank_gradient_bytes"][0] for r in rows])
PY

# Resharding: 4 ranks -> 2 ranks and -> 1 process, the global batch kept.
run 4 ddp4 --batch-size 8 --epochs 2
run 4 half --batch-size 8 --epochs 1 --zero 2
cp "$dir/half" "$dir/half1"
run 2 half --batch-size 16 --epochs 2 --zero 1 --resume "$dir/half"
"$train" "${common[@]}" --batch-size 32 --epochs 2 --zero 2 --resume "$dir/half1" \
  --save "$dir/half1" >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "train --zero 2 alone exited"; }
same ddp4 half 1e-5  # Note [parity tolerance]: other world sizes sum in another order
same ddp4 half1 1e-5

# --save-sharded: a shard file per rank next to a manifest without optimizer
# tensors; resumes at 2 ranks (ZeRO-1) and in one process without ZeRO.
run 4 sharded --batch-size 8 --epochs 1 --zero 2 --save-sharded --save-every 2
python3 - "$dir/sharded" <<'PY' || fail "the --save-sharded manifest"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
meta = header.pop("__metadata__")
assert meta["optimizer_shards"] == "4", meta
assert not [n for n in header if n.startswith("optimizer.")], list(header)
PY
# Note [shard generations]: one file per rank, of the manifest's step (4, the last
# save; step 2's files are gone).
for r in 0 1 2 3; do
  files=("$dir/sharded.shard${r}of4".step*)
  [ "${files[*]}" = "$dir/sharded.shard${r}of4.step4" ] ||
    fail "--save-sharded left ${files[*]}, expected $dir/sharded.shard${r}of4.step4 alone"
  cp "$dir/sharded.shard${r}of4.step4" "$dir/single.shard${r}of4.step4"
done
cp "$dir/sharded" "$dir/single"
# A save killed between its shard files and its manifest (Note [shard generations]):
# the restarted group resumes from the save before it (step 2) and ends as the run
# that was never killed.
DDP_TEST_KILL_IN_SAVE=0:4 "$ddprun" --standalone -n 4 --max-restarts 1 "$train" "${common[@]}" \
  --save "$dir/killsave" --batch-size 8 --epochs 1 --zero 1 --save-sharded --save-every 2 \
  --resume auto >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "a save killed half-way was not resumed"; }
grep -q "^ddprun: restarting the group: restart 1 of 1" "$dir/log" ||
  { cat "$dir/log" >&2; fail "DDP_TEST_KILL_IN_SAVE did not kill rank 0 in step 4's save"; }
same sharded killsave 1e-6  # a manifest of the same 4 steps, never killed
run 2 sharded --batch-size 16 --epochs 2 --zero 1 --resume "$dir/sharded"
"$train" "${common[@]}" --batch-size 32 --epochs 2 --resume "$dir/single" --save "$dir/single" \
  >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "train alone from a sharded checkpoint exited"; }
same ddp4 sharded 1e-5
same ddp4 single 1e-5
run 4 half3 --batch-size 8 --epochs 1 --zero 1 --save-sharded
rm "$dir/half3.shard3of4".step*
if "$train" "${common[@]}" --batch-size 32 --epochs 2 --resume "$dir/half3" >"$dir/log" 2>&1; then
  fail "resuming without a shard file succeeded"
fi
grep -q "half3.shard3of4.step[0-9]* is missing" "$dir/log" || { cat "$dir/log" >&2; fail "the missing shard is not named"; }

# Plain SGD has no state to shard: stage 2 says it shards the gradients alone.
"$ddprun" --standalone -n 2 "$train" --data synthetic --synthetic-size 600 --max-steps 1 \
  --epochs 1 --device cpu --optimizer sgd --momentum 0 --zero 2 >"$dir/log" 2>&1 ||
  { cat "$dir/log" >&2; fail "--zero 2 with sgd exited"; }
grep -q "no optimizer state to shard; only the gradients are sharded" "$dir/log" ||
  { cat "$dir/log" >&2; fail "--zero 2 with sgd without momentum did not say what it saves"; }
"$ddprun" --standalone -n 2 "$train" --data synthetic --synthetic-size 600 --max-steps 1 \
  --epochs 1 --device cpu --optimizer sgd --momentum 0 --zero 1 >"$dir/log" 2>&1 ||
  { cat "$dir/log" >&2; fail "--zero 1 with sgd exited"; }
grep -q "no optimizer state to shard, so it saves no memory over --zero 0" "$dir/log" ||
  { cat "$dir/log" >&2; fail "--zero 1 with sgd without momentum did not say it saves nothing"; }

if [ ${#mpirun[@]} -gt 0 ]; then
  run 2 ddp2 --batch-size 10 --epochs 1
  "${mpirun[@]}" -np 2 "$train" "${common[@]}" --batch-size 10 --epochs 1 --backend mpi --zero 2 \
    --save "$dir/mpi2" >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "mpirun train --zero 2 exited"; }
  same ddp2 mpi2 1e-6
fi
echo "train_zero.sh: ok"
