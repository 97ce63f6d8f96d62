#!/usr/bin/env bash
# Faults `train` must not hide (docs/train.md): a NaN loss under ddprun stops the
# run naming the step and the rank, or with --on-nonfinite skip is left out on
# every rank; NaN losses on two ranks at once name the lower; NaN weights (a
# non-finite gradient with a finite loss) on one rank stop every rank at the
# same step, with or without --save; unwritable output paths (a directory as
# --save included) fail before the first step; a stale temporary file of a
# crashed save is removed by the next save, and one left by a process with this
# run's pid does not stop it; a line printed just before ddprun stops the group
# with SIGTERM is in the output.
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

# Two ranks started by hand, as mpirun or srun would (no ddprun tearing the group
# down after the first failure, so each rank's own message and exit status are
# seen): ranks NAME.0.log and NAME.1.log; statuses in $st0 $st1. A rank waiting
# in a collective for one that stopped would hang until `timeout` (exit 124).
. "$(dirname "$0")/lib_ports.sh"
two_ranks() {
  # A port below the ephemeral range (lib_ports.sh): a random one from 20000-40000
  # was once another connection's, and rank 0 failed to listen (rank 1 waited 120 s).
  local name=$1 port
  port=$(free_port)
  shift
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 120 "$train" --backend shm "$@" >"$dir/$name.$r.log" 2>&1 &
    eval "pid$r=\$!"
  done
  wait "$pid0"; st0=$?
  wait "$pid1"; st1=$?
}

# NaN loss on both ranks at step 5: both name rank 0 (the lower), not themselves.
DDP_TEST_NAN_AT='*:5' two_ranks both "${small[@]}"
[ "$st0 $st1" = "1 1" ] || fail "NaN on both ranks: exit statuses $st0 $st1, expected 1 1"
grep -q "non-finite loss at step 5 (epoch 1) on rank 0 (seen from rank 1)" "$dir/both.1.log" ||
  fail "rank 1 does not name rank 0"

# NaN weights on rank 1 after step 8 (finite loss), --save-every 4: every rank
# stops at step 8 naming rank 1; the checkpoint stays at step 4.
DDP_TEST_NAN_WEIGHT_AT=1:8 two_ranks weights "${small[@]}" --save "$dir/w.st" --save-every 4
[ "$st0 $st1" = "1 1" ] || fail "NaN weights: exit statuses $st0 $st1, expected 1 1 (124: a hang)"
grep -q "non-finite weights after step 8 on rank 1 (their sum is nan" "$dir/weights.1.log" ||
  fail "rank 1 does not name step 8"
grep -q "non-finite weights after step 8 on rank 1 (seen from rank 0)" "$dir/weights.0.log" ||
  fail "rank 0 does not stop at step 8 naming rank 1"
python3 - "$dir/w.st" <<'PY' || fail "the checkpoint is not step 4's"
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack_from("<Q", blob)
assert json.loads(blob[8:8 + n])["__metadata__"]["step"] == "4"
PY
# Without --save, after the run's last step (--max-steps 6): not exit 0.
DDP_TEST_NAN_WEIGHT_AT=1:6 two_ranks weights_end "${small[@]}" --epochs 1 --max-steps 6
[ "$st0 $st1" = "1 1" ] || fail "NaN weights after the last step: exit statuses $st0 $st1, expected 1 1"
grep -q "non-finite weights after step 6 on rank 1 (seen from rank 0)" "$dir/weights_end.0.log" ||
  fail "no message naming step 6 at the run's end"
echo "nan weights: both ranks exit 1 at the step naming rank 1, with or without --save"

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

# An epoch whose every step was skipped has no train_loss: null (nan in the report),
# not a perfect 0.
"$train" --data synthetic --synthetic-size 500 --batch-size 50 --epochs 2 --device cpu --lr 1e12 \
  --on-nonfinite skip --metrics "$dir/allskip.jsonl" >"$dir/allskip.log" 2>&1 ||
  fail "the run whose steps were all skipped exited $?"
python3 - "$dir/allskip.jsonl" <<'PY' || fail "an epoch of skipped steps reports a train_loss"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
assert last["skipped_steps"] >= 10 + 8 and last["train_loss"] is None, last
PY
grep -q "epoch 2/2: train_loss nan" "$dir/allskip.log" || fail "the report: $(grep 'epoch 2/2' "$dir/allskip.log")"
# ... and the summary says how many steps were skipped (it read as a success).
grep -Eq "^summary: .*; [0-9]+ of 20 steps skipped \(--on-nonfinite skip: " "$dir/allskip.log" ||
  fail "the summary does not count the skipped steps: $(grep '^summary' "$dir/allskip.log")"

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
mkdir "$dir/adir"
"$train" "${small[@]}" --save "$dir/adir" >"$dir/savedir.log" 2>&1
[ $? -eq 1 ] || fail "--save naming a directory did not exit 1"
grep -q -- "--save $dir/adir: is a directory; expected a file path" "$dir/savedir.log" ||
  fail "no message for a directory as --save"
grep -q "^train:.*parameters" "$dir/savedir.log" && fail "the directory --save was checked after the start"
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

# A temporary left by a crashed process with this run's pid (pids repeat across
# container restarts) does not stop the run: exec keeps the shell's pid.
bash -c 'touch "$1.tmp.$$"; exec "${@:2}"' _ "$dir/same.st" "$train" "${small[@]}" --epochs 1 \
  --save "$dir/same.st" >"$dir/samepid.log" 2>&1 || fail "a same-pid temporary stopped the run ($?)"
ls "$dir" | grep -q '^same\.st\.tmp\.' && fail "the same-pid temporary is still there"

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
