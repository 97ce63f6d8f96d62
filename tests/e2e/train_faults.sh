#!/usr/bin/env bash
# Faults `train` must not hide (docs/train.md): a NaN loss under ddprun stops the
# run naming the step and the rank, or with --on-nonfinite skip is left out on
# every rank; unwritable output paths fail before the first step; a stale
# temporary file of a crashed save is removed by the next save; a line printed
# just before ddprun stops the group with SIGTERM is in the output.
# usage: train_faults.sh DDPRUN TRAIN
set -uo pipefail
ddprun=$1 train=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "train_faults.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
small=(--data synthetic --synthetic-size 1000 --epochs 2 --seed 1)

# NaN at step 5 on rank 1 (DDP_TEST_NAN_AT): stop (the default).
DDP_TEST_NAN_AT=1:5 "$ddprun" --standalone -n 2 --grace-period 2 "$train" --backend shm "${small[@]}" \
  --save "$dir/nan.st" --save-every 2 >"$dir/stop.log" 2>&1
status=$?
[ $status -ne 0 ] || fail "a NaN loss exited 0"
grep -q "non-finite loss at step 5 (epoch 1) on rank 1 (" "$dir/stop.log" ||
  fail "no message naming step 5 and rank 1"
python3 - "$dir/nan.st" <<'PY' || fail "the checkpoint is not the last finite one"
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack_from("<Q", blob)
step = int(json.loads(blob[8:8 + n])["__metadata__"]["step"])
assert step == 4, f"checkpoint at step {step}, expected 4 (the last before the NaN)"
PY
echo "nan stop: exit $status, named step 5 and rank 1, checkpoint stays at step 4"

# skip: the run finishes, every rank leaves step 5 out, and the metrics say so.
DDP_TEST_NAN_AT=1:5 "$ddprun" --standalone -n 2 --grace-period 2 "$train" --backend shm "${small[@]}" \
  --on-nonfinite skip --metrics "$dir/skip.jsonl" >"$dir/skip.log" 2>&1 || fail "skip exited $?"
grep -q "step 5 (epoch 1): non-finite loss; its update is skipped on every rank (1 so far)" \
  "$dir/skip.log" || fail "no skip message"
python3 - "$dir/skip.jsonl" <<'PY' || fail "metrics do not report the skipped step"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["skipped_steps"] for r in rows] == [1, 1], rows
assert all(math.isfinite(r["train_loss"]) and r["test_acc"] > 0.5 for r in rows), rows
PY

# Up-front validation: before the data is loaded, exit 1, naming flag, path and reason.
"$train" "${small[@]}" --save "$dir/missing/ck.st" >"$dir/save.log" 2>&1
[ $? -eq 1 ] || fail "--save in a missing directory did not exit 1"
grep -q -- "--save $dir/missing/ck.st: cannot create a file there .*No such file or directory" \
  "$dir/save.log" || fail "no --save message"
grep -q "^train:.*parameters" "$dir/save.log" && fail "--save was checked after the start"
touch "$dir/file"
"$train" "${small[@]}" --metrics "$dir/file/m.jsonl" >"$dir/metrics.log" 2>&1
[ $? -eq 1 ] || fail "--metrics under a file did not exit 1"
grep -q -- "--metrics $dir/file/m.jsonl: cannot open for appending: Not a directory" "$dir/metrics.log" ||
  fail "no --metrics message"
"$train" "${small[@]}" --device tpu >"$dir/tpu.log" 2>&1
[ $? -eq 2 ] || fail "--device tpu did not exit 2"
grep -q "invalid device 'tpu'" "$dir/tpu.log" || fail "no --device message"

# A stale temporary file (of a process that is gone) is removed by the next save;
# one of a live process (this shell) is not.
sleep 0 & gone=$!
wait $gone
touch "$dir/ck.st.tmp.$gone" "$dir/ck.st.tmp.$$"
"$train" "${small[@]}" --epochs 1 --save "$dir/ck.st" >"$dir/tmp.log" 2>&1 || fail "train exited $?"
[ -e "$dir/ck.st.tmp.$gone" ] && fail "the stale temporary file is still there"
[ -e "$dir/ck.st.tmp.$$" ] || fail "a live process's temporary file was removed"
grep -q "removed $dir/ck.st.tmp.$gone, left by a save that did not finish" "$dir/tmp.log" ||
  fail "no message about the removed file"

# SIGTERM: progress lines printed before step 6's checkpoint appeared are in the
# output after ddprun stops the group (stdout is line-buffered, not lost).
"$ddprun" --standalone -n 2 --grace-period 2 "$train" --backend shm --data synthetic --epochs 50 \
  --hidden 1024,1024 --log-every 1 --save "$dir/term.st" --save-every 6 >"$dir/term.log" 2>&1 &
pid=$!
deadline=$((SECONDS + 120))
until [ -e "$dir/term.st" ]; do
  [ $SECONDS -ge $deadline ] && { kill -KILL $pid; fail "no checkpoint within 120 s"; }
  sleep 0.05
done
kill -TERM $pid
wait $pid
grep -q "epoch 1 step 6/" "$dir/term.log" || fail "the lines printed before SIGTERM are lost"
echo "train_faults: ok"
