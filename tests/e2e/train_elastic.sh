#!/usr/bin/env bash
# Training that survives a dead rank (docs/elastic.md): `ddprun -n 4 --on-failure
# continue train`, a rank SIGKILLed by this script at a random moment; the job
# must exit 0, every step's loss appear once in the --loss-log, and the final
# checkpoint equal, byte for byte, a reference run that loses the same rank at
# the step the killed run went on from (DDP_TEST_KILL_AT=RANK:STEP: the rank
# kills itself after that step). Kills land
#   - inside a bucket's all_reduce (rank 0 slowed, so the others wait there),
#   - in the victim's forward (the victim slowed),
#   - on rank 0, the writer of the logs and checkpoints (--save-every 1: often
#     inside a save), whose successor takes the files over,
# on shm and gloo, and a gpt model's text windows (token shards written here);
# ZeRO-1 and ZeRO-2 with --zero-replicas 2 (the dead rank's optimizer shard from
# the rank before it; a replacement that gets its shard from the group);
# a replacement (--max-restarts 1) that joins the group again,
# its reference joining at the same step (DDP_TEST_JOIN_AT); then two ranks in a
# row, a rank replaced twice, a rank that hangs (SIGSTOP) instead of dying,
# --min-ranks reached (the ranks left save and stop; resumed, no step lost; again
# with the writer killed in that save), a run
# without failures that equals --on-failure restart's, and bad input.
# usage: train_elastic.sh DDPRUN TRAIN [quick]   (quick: the sanitizer build's
# cut-down set: gloo on rank 0, shm in the all_reduce with a replacement
# joining after it, bad input)
set -uo pipefail
ddprun=$1 train=$2 mode=${3:-full}
dir=$(mktemp -d)
cleanup() {
  pkill -KILL -f -- "--save $dir/" 2>/dev/null
  [ -n "${KEEP:-}" ] && { echo "kept $dir"; return; }  # KEEP=1: the files, for debugging
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "train_elastic.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }; done
  exit 1
}
# 4000 samples / 4 ranks / batch 64: 16 steps per epoch at 4 ranks, 21 at 3.
common=(--data synthetic --synthetic-size 4000 --epochs 3 --seed 5 --lr-schedule constant
  --optimizer adamw --lr 0.002)
# What run() trains: its samples per epoch, batch size, and whether the sampler
# pads (1: the mlp's DataLoader) or drops (0: the gpt's text windows).
task=("${common[@]}") samples=4000 batch=64 pad=1

rows() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
. "$(dirname "$0")/lib_elastic.sh"

# For a failure's report: every rank of the run writing $1.st still alive
# dumps its flight recorder (SIGUSR1), and the last collectives of each dump
# are printed with the rank's threads' kernel wait channels.
dump_ranks() {
  local p
  for p in $(pgrep -f -- "--save $1.st"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = train ] || continue
    echo "--- pid $p ($(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep '^RANK=')):" \
      "threads waiting in:$(for t in /proc/"$p"/task/*/wchan; do printf ' %s' "$(cat "$t" 2>/dev/null)"; done)" >&2
    kill -USR1 "$p"
  done
  sleep 2
  grep -o "SIGUSR1: wrote .*" "$1.log" | sed 's/SIGUSR1: wrote //' | while read -r f; do
    python3 - "$f" <<'PY' >&2 || true
import json, sys
d = json.load(open(sys.argv[1]))
print(f"--- rank {d['rank']} (pid {d['pid']}), last collectives:")
for c in d["collectives"][-4:]:
    print(f"  #{c['sequence']} {c['op']} {c['label']} {c['count']}: {c['state']}")
PY
  done
}

# run NAME BACKEND VICTIM(S) SLOW [ddprun and train flags...]: a run of 4 ranks
# under --on-failure continue whose VICTIMS (launch ranks, "2" or "2 3") this
# script SIGKILLs once the loss log has 4 rows (plus a random 0-150 ms), one
# after another; DDP_TEST_SLOW_RANK=SLOW. Then the reference, and the checks.
# EPOCHS=N: train N epochs, not the task's (3).
run() {
  local name=$1 backend=$2 victims=$3 slow=$4
  shift 4
  [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ] && return  # ONLY=NAME: one case, for debugging
  local out="$dir/$name"
  DDP_TEST_SLOW_RANK=$slow "$ddprun" --standalone -n 4 --on-failure continue "$@" "$train" \
    --backend "$backend" "${task[@]}" ${EPOCHS:+--epochs "$EPOCHS"} --save "$out.st" \
    --loss-log "$out.loss" --metrics "$out.jsonl" --save-every "${SAVE_EVERY:-4}" >"$out.log" 2>&1 &
  local job=$!
  local victim kill_at="" membership=0
  for victim in $victims; do
    membership=$((membership + 1))
    local want=$(($(rows "$out.loss") + 4))
    for _ in $(seq 400); do
      [ "$(rows "$out.loss")" -ge "$want" ] && break
      sleep 0.02
    done
    sleep "$(printf '0.%03d' $((RANDOM % 150)))"
    local pid
    pid=$(rank_pid "$out" "$victim")
    [ -n "$pid" ] || fail "$name: no process of rank $victim to kill"
    kill -KILL "$pid"
    # The step the group went on from: every survivor prints it.
    local step
    step=$(went_on_from "$out.log" "$membership" "[0-9]*")
    [ -n "$step" ] || {
      dump_ranks "$out"
      fail "$name: the ranks left did not regroup after rank $victim was killed"
    }
    kill_at="$kill_at${kill_at:+,}$victim:$step"
  done
  # With a replacement (--max-restarts 1): the step at which it joined.
  local join_env=()
  if [ -n "${REPLACE:-}" ]; then
    membership=$((membership + 1))
    local joined
    joined=$(went_on_from "$out.log" "$membership" 4)
    [ -n "$joined" ] || fail "$name: the replacement did not join"
    join_env=(DDP_TEST_JOIN_AT="*:$joined")
    kill_at="$kill_at (joined at $joined)"
  fi
  wait "$job" || fail "$name: the killed run exited $? (expected 0)"
  grep -q "the job succeeded; its membership changed" "$out.log" || fail "$name: no summary of the membership changes"
  check_loss_log "$out.loss"
  if [ -n "${REPLACE:-}" ]; then
    grep -q "the replacement for rank $victims joined" "$out.log" || fail "$name: no join in the summary"
  else
    # The straggler report leaves out the ranks that left: their few first steps
    # say nothing about the others (shm_forward slows its victim, so it was named).
    for victim in $victims; do
      ! grep -q "^ddprun: straggler report.*rank $victim computes" "$out.log" ||
        fail "$name: the straggler report blames rank $victim, which left the group: $(grep straggler "$out.log")"
    done
  fi
  # One victim, no replacement: the epoch it died in has the steps of its first
  # s steps at 4 ranks (4 x $batch samples each) plus the rest of the epoch's
  # $samples shared out over 3 ranks (the mlp: padded, a partial last batch
  # kept; the gpt: cut, whole batches) -- not a fresh epoch at 3.
  if [ "$membership" = 1 ]; then
    local at epoch in_epoch rest want_steps got_steps
    at=$(grep -o "membership 1 is ranks.*going on from step [0-9]* (epoch [0-9]*, step [0-9]* of it)" "$out.log" | head -1)
    epoch=$(sed 's/.*(epoch \([0-9]*\), step \([0-9]*\) of it)/\1/' <<<"$at")
    in_epoch=$(sed 's/.*(epoch \([0-9]*\), step \([0-9]*\) of it)/\2/' <<<"$at")
    if [ "$pad" = 1 ]; then
      rest=$(( (samples - 4 * batch * in_epoch + 2) / 3 ))
      want_steps=$(( in_epoch + (rest + batch - 1) / batch ))
    else
      rest=$(( (samples - 4 * batch * in_epoch) / 3 ))
      want_steps=$(( in_epoch + rest / batch ))
    fi
    got_steps=$(awk -v e="$epoch" '$1 == e' "$out.loss" | wc -l)
    [ "$got_steps" -eq "$want_steps" ] ||
      fail "$name: epoch $epoch has $got_steps steps; $in_epoch at 4 ranks and the rest of its samples at 3 make $want_steps"
  fi
  # A --metrics row for each change of the group, naming who left and joined.
  [ "$(grep -c '"event": "membership"' "$out.jsonl")" -eq "$membership" ] ||
    fail "$name: $membership membership changes, but these --metrics rows: $(grep membership "$out.jsonl")"
  local first=${victims%% *}
  grep -q "\"event\": \"membership\", .*\"membership\": 1, .*\"left\": \[$first\], \"joined\": \[\]" \
    "$out.jsonl" || fail "$name: the first membership row does not name rank $first leaving"
  if [ -n "${REPLACE:-}" ]; then
    grep -q "\"left\": \[\], \"joined\": \[$first\], \"world_size\": 4" "$out.jsonl" ||
      fail "$name: no membership row for the replacement joining"
  fi
  # The reference: the same ranks leave after the same steps, by themselves (and
  # the members take the replacement in at the same step).
  env "${join_env[@]}" DDP_TEST_SLOW_RANK="$slow" DDP_TEST_KILL_AT="${kill_at%% *}" "$ddprun" --standalone -n 4 \
    --on-failure continue "$@" "$train" --backend "$backend" "${task[@]}" ${EPOCHS:+--epochs "$EPOCHS"} \
    --save "$out.ref.st" --loss-log "$out.ref.loss" --save-every "${SAVE_EVERY:-4}" >"$out.ref.log" 2>&1 ||
    fail "$name: the reference run (DDP_TEST_KILL_AT=$kill_at) exited $?"
  cmp "$out.st" "$out.ref.st" ||
    fail "$name: the final checkpoint differs from the reference's (DDP_TEST_KILL_AT=$kill_at)"
  cmp <(cut -d' ' -f1,2 "$out.loss") <(cut -d' ' -f1,2 "$out.ref.loss") ||
    fail "$name: the loss log's steps differ from the reference's"
  echo "$name: rank(s) $victims killed ($kill_at); equal to the reference"
}

# gpt_run NAME ...: run() on a gpt model (1 layer, context 32) whose text is
# token shards of bytes written here: 1100 train windows of 33 tokens (17 steps
# of 4 x 16 windows per epoch at 4 ranks, 22 at 3; the windows past the cut are
# dropped, Note [text windows]) and 200 validation windows.
gpt_run() {
  [ -n "${ONLY:-}" ] && [ "$ONLY" != "$1" ] && return
  write_text
  local task=("${gpt_task[@]}")
  local samples=1100 batch=16 pad=0
  run "$@"
}

# The gpt model and its token shards (gpt_run).
gpt_task=(--model gpt:layers=1,d=32,heads=2,ctx=32 --data "$dir/text" --batch-size 16
  --epochs 3 --seed 5 --lr-schedule constant --lr 0.002 --eval-batches 2)
write_text() {
  [ -f "$dir/text/text_val.bin" ] && return
  mkdir -p "$dir/text"
  "${PYTHON:-/usr/bin/python3}" - "$dir/text" <<'PY' || fail "could not write the token shards"
import struct, sys
def shard(path, n, state):
    tokens = []
    for _ in range(n):  # letters and spaces from an LCG: a byte stream, not text
        state = (state * 1103515245 + 12345) % 2**31
        tokens.append(32 if state % 7 == 0 else 97 + state % 26)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
        f.write(struct.pack(f"<{n}H", *tokens))
shard(sys.argv[1] + "/text_train.bin", 1100 * 33 + 32, 1)
shard(sys.argv[1] + "/text_val.bin", 200 * 33 + 32, 2)
PY
}

# zero_run STAGE NAME ...: run() with ZeRO-STAGE and a replica of every shard
# (--zero-replicas 2, Note [zero replicas]): the dead rank's optimizer shard comes
# from the rank before it.
zero_run() {
  local task=("${common[@]}" --zero "$1" --zero-replicas 2)
  shift
  run "$@"
}

bad_input() {
  local out="$dir/bad.log"
  "$ddprun" --on-failure sometimes -n 2 "$train" >"$out" 2>&1
  [ $? -eq 2 ] && grep -q "on-failure sometimes: expected restart" "$out" || fail "--on-failure sometimes"
  "$ddprun" --min-ranks 2 -n 2 "$train" >"$out" 2>&1
  [ $? -eq 2 ] && grep -q "min-ranks 2 applies to --on-failure continue" "$out" || fail "--min-ranks alone"
  "$ddprun" --on-failure continue --min-ranks 3 -n 2 "$train" >"$out" 2>&1
  [ $? -eq 2 ] && grep -q "min-ranks 3 is more than the 2 ranks" "$out" || fail "--min-ranks 3 of 2"
  "$ddprun" --standalone -n 2 --on-failure continue "$train" --backend shm "${common[@]}" \
    --zero 1 >"$out" 2>&1
  [ $? -ne 0 ] && grep -q "zero 1 without --zero-replicas 2 under ddprun --on-failure continue" "$out" ||
    fail "--zero 1"
  "$ddprun" --standalone -n 2 --on-failure continue "$train" --backend shm "${common[@]}" \
    --zero 3 >"$out" 2>&1
  [ $? -ne 0 ] && grep -q "zero 3 under ddprun --on-failure continue.*use --zero 1 or 2 with --zero-replicas 2" "$out" ||
    fail "--zero 3"
  "$ddprun" --standalone -n 2 --on-failure continue "$train" --backend shm "${common[@]}" \
    --drop-last false >"$out" 2>&1
  [ $? -ne 0 ] && grep -q "drop-last false under ddprun --on-failure continue" "$out" ||
    fail "--drop-last false"
  echo "bad input: named"
}

# quick leaves shm_allreduce out: shm_replacement's kill is the same (rank 2 in
# the all_reduce on shm), and gloo_writer checks the epoch's steps after a death.
# gloo_writer trains 2 epochs (quick: 1; the death comes in the first): the third
# added only time. The replacements keep 3, so they join well before the end
# (5-13 steps after the death here, of 30+).
[ "$mode" = quick ] || run shm_allreduce shm 2 0:25
EPOCHS=$([ "$mode" = quick ] && echo 1 || echo 2) SAVE_EVERY=1 run gloo_writer gloo 0 1:25
REPLACE=1 run shm_replacement shm 2 0:25 --max-restarts 1
bad_input
[ "$mode" = quick ] && exit 0

run gloo_allreduce gloo 2 0:25
gpt_run shm_gpt shm 1 0:25
run shm_forward shm 2 2:25
SAVE_EVERY=1 run shm_writer shm 0 3:25
# 4 epochs: with 3 the group finished before the second kill once in CI, under load.
EPOCHS=4 run shm_two shm "2 3" 0:25
REPLACE=1 run gloo_replacement gloo 1 3:25 --max-restarts 1
zero_run 1 shm_zero1 shm 2 0:25
REPLACE=1 zero_run 2 gloo_zero2_replacement gloo 1 3:25 --max-restarts 1
[ -n "${ONLY:-}" ] && exit 0

# --zero-replicas 2, a death inside the optimizer's step (DDP_TEST_KILL_IN_UPDATE):
# rank 2 and the others are past the commit and updated, the parameters'
# all-gather fails. Step 7 counts: the group goes on from it, rank 2's shard from
# rank 1's replica, and ends equal to a reference that loses rank 2 after step 7.
for stage in 1 2; do
  out="$dir/in_update$stage"
  for kill in DDP_TEST_KILL_IN_UPDATE DDP_TEST_KILL_AT; do
    env "$kill=2:7" "$ddprun" --standalone -n 4 --on-failure continue "$train" --backend shm \
      "${common[@]}" --zero $stage --zero-replicas 2 --save "$out.$kill.st" \
      --loss-log "$out.$kill.loss" >"$out.$kill.log" 2>&1 || fail "in_update$stage: $kill=2:7 exited $?"
    grep -q "going on from step 7 (epoch 1, step 7 of it)" "$out.$kill.log" ||
      fail "in_update$stage: $kill=2:7 did not go on from step 7: $(grep 'going on' "$out.$kill.log")"
    check_loss_log "$out.$kill.loss"
  done
  cmp "$out.DDP_TEST_KILL_IN_UPDATE.st" "$out.DDP_TEST_KILL_AT.st" ||
    fail "in_update$stage: a death in step 7's update differs from one after step 7"
  echo "in_update$stage: ZeRO-$stage, rank 2 killed inside step 7's update; step 7 counted, equal to the reference"
done

# A death inside a --eval-every evaluation of the gpt model (DDP_TEST_KILL_IN_EVAL: rank 2 dies as
# step 8's evaluation begins, the others fail inside it): the group goes on from
# step 8 and evaluates it again, then writes its --save-every checkpoint. Every
# evaluation row once, and the final checkpoint equal to a reference that loses
# rank 2 right after step 8's evaluation and checkpoint.
# evaluated_run CASE NAME FAULT TRAIN-FLAGS...: a shm run of 4 ranks under
# continue with FAULT (VAR=RANK:STEP) in its environment, writing $out.NAME.st,
# .jsonl, .loss, .log; its loss log checked, its evaluation rows' steps in
# $out.NAME.steps, none twice.
evaluated_run() {
  local case=$1 name=$2 fault=$3
  shift 3
  env "$fault" "$ddprun" --standalone -n 4 --on-failure continue "$train" --backend shm "$@" \
    --save "$out.$name.st" --metrics "$out.$name.jsonl" --loss-log "$out.$name.loss" \
    >"$out.$name.log" 2>&1 || fail "$case: $fault exited $?"
  check_loss_log "$out.$name.loss"
  grep -v '"event"' "$out.$name.jsonl" | grep -o '"step": [0-9]*' >"$out.$name.steps"
  [ "$(sort "$out.$name.steps" | uniq -d)" = "" ] ||
    fail "$case: $fault: a --metrics row twice: $(sort "$out.$name.steps" | uniq -d)"
}
gpt_evaluated=("${gpt_task[@]}" --epochs 1 --eval-every 4 --save-every 4)

out="$dir/in_eval"
write_text
for kill in DDP_TEST_KILL_IN_EVAL DDP_TEST_KILL_AT; do
  evaluated_run in_eval "$kill" "$kill=2:8" "${gpt_evaluated[@]}"
done
grep -q '"step": 8$' "$out.DDP_TEST_KILL_IN_EVAL.steps" ||
  fail "in_eval: no evaluation row for step 8 after the death inside it: $(tr '\n' ' ' <"$out.DDP_TEST_KILL_IN_EVAL.steps")"
cmp "$out.DDP_TEST_KILL_IN_EVAL.steps" "$out.DDP_TEST_KILL_AT.steps" ||
  fail "in_eval: the evaluation rows' steps differ from the reference's"
cmp "$out.DDP_TEST_KILL_IN_EVAL.st" "$out.DDP_TEST_KILL_AT.st" ||
  fail "in_eval: the final checkpoint differs from the reference's"
echo "in_eval: rank 2 killed inside step 8's evaluation; evaluated again, every row once, equal to the reference"

# The writer dying inside a report, right after its --metrics row and before the
# report's checkpoint (DDP_TEST_KILL_IN_REPORT=0:STEP, Note [reports committed]):
# step 8's --eval-every report, and the report at the end of the run (its last
# step, as a plain run of 4 ranks counts it). The others cannot complete the
# report before the writer, so the group takes it again: every evaluation row
# once, and the final checkpoint (written by the new writer) equal to a
# reference that loses rank 0 right after that step.
out="$dir/in_report"
write_text
evaluated_run in_report plain DDP_TEST_NONE=1 "${gpt_evaluated[@]}"
last=$(rows "$out.plain.loss")
for at in 8 "$last"; do
  evaluated_run in_report "report$at" "DDP_TEST_KILL_IN_REPORT=0:$at" "${gpt_evaluated[@]}"
  evaluated_run in_report "after$at" "DDP_TEST_KILL_AT=0:$at" "${gpt_evaluated[@]}"
  grep -q "\"step\": $at\$" "$out.report$at.steps" ||
    fail "in_report: no evaluation row for step $at after the writer died in its report"
  cmp "$out.report$at.steps" "$out.after$at.steps" ||
    fail "in_report: step $at: the evaluation rows' steps differ from the reference's"
  cmp "$out.report$at.st" "$out.after$at.st" ||
    fail "in_report: step $at: the final checkpoint differs from the reference's"
done
echo "in_report: the writer killed in the reports of steps 8 and $last (the last); reported again, every row once, equal to the references"

# The same inside the report that decides --early-stop (the mlp at a learning
# rate too small to change a weight: every test_acc ties the first, exactly at
# 3 and at 4 ranks; --early-stop 2 stops after epoch 3's report). The report
# taken again counts its evaluation once: the checkpoint (which holds the count
# since the best) equals the reference's, and no step runs after the stop.
stop_task=(--data synthetic --synthetic-size 3600 --epochs 4 --seed 5 --optimizer adamw
  --lr 1e-30 --early-stop 2)
out="$dir/in_stop"
for kill in DDP_TEST_KILL_IN_REPORT DDP_TEST_KILL_AT; do
  evaluated_run in_stop "$kill" "$kill=0:45" "${stop_task[@]}"
  [ "$(rows "$out.$kill.loss")" = 45 ] || fail "in_stop: $kill: $(rows "$out.$kill.loss") steps, not 45"
done
[ "$(tr '\n' ' ' <"$out.DDP_TEST_KILL_IN_REPORT.steps")" = '"step": 15 "step": 30 "step": 45 ' ] ||
  fail "in_stop: evaluation rows $(tr '\n' ' ' <"$out.DDP_TEST_KILL_IN_REPORT.steps"), expected steps 15, 30, 45 once"
grep -q "early stop: test_acc has not improved on its best .* in 2 evaluations; stopping at step 45" \
  "$out.DDP_TEST_KILL_IN_REPORT.log" || fail "in_stop: no early stop at step 45 after the report taken again"
cmp "$out.DDP_TEST_KILL_IN_REPORT.st" "$out.DDP_TEST_KILL_AT.st" ||
  fail "in_stop: the final checkpoint differs from the reference's"
echo "in_stop: the writer killed in the report that stops early; taken again, counted once, equal to the reference"

# A rank that hangs: stopped, ddprun gives it up after --stopped-timeout 1.
out="$dir/stopped"
DDP_TEST_SLOW_RANK=0:25 "$ddprun" --standalone -n 4 --on-failure continue --stopped-timeout 1 \
  "$train" --backend shm "${common[@]}" --save "$out.st" --loss-log "$out.loss" >"$out.log" 2>&1 &
job=$!
for _ in $(seq 400); do [ "$(rows "$out.loss")" -ge 4 ] && break; sleep 0.02; done
kill -STOP "$(rank_pid "$out" 1)"
wait "$job" || fail "stopped: exited $? (expected 0)"
grep -q "rank 1 (pid [0-9]*) has been stopped by SIGSTOP.*the group went on with ranks 0,2,3" \
  "$out.log" || fail "stopped: ddprun did not give up rank 1 and go on"
check_loss_log "$out.loss"
echo "stopped: rank 1 given up after --stopped-timeout, the others went on"

# A rank that hangs, alive (stopped, but --stopped-timeout 0 leaves it to the hang
# detector): --hang-timeout 3, below the collective timeout (DDP_TIMEOUT_S=20),
# removes it while the others still wait in the collective; they go on.
out="$dir/hung"
DDP_TIMEOUT_S=20 DDP_TEST_SLOW_RANK=0:25 "$ddprun" --standalone -n 3 --on-failure continue \
  --stopped-timeout 0 --hang-timeout 3 "$train" --backend gloo "${common[@]}" --save "$out.st" \
  --loss-log "$out.loss" >"$out.log" 2>&1 &
job=$!
for _ in $(seq 400); do [ "$(rows "$out.loss")" -ge 4 ] && break; sleep 0.02; done
kill -STOP "$(rank_pid "$out" 2)"
wait "$job" || fail "hung: exited $? (expected 0)"
grep -q "rank 2 (pid [0-9]*) made no progress for .*the group went on with ranks 0,1 " "$out.log" ||
  fail "hung: the hang detector did not give rank 2 up"
check_loss_log "$out.loss"
echo "hung: the hang detector gave rank 2 up; the others went on"

# A rank that hangs once a replacement has joined: only it is given up. (The
# replacement's flight recorder region was named by its place in the membership,
# 3, so ddprun took it for launch rank 3's and gave up the healthy replacement too.)
out="$dir/hung_join"
# The join is pinned to step 6 (DDP_TEST_JOIN_AT: the members wait for it there).
DDP_TIMEOUT_S=20 DDP_TEST_KILL_AT=2:3 DDP_TEST_JOIN_AT='*:6' DDP_TEST_SLOW_RANK=0:25 "$ddprun" \
  --standalone -n 4 --on-failure continue --max-restarts 1 --stopped-timeout 0 --hang-timeout 4 \
  "$train" --backend shm "${common[@]}" --save "$out.st" --loss-log "$out.loss" >"$out.log" 2>&1 &
job=$!
[ -n "$(went_on_from "$out.log" 2 4)" ] || fail "hung_join: the replacement did not join"
sleep 0.3
victim=$(rank_pid "$out" 3)
[ -n "$victim" ] || fail "hung_join: no process of launch rank 3 to stop"
kill -STOP "$victim"
wait "$job" || fail "hung_join: exited $? (expected 0)"
grep -q "rank 3 (pid [0-9]*) made no progress for .*the group went on with ranks 0,1,2 " "$out.log" ||
  fail "hung_join: the hang detector did not give rank 3 alone up"
! grep -q "rank 2 (pid [0-9]*) made no progress" "$out.log" ||
  fail "hung_join: the healthy replacement of rank 2 was given up: $(grep 'made no progress' "$out.log")"
check_loss_log "$out.loss"
echo "hung_join: after a replacement joined, the hang detector gave up the stopped rank 3 alone"

# Another rank dies while the ranks left regroup (killed as soon as one prints
# that it regroups): they regroup again and go on.
out="$dir/during"
DDP_TEST_KILL_AT=2:3 DDP_TEST_SLOW_RANK=0:25 "$ddprun" --standalone -n 4 --on-failure continue \
  "$train" --backend shm "${common[@]}" --save "$out.st" --loss-log "$out.loss" \
  --metrics "$out.jsonl" >"$out.log" 2>&1 &
job=$!
victim=$(for _ in $(seq 2000); do p=$(rank_pid "$out" 1); [ -n "$p" ] && { echo "$p"; break; }; sleep 0.005; done)
for _ in $(seq 2000); do grep -q "regrouping (--on-failure continue)" "$out.log" && break; sleep 0.002; done
kill -KILL "$victim"
wait "$job" || fail "during: exited $? (expected 0)"
[ "$(grep -c '"event": "membership"' "$out.jsonl")" -ge 1 ] && grep -q "the group went on with ranks 0,3" "$out.log" ||
  fail "during: the group did not go on with ranks 0,3"
check_loss_log "$out.loss"
echo "during: a death during the regroup ($(grep -c "regrouping again" "$out.log") ranks regrouped again); the group went on with ranks 0,3"

# The same under ZeRO-1 with replicas: rank 2 dies after step 3, rank 0 (not its
# neighbour: shard 2's copy is on rank 1, shard 0's on rank 3) while the others
# regroup; recover() is tried again with what the first attempt left.
out="$dir/during_zero"
DDP_TEST_KILL_AT=2:3 DDP_TEST_SLOW_RANK=1:25 "$ddprun" --standalone -n 4 --on-failure continue \
  "$train" --backend shm "${common[@]}" --zero 1 --zero-replicas 2 --save "$out.st" \
  --loss-log "$out.loss" --metrics "$out.jsonl" >"$out.log" 2>&1 &
job=$!
victim=$(for _ in $(seq 2000); do p=$(rank_pid "$out" 0); [ -n "$p" ] && { echo "$p"; break; }; sleep 0.005; done)
for _ in $(seq 2000); do grep -q "regrouping (--on-failure continue)" "$out.log" && break; sleep 0.002; done
kill -KILL "$victim"
wait "$job" || fail "during_zero: exited $? (expected 0)"
grep -q "the group went on with ranks 1,3" "$out.log" || fail "during_zero: the group did not go on with ranks 1,3"
check_loss_log "$out.loss"
echo "during_zero: ZeRO-1, rank 0 killed during the regroup ($(grep -c "regrouping again" "$out.log") ranks regrouped again); the group went on with ranks 1,3"

# The rank killed at the last step, --max-restarts 1: the replacement is ready
# after the others finished; it is not needed, and the job succeeds.
out="$dir/late"
DDP_TEST_KILL_AT=1:15 "$ddprun" --standalone -n 2 --on-failure continue --max-restarts 1 \
  "$train" --backend shm --data synthetic --synthetic-size 2000 --epochs 1 --seed 5 \
  --save "$out.st" >"$out.log" 2>&1 || fail "late: exited $? (expected 0)"
grep -q -e "was not needed" -e "the group finished before this replacement joined" "$out.log" ||
  fail "late: the replacement was not told the group finished"
echo "late: a replacement after the last step is not needed; exit 0"

# The same rank replaced twice (--max-restarts 2): rank 2 killed, then its
# replacement. The second replacement takes in only a membership made after it
# asked to join: membership 2 also lists launch rank 2 (the first replacement's),
# and trying to form it again cost a failed attempt ("joining again"). Rank 0 takes
# 30 ms a step (DDP_TEST_SLOW_RANK): the second replacement has the 140 steps left,
# 4 s and more, to start and join (at full speed they took 1.4 s, and on a loaded
# machine the group once finished before it was ready).
out="$dir/twice"
DDP_TEST_SLOW_RANK=0:30 "$ddprun" --standalone -n 4 --on-failure continue --max-restarts 2 "$train" --backend shm \
  "${common[@]}" --epochs 10 --save "$out.st" --loss-log "$out.loss" >"$out.log" 2>&1 &
job=$!
# after_rows N: waits until the loss log has N rows (8 s at most).
after_rows() { for _ in $(seq 400); do [ "$(rows "$out.loss")" -ge "$1" ] && return; sleep 0.02; done; }
after_rows 4
kill -KILL "$(rank_pid "$out" 2)"
[ -n "$(went_on_from "$out.log" 2 4)" ] || fail "twice: the first replacement did not join"
after_rows $(($(rows "$out.loss") + 8))
victim=$(rank_pid "$out" 2)
[ -n "$victim" ] || fail "twice: no replacement of rank 2 to kill"
kill -KILL "$victim"
wait "$job" || fail "twice: exited $? (expected 0)"
grep -q "the replacement for rank 2 joined at .*(membership 4)" "$out.log" ||
  fail "twice: the second replacement did not join as membership 4"
! grep -q "joining again" "$out.log" || fail "twice: a replacement tried a membership before its request: $(grep 'joining again' "$out.log")"
check_loss_log "$out.loss"
echo "twice: rank 2 and its replacement killed; the second replacement joined membership 4 at once"

# --min-ranks 4: the first death ends the job, naming it; the ranks left stop
# cleanly (Note [group stop]), with nothing to save (no --save).
out="$dir/min"
DDP_TEST_KILL_AT=2:3 "$ddprun" --standalone -n 4 --on-failure continue --min-ranks 4 \
  --grace-period 2 "$train" --backend shm "${common[@]}" >"$out.log" 2>&1
code=$?
[ $code -ne 0 ] || fail "min-ranks: exit 0"
grep -q "3 ranks would be left, fewer than --min-ranks 4: ending the job; the ranks left (0,1,3) regroup" \
  "$out.log" || fail "min-ranks: not named"
grep -q "rank 0 (launch rank 0): the group stopped at step 3: .*; no checkpoint: the run has no --save" \
  "$out.log" || fail "min-ranks: rank 0 did not say where the group stopped"
[ "$(grep -c "exit code 75 .*(left at the group's stop: saved, then exited)" "$out.log")" -eq 3 ] ||
  fail "min-ranks: the 3 ranks left did not stop by themselves: $(grep -A5 'summary of' "$out.log")"
echo "min-ranks: exit $code, named; the ranks left stopped by themselves"
# A program that does not say it handles the stop (elastic/handles_stop: train
# does; a PyTorch script does not) is ended at once, as before, not waited for.
probe="$(dirname "$train")/rank_probe"
if [ -x "$probe" ]; then
  start=$SECONDS
  "$ddprun" --standalone -n 3 --on-failure continue --min-ranks 3 --grace-period 2 "$probe" \
    --exit-code 9 --on-rank 1 --sleep 60 >"$dir/probe_min.log" 2>&1
  code=$?
  [ $code -eq 9 ] && [ $((SECONDS - start)) -lt 30 ] ||
    fail "min-ranks probe: exit $code after $((SECONDS - start)) s (expected 9, at once)"
  ! grep -q "regroup as membership" "$dir/probe_min.log" ||
    fail "min-ranks probe: ddprun waited for ranks that cannot stop as the group asks"
  echo "min-ranks probe: a program without the group stop ended at once (exit 9)"
fi

# --min-ranks 3 reached at the second death (Note [group stop]): the 2 ranks left
# regroup, write --save where the group stands (step 13, not the --save-every 4
# checkpoint of step 12) and exit; the job exits with the dead rank's status. A new
# job of 3 ranks resumes it: the epoch goes on from the samples the group took
# (epoch_cursor; the global batch differs), and ends as the job that lost only
# the first rank, its loss log byte for byte: no step lost.
out="$dir/cursor"
one=(--backend shm --data synthetic --synthetic-size 4000 --epochs 1 --seed 5 --lr-schedule
  constant --optimizer adamw --lr 0.002 --save-every 4)
DDP_TEST_KILL_AT=2:5,3:13 "$ddprun" --standalone -n 4 --on-failure continue --min-ranks 3 \
  --grace-period 2 "$train" "${one[@]}" --save "$out.st" --loss-log "$out.loss" >"$out.log" 2>&1
code=$?
[ $code -eq 137 ] || fail "stop: the job with two deaths and --min-ranks 3 exited $code, not the dead rank's 137"
grep -q "rank 0 (launch rank 0): the group stopped at step 13: .* fewer than --min-ranks 3; checkpoint $out.st written (epoch 1, step 13 of it)" \
  "$out.log" || fail "stop: rank 0 did not write its checkpoint at step 13"
"$ddprun" --standalone -n 3 "$train" "${one[@]}" --save "$out.st" --loss-log "$out.loss" \
  --resume auto >"$out.resumed.log" 2>&1 || fail "stop: the resumed job exited $?"
grep -q "after its step 13 at sample position 2816, where this run.s steps would have taken 2496" "$out.resumed.log" ||
  fail "stop: the resume did not go on from the group's sample position: $(grep -m3 'rank 0' "$out.resumed.log")"
DDP_TEST_KILL_AT=2:5 "$ddprun" --standalone -n 4 --on-failure continue --grace-period 2 \
  "$train" "${one[@]}" --save "$out.ref.st" --loss-log "$out.ref.loss" >"$out.ref.log" 2>&1 ||
  fail "stop: the reference exited $?"
cmp "$out.loss" "$out.ref.loss" || fail "stop: the resumed loss log differs from the reference's"
echo "stop: --min-ranks reached; the ranks left saved step 13, resumed at 3 ranks as the job that lost one rank"
# The writer dies in the stop's save (rank 0, before it writes; Note [group stop]):
# rank 1's all_reduce after its part of the save fails, so it does not exit;
# ddprun publishes the stop once more without rank 0, and launch rank 1, rank 0
# now, writes step 13. It resumes as the first stop's checkpoint did, to the same
# loss log.
DDP_TEST_KILL_AT=2:5,3:13 DDP_TEST_KILL_IN_SAVE=0:13 "$ddprun" --standalone -n 4 \
  --on-failure continue --min-ranks 3 --grace-period 2 "$train" "${one[@]}" --save "$out.st2" \
  --loss-log "$out.loss2" >"$out.twice.log" 2>&1
code=$?
[ $code -eq 137 ] || fail "stop twice: exited $code, not the first dead rank's 137"
grep -q "rank 0 failed at the group's stop (killed by SIGKILL): the rank left (1) regroup once more, as membership 3" \
  "$out.twice.log" || fail "stop twice: ddprun did not stop the group again without rank 0"
grep -q "rank 0 (launch rank 1): the group stopped at step 13: .*; then rank 0 failed at the group's stop .*; checkpoint $out.st2 written (epoch 1, step 13 of it)" \
  "$out.twice.log" || fail "stop twice: launch rank 1 alone did not write step 13"
"$ddprun" --standalone -n 3 "$train" "${one[@]}" --save "$out.st2" --loss-log "$out.loss2" \
  --resume auto >"$out.resumed2.log" 2>&1 || fail "stop twice: the resumed job exited $?"
cmp "$out.loss2" "$out.ref.loss" || fail "stop twice: the resumed loss log differs from the reference's"
echo "stop twice: the writer killed in the stop's save; the last rank saved step 13, resumed as the first stop's"

# Without a failure, continue trains as restart does.
"$ddprun" --standalone -n 4 --on-failure continue "$train" --backend shm "${common[@]}" \
  --save "$dir/clean_c.st" >"$dir/clean_c.log" 2>&1 || fail "clean continue run exited $?"
"$ddprun" --standalone -n 4 "$train" --backend shm "${common[@]}" \
  --save "$dir/clean_r.st" >"$dir/clean_r.log" 2>&1 || fail "clean restart run exited $?"
cmp "$dir/clean_c.st" "$dir/clean_r.st" || fail "a run without failures differs under continue"
echo "no failure: continue equals restart"
echo "train_elastic.sh: PASS"
