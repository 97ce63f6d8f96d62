#!/usr/bin/env bash
# --on-failure continue across nodes (docs/elastic.md, Note [nodes lost] in
# launcher/rendezvous.h): two ddprun agents on this machine, 2 ranks each, gloo.
# Node 0's ddprun keeps the membership; node 1's tells it what it sees.
#   rank:  rank 3 (node 1) SIGKILLed; node 1 starts its replacement
#          (--max-restarts 1), node 0 takes it in; both agents exit 0
#   agent: node 1's ddprun SIGKILLed (its ranks die with it): node 0 sees its
#          store connection close and goes on with ranks 0,1
#   stop:  node 1's ddprun SIGSTOPped (its ranks run on): after --node-timeout 2
#          node 0 takes ranks 2,3 out, they exit, 0,1 go on; node 1, continued,
#          exits 1
#   freeze: node 1's ddprun and ranks SIGSTOPped (a machine gone silent): node 0
#          takes them out after --node-timeout 2, does not blame its own ranks
#          when its hang detector fires, and ranks 0,1 regroup at their
#          all_reduce's timeout
#   min:   rank 3 SIGKILLed under --min-ranks 4: ranks 0-2 save and exit, both agents
#          end with its status;
#          again with one rank a node (node 1 left with none); min_save: then
#          rank 2 (node 1) dies in that save, and ranks 0,1 save without it
#   node0: under --rdzv-backup, rank 3 SIGKILLed and replaced, then node 0's
#          ddprun SIGKILLed (the store's host, its ranks die with it): node 1's
#          backup store takes over, node 1 keeps the membership, ranks 2,3 go on; node1: the backup's host lost instead,
#          node 0 goes on as without a backup; stop_backup: the stop case
#          under --rdzv-backup (node 1, taken out, does not take over when node
#          0 ends); standby: three nodes, node 1's only rank dies, then node
#          0: node 1, with no rank left, still takes over and node 2's rank goes
#          on; mismatch: nodes given different --rdzv-backup are refused by name
# Each run that goes on must exit 0, log every step once, and end with the
# checkpoint, byte for byte, of one node's `ddprun -n 4` losing the same ranks
# after the same step (DDP_TEST_KILL_AT) and taking the replacement in at the
# same step (DDP_TEST_JOIN_AT): the gloo sums are the same across agents.
# usage: train_elastic_nnodes.sh DDPRUN TRAIN [quick]   (quick: the sanitizer build's
# cases, node0 and mismatch: a replacement joining across nodes, the store's backup
# taking over, a refused flag; freeze and rank left the quick set on 2026-12-02 to keep
# CI under 40 minutes; the full run took 290 s of its 300 under ASan on an AVX2 EPYC)
set -uo pipefail
ddprun=$1 train=$2 mode=${3:-full}
dir=$(mktemp -d)
export DDP_STORE_SECRET="e2e-$RANDOM$RANDOM"
cleanup() {
  pkill -CONT -f -- "--save $dir/" 2>/dev/null
  pkill -KILL -f -- "--save $dir/" 2>/dev/null
  [ -n "${KEEP:-}" ] && { echo "kept $dir"; return; }
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "train_elastic_nnodes.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -25 "$f" >&2; }; done
  exit 1
}
# free_port: a port P below the kernel's ephemeral range with P + 1 free too (a port
# from bind(0) could be taken by another test's connection before ddprun listens on
# it: "cannot listen on 127.0.0.1:P: Address already in use" failed this test once).
. "$(dirname "$0")/lib_ports.sh"
rows() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
. "$(dirname "$0")/lib_elastic.sh"
# 8000 samples at batch 64 over 4 ranks: 32 steps an epoch.
task=(--backend gloo --data synthetic --synthetic-size 8000 --epochs 3 --seed 5
  --lr-schedule constant --optimizer adamw --lr 0.002)

# start NAME [ddprun flags]: both agents, in the background (pids in node0, node1).
start() {
  local name=$1
  shift
  local port backup=()
  port=$(free_port)  # the agents' store takes port + 1, ddprun's default --rdzv-port
  if [ -n "${BACKUP:-}" ]; then  # node 1 hosts the store's backup (Note [node 0 lost])
    backup=(--rdzv-backup "127.0.0.1:$(free_port_besides "$port")")
  fi
  local common=(--nnodes 2 -n "${NPROC:-2}" --master-port "$port" --on-failure
    continue --grace-period 2 --rdzv-timeout 30 "${backup[@]}" "$@")
  local flags=("${task[@]}" ${EPOCHS:+--epochs "$EPOCHS"} --save "$dir/$name.st" --loss-log "$dir/$name.loss" --metrics "$dir/$name.jsonl")
  "$ddprun" "${common[@]}" --node-rank 1 "$train" "${flags[@]}" >"$dir/$name.node1.log" 2>&1 &
  node1=$!
  "$ddprun" "${common[@]}" --node-rank 0 "$train" "${flags[@]}" >"$dir/$name.node0.log" 2>&1 &
  node0=$!
  for _ in $(seq 1000); do
    [ "$(rows "$dir/$name.loss")" -ge 6 ] && return
    sleep 0.02
  done
  fail "$name: no 6 steps logged in 20 s"
}
# node_lost NAME WHY: node 0 exited 0 having taken node 1 (ranks 2,3) out for
# WHY (the start of its reason), and ranks 0,1 regrouped; sets left (the step).
node_lost() {
  wait "$node0" || fail "$1: node 0 exited $?"
  left=$(went_on_from "$dir/$1.node0.log" 1)
  [ -n "$left" ] || fail "$1: ranks 0,1 did not regroup"
  grep -q "^ddprun: node 1 (ranks 2,3) was lost: $2" "$dir/$1.node0.log" ||
    fail "$1: node 0 does not name node 1 lost ($2)"
}
# reference NAME KILL_AT [JOIN_AT]: one node's run losing the same ranks after the same step.
reference() {
  local name=$1 kill_at=$2 join=${3:-}
  env ${join:+DDP_TEST_JOIN_AT="*:$join"} DDP_TEST_KILL_AT="$kill_at" "$ddprun" --standalone -n 4 \
    --on-failure continue ${join:+--max-restarts 1} "$train" "${task[@]}" ${EPOCHS:+--epochs "$EPOCHS"} --save "$dir/$name.ref.st" \
    --loss-log "$dir/$name.ref.loss" >"$dir/$name.ref.log" 2>&1 ||
    fail "$name: the reference (DDP_TEST_KILL_AT=$kill_at) exited $?"
  cmp "$dir/$name.st" "$dir/$name.ref.st" ||
    fail "$name: the final checkpoint differs from one node's run with DDP_TEST_KILL_AT=$kill_at"
  cmp <(cut -d' ' -f1,2 "$dir/$name.loss") <(cut -d' ' -f1,2 "$dir/$name.ref.loss") ||
    fail "$name: the loss log's steps differ from the reference's"
}

# Not in the quick set since 2026-12-02 (CI was 43 min): node0 below takes a replacement
# in across nodes too.
if [ "$mode" != quick ]; then
  # --- rank: a rank on node 1 dies; its replacement joins through node 0.
  start rank --max-restarts 1
  kill -KILL "$(rank_pid "$dir/rank" 3)"
  left=$(went_on_from "$dir/rank.node0.log" 1)
  joined=$(went_on_from "$dir/rank.node0.log" 2)
  [ -n "$left" ] && [ -n "$joined" ] || fail "rank: no regroup after rank 3 died, or no join"
  wait "$node0" || fail "rank: node 0 exited $?"
  wait "$node1" || fail "rank: node 1 exited $?"
  grep -q "^ddprun: rank 3 (pid [0-9]*) failed: killed by SIGKILL.*; it left the group (--on-failure continue: node 0 publishes" \
    "$dir/rank.node1.log" || fail "rank: node 1 does not say rank 3 left"
  grep -q "^ddprun: rank 3 (pid [0-9]*) failed: killed by SIGKILL.*the group went on with ranks 0,1,2 (--on-failure continue: membership 1)" \
    "$dir/rank.node0.log" || fail "rank: node 0 does not publish ranks 0,1,2"
  grep -q "^ddprun: the replacement for rank 3 is ready; node 0 takes it into the group" "$dir/rank.node1.log" ||
    fail "rank: node 1 does not hand its replacement to node 0"
  grep -q "^ddprun: the replacement for rank 3 joined at .*the group went on with ranks 0,1,2,3 (membership 2)" \
    "$dir/rank.node0.log" || fail "rank: node 0 does not take the replacement in"
  grep -q '"left": \[3\], "joined": \[\], "world_size": 3' "$dir/rank.jsonl" || fail "rank: no --metrics row for rank 3 leaving"
  check_loss_log "$dir/rank.loss"
  reference rank "3:$left" "$joined"
  echo "rank: rank 3 (node 1) killed, went on from step $left at 3 ranks, its replacement joined at step $joined; equal to one node's run"

  # --- agent: node 1's ddprun dies, and its ranks with it.
  start agent
  kill -KILL "$node1"
  node_lost agent "its ddprun closed its connection to the store"
  grep -q "^ddprun: node 1 (ranks 2,3) was lost at .*; the group went on with ranks 0,1 (--on-failure continue: membership 1)" \
    "$dir/agent.node0.log" || fail "agent: node 0 does not go on with ranks 0,1"
  grep -q '"left": \[2, 3\], "joined": \[\], "world_size": 2' "$dir/agent.jsonl" || fail "agent: no --metrics row for ranks 2,3 leaving"
  check_loss_log "$dir/agent.loss"
  reference agent "2:$left,3:$left"
  echo "agent: node 1's ddprun killed; ranks 0,1 went on from step $left; equal to one node's run"

  # --- stop: node 1's ddprun stops; its heartbeat ends, its ranks run on (12
  # epochs: the run outlasts the timeout).
  export EPOCHS=12
  start stop --node-timeout 2
  kill -STOP "$node1"
  node_lost stop "its ddprun sent no heartbeat for 2 s (--node-timeout)"
  kill -CONT "$node1"
  wait "$node1" && fail "stop: node 1, taken out of the group, exited 0"
  check_loss_log "$dir/stop.loss"
  reference stop "2:$left,3:$left"
  unset EPOCHS
  echo "stop: node 1's ddprun stopped; taken out after its heartbeat stopped, ranks 0,1 went on from step $left; node 1 exited non-zero; equal to one node's run"
fi

# --- freeze: node 1's ddprun and ranks stop, as a machine gone without closing
# its connections. Node 0 takes them out after --node-timeout; its own hang
# detector (--hang-timeout 3) does not blame ranks 0,1, which regroup when
# their all_reduce times out (DDP_TIMEOUT_S 5). The task's 3 epochs: the frozen
# group trains no step, so nothing needs the 12 of "stop" (the quick set took 27 s
# with them, 20 s without, in an -O2 build on an AVX2 EPYC).
# Not in the quick set (CI's sanitizer phase, to keep CI under 40 minutes): the
# first phase runs it, and e2e.flight_watch_nnodes covers the hang answer.
if [ "$mode" != quick ]; then
export DDP_TIMEOUT_S=5
start freeze --node-timeout 2 --hang-timeout 3
kill -STOP "$node1" $(pgrep -P "$node1")
node_lost freeze "its ddprun sent no heartbeat for 2 s (--node-timeout)"
grep -q "^ddprun: the diagnosis names none of this node's ranks: not blaming them" "$dir/freeze.node0.log" ||
  fail "freeze: node 0's hang detector did not fire (or blamed its own ranks)"
# Whichever collective the stop caught them in: DDP's all_reduce(avg) of the
# gradients, or a small check's all_reduce(max) of i64 counts.
grep -q "all_reduce([a-z]*) #[0-9]* of [0-9]* [a-z0-9]* timed out after 5.0 s" "$dir/freeze.node0.log" ||
  fail "freeze: ranks 0,1 did not wait for their all_reduce's timeout"
kill -KILL "$node1" $(pgrep -P "$node1")
kill -CONT "$node1" 2>/dev/null
check_loss_log "$dir/freeze.loss"
unset DDP_TIMEOUT_S
reference freeze "2:$left,3:$left"
echo "freeze: node 1 frozen; taken out after its heartbeat stopped, ranks 0,1 went on from step $left at their all_reduce's timeout; equal to one node's run"
fi

# min_ranks NAME RANK MIN NODE1_SAYS: rank RANK (node 1) SIGKILLed under
# --min-ranks MIN, the world size (MIN - 1 left): both agents end with its
# status (137), node 0 naming the flag, node 1 saying NODE1_SAYS (a pattern)
# and why.
min_ranks() {
  start "$1" --min-ranks "$3"
  kill -KILL "$(rank_pid "$dir/$1" "$2")"
  wait "$node0"
  local s0=$?
  wait "$node1"
  local s1=$?
  [ "$s0" = 137 ] && [ "$s1" = 137 ] ||
    fail "$1: rank $2 died of SIGKILL (137); node 0 exited $s0, node 1 $s1"
  grep -q "rank $2 (pid [0-9]*) failed: killed by SIGKILL.*; $(($3 - 1)) ranks* would be left, fewer than --min-ranks $3" \
    "$dir/$1.node0.log" || fail "$1: node 0 does not name --min-ranks"
  grep -q "$4: rank $2 .*fewer than --min-ranks $3" "$dir/$1.node1.log" ||
    fail "$1: node 1 does not say why the group ended"
  # Note [group stop]: the ranks left wrote --save where the group stood first.
  grep -q "rank 0 (launch rank 0): the group stopped at step [0-9]*: .*; checkpoint $dir/$1.st written" \
    "$dir/$1.node0.log" || fail "$1: rank 0 did not write the group's last checkpoint"
}

if [ "$mode" != quick ]; then
  # --- min: below --min-ranks the job ends on both nodes with the rank's status.
  min_ranks min 3 4 "the group failed elsewhere"
  grep -q "^ddprun: node 0 stopped the group: rank 3 .*; this node's ranks take part in its checkpoint" \
    "$dir/min.node1.log" && grep -q "exit code 75 .*(left at the group's stop" "$dir/min.node1.log" ||
    fail "min: node 1's rank 2 did not take part in the group's stop"
  echo "min: rank 3 killed under --min-ranks 4: both nodes exited 137"

  # --- min1: one rank a node, so node 1 has no rank left: it must still learn that
  # the job failed (node 0 keeps its store up until node 1's ddprun is gone).
  NPROC=1 min_ranks min1 1 2 "this node's ranks are done (some left the group), but the group failed"
  echo "min1: rank 1, node 1's only rank, killed under --min-ranks 2: both nodes exited 137"

  # both_exited_137 NAME: both agents of the run NAME end with the stopping rank's 137.
  both_exited_137() {
    local s0 s1
    wait "$node0"
    s0=$?
    wait "$node1"
    s1=$?
    [ "$s0" = 137 ] && [ "$s1" = 137 ] || fail "$1: node 0 exited $s0, node 1 $s1 (expected 137 on both)"
  }

  # --- min_save: then rank 2 (node 1) dies in the stop's save: node 1 tells node 0,
  # which publishes the stop once more without it, and ranks 0,1 write step 8.
  DDP_TEST_KILL_AT=3:8 DDP_TEST_KILL_IN_SAVE=2:8 start min_save --min-ranks 4
  both_exited_137 min_save
  grep -q "^ddprun: rank 2 failed at the group's stop (killed by SIGKILL): node 0 stops the group without it" \
    "$dir/min_save.node1.log" || fail "min_save: node 1 did not report rank 2's death in the stop"
  grep -q "^ddprun: rank 2 failed at the group's stop (killed by SIGKILL): the ranks left (0,1) regroup once more" \
    "$dir/min_save.node0.log" || fail "min_save: node 0 did not stop the group again without rank 2"
  grep -q "rank 0 (launch rank 0): the group stopped at step 8: .*; then rank 2 failed at the group's stop .*; checkpoint $dir/min_save.st written (epoch 1, step 8 of it)" \
    "$dir/min_save.node0.log" || fail "min_save: ranks 0,1 did not write step 8"
  echo "min_save: rank 2 (node 1) killed in the stop's save; node 0 stopped the group again, ranks 0,1 wrote step 8"

  # --- min_two: both of node 1's ranks die after step 8: the second one's event,
  # read with the first's, stops the group again; and min_none: ranks 0,1 (node 0)
  # die first, then rank 3 in the save: node 0, with no rank of its own left, still
  # applies node 1's event, and rank 2 alone writes step 8. In min_two node 1 pauses
  # 500 ms between reading node 0's failure and its stop (DDPRUN_TEST_STOP_READ_GAP_MS,
  # Note [stop before failure]): node 0 publishes both in that pause, and node 1 must
  # still follow the stop and tell node 0 of the second death (it ended on the failure
  # instead, once in CI and always with the pause, when it read the stop first).
  DDP_TEST_KILL_AT=3:8,2:8 DDPRUN_TEST_STOP_READ_GAP_MS=500 start min_two --min-ranks 4
  both_exited_137 min_two
  grep -q "rank 0 (launch rank 0): the group stopped at step 8: .*; checkpoint $dir/min_two.st written (epoch 1, step 8 of it)" \
    "$dir/min_two.node0.log" || fail "min_two: ranks 0,1 did not write step 8"
  grep -q "^ddprun: node 0 stopped the group: " "$dir/min_two.node1.log" ||
    fail "min_two: node 1 did not follow node 0's stop (read in the pause)"
  DDP_TEST_KILL_AT=0:5,1:8 DDP_TEST_KILL_IN_SAVE=3:8 start min_none --min-ranks 3
  both_exited_137 min_none
  grep -q "^ddprun: rank 3 failed at the group's stop (killed by SIGKILL): the rank left (2) regroup once more" \
    "$dir/min_none.node0.log" || fail "min_none: node 0 did not stop the group again without rank 3"
  grep -q "rank 0 (launch rank 2): the group stopped at step 8: .*; checkpoint $dir/min_none.st written (epoch 1, step 8 of it)" \
    "$dir/min_none.node1.log" || fail "min_none: rank 2 did not write step 8"
  echo "min_two, min_none: two deaths at once on node 1, and a death in the stop with no rank of node 0 left: step 8 written"
fi

# --- node0: under --rdzv-backup, rank 3 dies and its replacement joins (node 0
# publishes memberships 1 and 2), then node 0's ddprun dies: node 1's backup of
# the store, which mirrored those memberships, takes over with the membership,
# and ranks 2,3 go on.
BACKUP=1 start node0 --max-restarts 1
kill -KILL "$(rank_pid "$dir/node0" 3)"
left=$(went_on_from "$dir/node0.node1.log" 1)
joined=$(went_on_from "$dir/node0.node1.log" 2)
[ -n "$left" ] && [ -n "$joined" ] || fail "node0: no regroup after rank 3 died, or no join"
kill -KILL "$node0"
wait "$node1" || fail "node0: node 1 exited $?"
lost=$(went_on_from "$dir/node0.node1.log" 3)
[ -n "$lost" ] || fail "node0: ranks 2,3 did not regroup after node 0 was lost"
grep -q "^ddprun: node 0 (ranks 0,1) was lost: its ddprun's store went away.*this node hosts the store's backup (--rdzv-backup) and keeps the group's membership from now on" \
  "$dir/node0.node1.log" || fail "node0: node 1 does not say it took over"
grep -q "^ddprun: node 0 (ranks 0,1) was lost at .*; the group went on with ranks 2,3 (--on-failure continue: membership 3)" \
  "$dir/node0.node1.log" || fail "node0: node 1 does not go on with ranks 2,3 in membership 3"
grep -q "the store at 127.0.0.1:[0-9]* is gone: its backup at 127.0.0.1:[0-9]* serves now" \
  "$dir/node0.node1.log" || fail "node0: the ranks do not say they moved to the backup"
grep -q '"left": \[0, 1\], "joined": \[\], "world_size": 2' "$dir/node0.jsonl" || fail "node0: no --metrics row for ranks 0,1 leaving"
check_loss_log "$dir/node0.loss"
reference node0 "3:$left,0:$lost,1:$lost" "$joined"
echo "node0: rank 3 left at step $left and its replacement joined at $joined; then node 0's ddprun (the store's host) was killed; node 1's backup took over, ranks 2,3 went on from step $lost; equal to one node's run"

if [ "$mode" != quick ]; then
  # --- node1: the backup's host is lost instead: node 0 goes on as without one.
  BACKUP=1 start node1
  kill -KILL "$node1"
  node_lost node1 "its ddprun closed its connection to the store"
  check_loss_log "$dir/node1.loss"
  reference node1 "2:$left,3:$left"
  echo "node1: node 1's ddprun (the backup's host) killed; ranks 0,1 went on from step $left; equal to one node's run"

  # --- stop_backup: the stop case under --rdzv-backup. Node 1, taken out while
  # stopped, must not take over when node 0 ends (its store's stream ends then):
  # it leaves non-zero, as without a backup.
  export EPOCHS=12
  BACKUP=1 start stop_backup --node-timeout 2
  kill -STOP "$node1"
  node_lost stop_backup "its ddprun sent no heartbeat for 2 s (--node-timeout)"
  kill -CONT "$node1"
  wait "$node1" && fail "stop_backup: node 1, taken out of the group, exited 0"
  grep -q "keeps the group's membership" "$dir/stop_backup.node1.log" &&
    fail "stop_backup: node 1, taken out of the group, took over when node 0 ended"
  check_loss_log "$dir/stop_backup.loss"
  reference stop_backup "2:$left,3:$left"
  unset EPOCHS
  echo "stop_backup: node 1 stopped under --rdzv-backup, taken out, went on from step $left without it; node 1 did not take over and exited non-zero"

  # --- standby: three nodes, one rank each, under --rdzv-backup. Rank 1 (node 1's
  # only rank) dies: node 1, the backup's host, has no rank left but stands by;
  # then node 0's ddprun dies: node 1 takes over, and rank 2 (node 2) goes on
  # alone, its agent's store client moved to the backup.
  # One thread a rank, as the reference's 3 ranks on one node get (one rank a node
  # would get both cores, and other sums).
  export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  port=$(free_port)
  b=$(free_port_besides "$port")
  three=(--nnodes 3 -n 1 --master-port "$port" --on-failure continue --grace-period 2
    --rdzv-timeout 30 --rdzv-backup "127.0.0.1:$b")
  flags=("${task[@]}" --save "$dir/standby.st" --loss-log "$dir/standby.loss")
  for n in 2 1 0; do
    "$ddprun" "${three[@]}" --node-rank $n "$train" "${flags[@]}" >"$dir/standby.node$n.log" 2>&1 &
    eval "standby$n=\$!"
  done
  for _ in $(seq 1000); do [ "$(rows "$dir/standby.loss")" -ge 6 ] && break; sleep 0.02; done
  kill -KILL "$(rank_pid "$dir/standby" 1)"
  left=$(went_on_from "$dir/standby.node0.log" 1)
  [ -n "$left" ] || fail "standby: ranks 0,2 did not regroup after rank 1 died"
  kill -KILL "$standby0"
  wait "$standby2" || fail "standby: node 2 exited $?"
  wait "$standby1" || fail "standby: node 1 exited $?"
  lost=$(went_on_from "$dir/standby.node2.log" 2)
  [ -n "$lost" ] || fail "standby: rank 2 did not go on after node 0 was lost"
  grep -q "^ddprun: node 0 (rank 0) was lost: .*this node hosts the store's backup (--rdzv-backup) and keeps the group's membership from now on" \
    "$dir/standby.node1.log" || fail "standby: node 1, with no rank left, did not take over"
  check_loss_log "$dir/standby.loss"
  # The reference: one node's run losing the same ranks after the same steps.
  DDP_TEST_KILL_AT="1:$left,0:$lost" "$ddprun" --standalone -n 3 --on-failure continue "$train" \
    "${task[@]}" --save "$dir/standby.ref.st" --loss-log "$dir/standby.ref.loss" \
    >"$dir/standby.ref.log" 2>&1 || fail "standby: the reference exited $?"
  cmp "$dir/standby.st" "$dir/standby.ref.st" ||
    fail "standby: the final checkpoint differs from one node's run losing ranks 1 and 0"
  cmp <(cut -d' ' -f1,2 "$dir/standby.loss") <(cut -d' ' -f1,2 "$dir/standby.ref.loss") ||
    fail "standby: the loss log's steps differ from the reference's"
  unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
  echo "standby: rank 1 (node 1's only) left at step $left, node 1 stood by; node 0's ddprun killed; node 1 took over and rank 2 went on from step $lost; equal to one node's run"
fi

# --- mismatch: every node must be given the same --rdzv-backup.
port=$(free_port)
"$ddprun" --nnodes 2 -n 1 --master-port "$port" --on-failure continue --rdzv-timeout 10 \
  --rdzv-backup 127.0.0.1:$((port + 7)) --node-rank 1 "$train" "${task[@]}" >"$dir/mismatch.node1.log" 2>&1 &
node1=$!
"$ddprun" --nnodes 2 -n 1 --master-port "$port" --on-failure continue --rdzv-timeout 10 \
  --node-rank 0 "$train" "${task[@]}" >"$dir/mismatch.node0.log" 2>&1 && fail "mismatch: node 0 exited 0"
wait "$node1" && fail "mismatch: node 1 exited 0"
grep -q "node 1 was given --rdzv-backup '127.0.0.1:$((port + 7))' but node 0 '': give every node the same --rdzv-backup" \
  "$dir/mismatch.node0.log" || fail "mismatch: node 0 does not name the two --rdzv-backup"
echo "mismatch: nodes given different --rdzv-backup refused by name"
echo "train_elastic_nnodes ($mode): ok"
