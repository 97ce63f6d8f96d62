#!/usr/bin/env bash
# train --zero 3 (docs/ddp.md "ZeRO-3"): at 3 ranks the checkpoint equals DDP's
# (parameters and the gathered AdamW state, tensor by tensor to 1e-6) on the mlp,
# with clipping and with accumulation, and on a gpt with evaluations between the
# steps (unit by unit, in lockstep) and --zero3-reshard-after-forward false;
# --metrics shows parameters, gradients and optimizer state at 1/W of DDP's; a
# ZeRO-3 checkpoint of 4 ranks resumes at 2 and in one process to DDP's
# uninterrupted 4-rank run; --on-nonfinite and NaN weights in a shard;
# under DDP_MEMORY_LIMIT a model DDP cannot hold (its run ends with the
# out-of-memory message naming the cap) trains with --zero 3 at 4 ranks; bad
# input is named. With an mpirun command after `--`: ZeRO-3 over mpi equals DDP.
# `quick` (e2e.train_zero3_quick, which CI's sanitizer phase runs in this test's
# place): the mlp and gpt parity runs, then a 2-rank --save-sharded checkpoint
# resumed in one process equal to DDP's run, and nothing else.
# usage: train_zero3.sh DDPRUN TRAIN [quick] [-- MPIRUN...]
set -euo pipefail
ddprun=$1 train=$2
shift 2
quick=0
[ "${1:-}" = quick ] && { quick=1; shift; }
[ "${1:-}" = -- ] && shift
mpirun=("$@")
compare="$(dirname "$0")/compare_checkpoints.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_zero3.sh: FAIL: $*" >&2; exit 1; }
common=(--data synthetic --synthetic-size 600 --max-steps 4 --optimizer adamw --lr 0.001
        --lr-schedule constant --seed 3 --quiet --device cpu)
# SGD: the attention's key bias gets a gradient of rounding noise (softmax ignores a
# constant added to every key), which AdamW's m / sqrt(v) turns into full steps
# whose sign follows the summation order; the mlp runs check AdamW.
gpt=(--model gpt:layers=3,d=24,heads=2,ctx=16 --data synthetic --max-steps 6 --batch-size 4
     --optimizer sgd --momentum 0.9 --lr 0.05 --lr-schedule constant --seed 3 --quiet --device cpu
     --eval-every 2 --eval-batches 3)
run() {  # run N OUT [train flags...]: ddprun -n N train, writing --save OUT
  local n=$1 out=$2
  shift 2
  "$ddprun" --standalone -n "$n" "$train" --save "$dir/$out" "$@" >"$dir/log" 2>&1 ||
    { cat "$dir/log" >&2; fail "ddprun -n $n train $* exited $?"; }
}
same() {  # same A B RTOL
  python3 "$compare" "$dir/$1" "$dir/$2" --rtol "$3" >"$dir/cmp" ||
    { cat "$dir/cmp" >&2; fail "$2 differs from $1"; }
  echo "$2 = $1: $(tail -1 "$dir/cmp")"
}

run 3 ddp "${common[@]}" --batch-size 10 --epochs 2 --metrics "$dir/ddp.jsonl"
run 3 zero3 "${common[@]}" --batch-size 10 --epochs 2 --zero 3 --metrics "$dir/zero3.jsonl"
same ddp zero3 1e-6
if [ "$quick" = 1 ]; then
  # The gpt (evaluations unit by unit, in lockstep), and a --save-sharded
  # checkpoint of 2 ranks resumed in one process (the global batch kept).
  run 3 gpt_ddp "${gpt[@]}"
  run 3 gpt_zero3 "${gpt[@]}" --zero 3
  same gpt_ddp gpt_zero3 1e-5
  run 2 ddp2 "${common[@]}" --batch-size 15 --epochs 2
  run 2 z3s "${common[@]}" --batch-size 15 --epochs 1 --zero 3 --save-sharded
  "$train" "${common[@]}" --batch-size 30 --epochs 2 --zero 3 --resume "$dir/z3s" --save "$dir/z3s" \
    >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "resuming a --save-sharded checkpoint exited"; }
  same ddp2 z3s 1e-5
  echo "train_zero3.sh quick: ok"
  exit 0
fi
run 3 ddp_clip "${common[@]}" --batch-size 10 --epochs 1 --clip-grad-norm 0.1
run 3 zero3_clip "${common[@]}" --batch-size 10 --epochs 1 --clip-grad-norm 0.1 --zero 3
same ddp_clip zero3_clip 1e-6
run 3 ddp_accum "${common[@]}" --batch-size 5 --epochs 1 --grad-accum 2
run 3 zero3_accum "${common[@]}" --batch-size 5 --epochs 1 --grad-accum 2 --zero 3
same ddp_accum zero3_accum 1e-6

# A gpt: its blocks are the units; evaluations every 2 steps gather them all.
run 3 gpt_ddp "${gpt[@]}"
run 3 gpt_zero3 "${gpt[@]}" --zero 3
same gpt_ddp gpt_zero3 1e-5
run 3 gpt_kept "${gpt[@]}" --zero 3 --zero3-reshard-after-forward false \
  --zero3-units transformer.h.0,transformer.h.1.mlp
same gpt_ddp gpt_kept 1e-5

python3 - "$dir" <<'PY' || fail "the memory fields of --metrics do not show ZeRO-3's sharding"
import json, sys
ddp, z3 = (json.loads(open(f"{sys.argv[1]}/{n}.jsonl").readline()) for n in ("ddp", "zero3"))
for key in ("rank_optimizer_state", "rank_gradient_bytes", "rank_parameter_bytes"):
    for s, full in zip(z3[key], ddp[key]):
        # padding: under 3 elements a unit (the mlp has 4); DDP's AdamW step counts
        assert abs(3 * s - full) <= 4 * 4 * 3 + 8 * 16, f"{key}: {s} per rank vs DDP's {full}"
print("per rank, ZeRO-3 vs DDP:",
      {k: (z3[k][0], ddp[k][0]) for k in ("rank_parameter_bytes", "rank_gradient_bytes",
                                          "rank_optimizer_state", "rank_peak_allocated")})
PY

# Resharding: a ZeRO-3 checkpoint of 4 ranks resumes at 2 and in one process
# (the global batch kept); both end at the 4-rank DDP run that never stopped.
run 4 ddp4 "${common[@]}" --batch-size 8 --epochs 2
run 4 half "${common[@]}" --batch-size 8 --epochs 1 --zero 3
cp "$dir/half" "$dir/half1"
run 2 half "${common[@]}" --batch-size 16 --epochs 2 --zero 3 --resume "$dir/half"
"$train" "${common[@]}" --batch-size 32 --epochs 2 --zero 3 --resume "$dir/half1" \
  --save "$dir/half1" >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "train --zero 3 alone exited"; }
same ddp4 half 1e-5
same ddp4 half1 1e-5

# A memory cap per rank: DDP cannot hold this mlp (parameters, gradients and
# AdamW state of 1.06M parameters: a peak of 17.5 MiB), ZeRO-3 at 4 ranks
# trains it (a peak of 13.2 MiB, set by building the whole model before sharding).
big=(--data synthetic --synthetic-size 256 --hidden 1024,256 --batch-size 16 --max-steps 2
     --epochs 1 --optimizer adamw --seed 3 --quiet --device cpu)
if DDP_MEMORY_LIMIT=15MiB "$ddprun" --standalone -n 4 "$train" "${big[@]}" >"$dir/log" 2>&1; then
  fail "DDP fit under DDP_MEMORY_LIMIT=15MiB; the demonstration needs a model that does not"
fi
grep -q "past the memory limit of 15.00 MiB" "$dir/log" ||
  { cat "$dir/log" >&2; fail "DDP's out-of-memory error does not name the cap"; }
DDP_MEMORY_LIMIT=15MiB "$ddprun" --standalone -n 4 "$train" "${big[@]}" --zero 3 >"$dir/log" 2>&1 ||
  { cat "$dir/log" >&2; fail "--zero 3 did not train under DDP_MEMORY_LIMIT=15MiB"; }
echo "DDP_MEMORY_LIMIT=15MiB: DDP out of memory, ZeRO-3 at 4 ranks trains"

# Non-finite values: a NaN loss on rank 1 at step 3 is skipped on every rank
# (--on-nonfinite skip, the check over the gradient shards); NaN weights in rank
# 1's shard after the last step (4) stop both ranks naming rank 1 (the check over
# the shards; a gather would spread them to every rank's next forward).
DDP_TEST_NAN_AT=1:3 "$ddprun" --standalone -n 2 "$train" "${common[@]}" --batch-size 10 --epochs 1 \
  --zero 3 --on-nonfinite skip >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "--on-nonfinite skip exited"; }
grep -q "step 3 (epoch 1): non-finite loss; its update is skipped on every rank" "$dir/log" ||
  { cat "$dir/log" >&2; fail "no skip message at --zero 3"; }
if DDP_TEST_NAN_WEIGHT_AT=1:4 "$ddprun" --standalone -n 2 "$train" "${common[@]}" --batch-size 10 \
     --epochs 1 --zero 3 >"$dir/log" 2>&1; then
  fail "NaN weights in a shard did not stop the run"
fi
grep -q "non-finite weights after step 4 on rank 1" "$dir/log" ||
  { cat "$dir/log" >&2; fail "NaN weights in rank 1's shard not named"; }
echo "non-finite: a NaN loss skipped on every rank, NaN weights in a shard named"

# --save-sharded at stage 3 (Note [zero-3 shard files]): nothing is gathered, the
# manifest holds no model tensors and each rank's file its blocks of every unit's
# parameters and state; it resumes at 2 ranks (ZeRO-3) and in one process without
# ZeRO, both ending at the 4-rank DDP run; a missing shard file is named.
run 4 z3sharded "${common[@]}" --batch-size 8 --epochs 1 --zero 3 --save-sharded
python3 - "$dir/z3sharded" <<'PY' || fail "the --zero 3 --save-sharded manifest"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
meta = header.pop("__metadata__")
assert meta["optimizer_shards"] == "4" and meta["zero3_shards"] == "1", meta
assert not header, f"tensors in the manifest: {list(header)}"
PY
for r in 0 1 2 3; do
  files=("$dir/z3sharded.shard${r}of4".step*)
  [ ${#files[@]} = 1 ] && [ -f "${files[0]}" ] ||
    fail "--save-sharded left ${files[*]} for rank $r: expected one file, of the manifest's step"
  cp "${files[0]}" "$dir/z3single${files[0]#"$dir/z3sharded"}"
  [ $r = 3 ] || cp "${files[0]}" "$dir/z3missing${files[0]#"$dir/z3sharded"}"
done
cp "$dir/z3sharded" "$dir/z3single"
# ddp-load cannot give PyTorch a model whose parameters are in shard files: it says
# so (exit 3) rather than write an empty state_dict.
reader="$(dirname "$0")/../../python/ddp_checkpoint.py"
if python3 "$reader" "$dir/z3sharded" --to-torch "$dir/z3.pt" >"$dir/log" 2>&1; then
  fail "ddp-load --to-torch of a --zero 3 sharded manifest succeeded: $(cat "$dir/log")"
fi
grep -q "a --zero 3 --save-sharded manifest: the model's parameters are in its 4 shard files" \
  "$dir/log" || fail "ddp-load does not name the shard files: $(cat "$dir/log")"
[ ! -e "$dir/z3.pt" ] || fail "ddp-load wrote $dir/z3.pt from a --zero 3 sharded manifest"
# Its fix: train with nothing left to train writes --save from the checkpoint as
# loaded (no step), whole; ddp-load reads that. Written over the manifest itself,
# the shard files go.
run 2 z3conv "${common[@]}" --max-steps 0 --batch-size 32 --epochs 1 --zero 3 --save-sharded
conv=("${common[@]}" --max-steps 0 --batch-size 64 --epochs 1 --resume "$dir/z3conv")
"$train" "${conv[@]}" --save "$dir/z3whole" >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "the conversion exited"; }
grep -q "nothing to do: .*; wrote $dir/z3whole from it as it was (step 10, no step trained), a whole checkpoint" \
  "$dir/log" || fail "the conversion did not say what it wrote: $(cat "$dir/log")"
"${PYTHON:-/usr/bin/python3}" "$reader" "$dir/z3whole" --to-torch "$dir/z3.pt" >"$dir/log" 2>&1 ||
  fail "ddp-load --to-torch of the converted checkpoint: $(cat "$dir/log")"
"$train" "${conv[@]}" --save "$dir/z3conv" >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "the conversion in place exited"; }
! compgen -G "$dir/z3conv.shard*" >/dev/null || fail "a whole save left the shard files: $(echo "$dir"/z3conv.shard*)"
cmp "$dir/z3conv" "$dir/z3whole" || fail "the conversion in place differs from the one to another file"
echo "conversion: a --zero 3 --save-sharded checkpoint written whole without a step; its shards removed in place"
cp "$dir/z3sharded" "$dir/z3missing"
run 2 z3sharded "${common[@]}" --batch-size 16 --epochs 2 --zero 3 --resume "$dir/z3sharded"
"$train" "${common[@]}" --batch-size 32 --epochs 2 --resume "$dir/z3single" --save "$dir/z3single" \
  >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "train alone from a --zero 3 sharded checkpoint exited"; }
same ddp4 z3sharded 1e-5
same ddp4 z3single 1e-5
if "$train" "${common[@]}" --batch-size 32 --epochs 2 --resume "$dir/z3missing" >"$dir/log" 2>&1; then
  fail "resuming a --zero 3 sharded checkpoint without a shard file succeeded"
fi
grep -q "z3missing.shard3of4.step[0-9]* is missing" "$dir/log" ||
  { cat "$dir/log" >&2; fail "the missing --zero 3 shard is not named"; }

# A shard of another save with the same step, rank and world size (another run's,
# copied in): refused by its save id, naming the file (at --zero 1, and 3 whose
# shards hold the parameters too); it resumed before, mixing the two runs.
for z in 1 3; do
  run 2 "z${z}a" "${common[@]}" --max-steps 0 --batch-size 32 --epochs 1 --zero "$z" --save-sharded
  run 2 "z${z}b" "${common[@]}" --max-steps 0 --batch-size 32 --epochs 1 --zero "$z" --save-sharded --seed 4
  other=("$dir/z${z}b.shard1of2".step*)
  cp "${other[0]}" "$dir/z${z}a${other[0]#"$dir/z${z}b"}"
  if "$train" "${common[@]}" --max-steps 0 --batch-size 64 --epochs 2 --resume "$dir/z${z}a" >"$dir/log" 2>&1; then
    fail "--zero $z: a shard of another run resumed"
  fi
  grep -q "z${z}a.shard1of2.step[0-9]*: a shard of another save (its save_id is [0-9a-f]*, the checkpoint" \
    "$dir/log" || { cat "$dir/log" >&2; fail "--zero $z: the shard of another run is not named"; }
done
echo "save id: a shard of another run refused, named"

# Bad input.
expect_error() {  # expect_error PATTERN train flags...
  local pattern=$1
  shift
  if "$ddprun" --standalone -n 2 "$train" "$@" >"$dir/log" 2>&1; then fail "$* succeeded"; fi
  grep -q -- "$pattern" "$dir/log" || { cat "$dir/log" >&2; fail "$* did not say: $pattern"; }
}
expect_error "ZeRO-3 unit 'transformer.h.9' is not a module of the model; its modules are: transformer" \
  "${gpt[@]}" --zero 3 --zero3-units transformer.h.9
expect_error "it is a parameter of ZeRO-3 unit 'transformer.wte' (transformer.wte.weight) outside that unit's forward and backward.*a head tied to the embedding" \
  "${gpt[@]}" --zero 3 --zero3-units transformer.h.1,transformer.wte
expect_error "--comm-hook bf16 compresses DDP's all_reduce, which --zero 3 replaces" \
  "${common[@]}" --zero 3 --comm-hook bf16
expect_error "--zero3-units and --zero3-reshard-after-forward shape --zero 3; this run has --zero 2" \
  "${common[@]}" --zero 2 --zero3-units 1

if [ ${#mpirun[@]} -gt 0 ]; then
  # Two ranks: a sum of two is the same in any order, so mpi's reduce_scatter
  # and shm's all_reduce agree to the bit.
  run 2 ddp2 "${common[@]}" --batch-size 10 --epochs 1
  "${mpirun[@]}" -np 2 "$train" "${common[@]}" --batch-size 10 --epochs 1 --backend mpi --zero 3 \
    --save "$dir/mpi2" >"$dir/log" 2>&1 || { cat "$dir/log" >&2; fail "mpirun train --zero 3 exited"; }
  same ddp2 mpi2 1e-6
fi
echo "train_zero3.sh: ok"
