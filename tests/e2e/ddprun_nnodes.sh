#!/usr/bin/env bash
# --nnodes 2 on one machine: two agents (node 0 hosts the store, node 1 joins)
# give ranks 0..3 one world, one run id, a working all_reduce (gloo); a failure
# on node 1 stops node 0 too. The agents' store is on --master-port + 1
# (MASTER_PORT is rank 0's); the secret comes from the environment or a 0600
# file and is never printed by ddprun.
# usage: ddprun_nnodes.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
export DDP_STORE_SECRET="e2e-$RANDOM$RANDOM"
port=$(free_port)
common=(--nnodes 2 -n 2 --master-port "$port" --grace-period 2 --rdzv-timeout 20)
"$DDPRUN" "${common[@]}" --node-rank 1 "$PROBE" --allreduce --marker "$MARKER" >"$WORK/node1.log" 2>&1 &
node1=$!
"$DDPRUN" "${common[@]}" --node-rank 0 "$PROBE" --allreduce --marker "$MARKER" >"$WORK/node0.log" 2>&1 &
node0=$!
wait $node0 || fail "node 0 exited $?"
wait $node1 || fail "node 1 exited $?"
run_id=$(sed -n 's/^\[rank 0\] DDPRUN_RUN_ID=//p' "$WORK/node0.log")
[ -n "$run_id" ] || fail "no run id"
for r in 0 1 2 3; do
  node=$((r / 2)) log="$WORK/node$((r / 2)).log"
  for kv in "RANK=$r" "LOCAL_RANK=$((r % 2))" "WORLD_SIZE=4" "LOCAL_WORLD_SIZE=2" "GROUP_RANK=$node" \
            "MASTER_PORT=$port" "DDPRUN_RUN_ID=$run_id" "DDP_STORE_SECRET=$DDP_STORE_SECRET" \
            "DDPRUN_STORE_ADDR=127.0.0.1:$((port + 1))" "TORCHELASTIC_RUN_ID=$run_id" \
            "GROUP_WORLD_SIZE=2" "ROLE_RANK=$r" "ROLE_WORLD_SIZE=4" "TORCHELASTIC_USE_AGENT_STORE=False"; do
    grep -qxF "[rank $r] $kv" "$log" || fail "rank $r (node $node) lacks $kv"
  done
  grep -qE "^\[rank $r\] allreduce=10 backend=" "$log" || fail "rank $r: all_reduce across nodes failed"
done

grep -q "^ddprun:.*$DDP_STORE_SECRET" "$WORK"/node*.log && fail "ddprun printed the secret"

# Rank 3 (node 1) fails: both agents stop, and both report its exit code. The
# secret from a file, on --rdzv-port.
secret=$DDP_STORE_SECRET
unset DDP_STORE_SECRET
printf '%s\n' "$secret" >"$WORK/secret"
chmod 600 "$WORK/secret"
# fail_on NPROC RANK NAME [FLAGS]: two agents of NPROC ranks each, secret from the
# file, RANK exits 9 (the others sleep); logs NAME0.log and NAME1.log, statuses $s0
# $s1. FLAGS: ddprun's --max-restarts K, then the probe's flags (the sleep shortened).
fail_on() {
  local restarts=()
  [ "${4:-}" = --max-restarts ] && restarts=(--max-restarts "$5")
  local common=(--nnodes 2 -n "$1" --rdzv-port "$(free_port)" --grace-period 2 --rdzv-timeout 20
                --store-secret-file "$WORK/secret" "${restarts[@]}")
  local sleep=60
  [ ${#restarts[@]} -gt 0 ] && sleep=2
  local probe=("$PROBE" --exit-code 9 --on-rank "$2" --sleep "$sleep" --marker "$MARKER" "${@:6}")
  "$DDPRUN" "${common[@]}" --node-rank 1 "${probe[@]}" >"$WORK/${3}1.log" 2>&1 &
  local node1=$!
  "$DDPRUN" "${common[@]}" --node-rank 0 "${probe[@]}" >"$WORK/${3}0.log" 2>&1 &
  local node0=$!
  wait $node0; s0=$?
  wait $node1; s1=$?
}
fail_on 2 3 fail
[ $s0 -eq 9 ] && [ $s1 -eq 9 ] || fail "rank 3 exited 9; node 0 exited $s0, node 1 exited $s1"
grep -q "the group failed elsewhere: rank 3 .*exit code 9.* on node 1" "$WORK/fail0.log" ||
  fail "node 0 does not say that rank 3 on node 1 failed"
grep -qx "\[rank 3\] DDP_STORE_SECRET=$secret" "$WORK/fail1.log" || fail "the ranks lack the file's secret"
# Rank 0 (node 0, its only rank) fails: node 0 keeps its store until node 1 has
# read the failure (Note [exit barrier]), so node 1 exits 9 too, not 1 for a
# store lost under it.
fail_on 1 0 fail0
[ $s0 -eq 9 ] && [ $s1 -eq 9 ] ||
  fail "rank 0 exited 9; node 0 exited $s0, node 1 exited $s1: $(grep '^ddprun' "$WORK/fail01.log")"
grep -q "^ddprun:.*$secret" "$WORK"/fail*.log && fail "ddprun printed the secret"

# Rank 0 fails in the first attempt only, under --max-restarts 1: node 1's summary
# of that attempt names the failure, not a store lost under it (Note [exit barrier]:
# node 0 restarted at once and took its store down), and both agents end with 0.
fail_on 1 0 restart --max-restarts 1 --fail-until-restart 1
[ $s0 -eq 0 ] && [ $s1 -eq 0 ] ||
  fail "restart: node 0 exited $s0, node 1 exited $s1: $(grep '^ddprun' "$WORK"/restart*.log)"
grep -q "summary of restart 0 on node 1: .*the group failed elsewhere: rank 0 .*exit code 9" \
  "$WORK/restart1.log" ||
  fail "restart: node 1's summary does not name rank 0's failure: $(grep '^ddprun' "$WORK/restart1.log")"
grep -q "lost the rendezvous store" "$WORK/restart1.log" &&
  fail "restart: node 1 found the store lost before a restart"

# --on-failure continue, one rank a node, both ranks fail at once: every member is
# gone, so the job failed, on both nodes (Note [the last events] in
# launcher/group.cpp: node 0 applies node 1's departure posted after its last check
# of the other nodes, which DDPRUN_TEST_NODE_CHECK_MS puts 20 s later).
common=(--nnodes 2 -n 1 --rdzv-port "$(free_port)" --grace-period 2 --rdzv-timeout 20
        --store-secret-file "$WORK/secret" --on-failure continue)
# 3 s: node 0's first check of the other nodes comes before rank 1 exits, even when
# node 0's ddprun starts late on a loaded machine (applied then, the departure would
# leave the group to rank 0, whose failure would end the job instead).
probe=("$PROBE" --exit-code 3 --sleep 3 --marker "$MARKER")
"$DDPRUN" "${common[@]}" --node-rank 1 "${probe[@]}" >"$WORK/last1.log" 2>&1 &
node1=$!
DDPRUN_TEST_NODE_CHECK_MS=20000 "$DDPRUN" "${common[@]}" --node-rank 0 "${probe[@]}" \
  >"$WORK/last0.log" 2>&1 &
node0=$!
wait $node0; s0=$?
wait $node1; s1=$?
[ $s0 -eq 3 ] && [ $s1 -eq 3 ] ||
  fail "last: both ranks exited 3 and the group was left with none; node 0 exited $s0, node 1 \
exited $s1: $(grep '^ddprun' "$WORK"/last*.log)"
grep -q "0 ranks would be left, fewer than --min-ranks 1" "$WORK/last0.log" ||
  fail "last: node 0 does not say that no rank was left"
grep -q "but the group failed: .*rank 1" "$WORK/last1.log" ||
  fail "last: node 1 does not name the group's failure"

# Node 1's ddprun SIGKILLed while its ranks run (they die with it, and nobody says
# so): node 0 sees its connection to the store close and ends the job within a
# second, naming node 1 (Note [a node gone] in launcher/rendezvous.cpp), instead of
# waiting for node 1's ranks for ever once its own are done.
# node1_signalled NAME SIG LIMIT [FLAGS]: two agents (FLAGS to both), SIG to node
# 1's ddprun once both ranks run; node 0 must exit 1 within LIMIT s (a timeout
# kills it after 20 s: 137). Node 1's agent is killed afterwards.
node1_signalled() {
  local name=$1 sig=$2 limit=$3
  shift 3
  local common=(--nnodes 2 -n 1 --rdzv-port "$(free_port)" --grace-period 2 --rdzv-timeout 20
                --store-secret-file "$WORK/secret" "$@")
  "$DDPRUN" "${common[@]}" --node-rank 1 "$PROBE" --sleep 3 --marker "$MARKER" \
    >"$WORK/${name}1.log" 2>&1 &
  local node1=$!
  timeout -s KILL 20 "$DDPRUN" "${common[@]}" --node-rank 0 "$PROBE" --sleep 3 --marker "$MARKER" \
    >"$WORK/${name}0.log" 2>&1 &
  local node0=$!
  wait_for_lines "$WORK/${name}1.log" "^\[rank 1\] RANK=1$" 1
  wait_for_lines "$WORK/${name}0.log" "^\[rank 0\] RANK=0$" 1
  kill "-$sig" $node1
  local start s0
  start=$(now)
  wait $node0; s0=$?
  kill -KILL $node1 2>/dev/null
  wait $node1 2>/dev/null
  [ $s0 -eq 1 ] && at_most "$(elapsed_since "$start")" "$limit" ||
    fail "$name: SIG$sig to node 1's ddprun; node 0 exited $s0 after $(elapsed_since "$start") s \
(137: it waited for node 1 until killed 20 s later)"
}
node1_signalled gone KILL 5
grep -q "node 1's ddprun left before its ranks finished" "$WORK/gone0.log" ||
  fail "gone: node 0 does not say that node 1's ddprun left"
# The same for node 1's ddprun stopped (SIGSTOP: a frozen machine keeps its
# connections open): node 0 ends the job after --node-timeout without a heartbeat.
node1_signalled frozen STOP 6 --node-timeout 2
grep -q "node 1's ddprun sent no heartbeat for 2 s (--node-timeout)" "$WORK/frozen0.log" ||
  fail "frozen: node 0 does not say that node 1's ddprun sent no heartbeat"

# Ctrl-C (SIGINT) to one node's ddprun under --max-restarts 1: it never restarts,
# so the other ends too, at once, naming it, without a restart (Note [a node
# interrupted] in launcher/rendezvous.h); both exit 130. Before: node 1 signalled,
# node 0 waited for it for ever once its own ranks were done; node 0 signalled,
# node 1 found the store lost, restarted and waited --rdzv-timeout for node 0.
for who in 1 0; do
  common=(--nnodes 2 -n 1 --rdzv-port "$(free_port)" --grace-period 2 --rdzv-timeout 20
          --store-secret-file "$WORK/secret" --max-restarts 1)
  # --foreground: SIGINT to timeout reaches ddprun once (without it, timeout also
  # sends it to its process group: a second signal, SIGKILL to the ranks at once).
  timeout --foreground -s KILL 30 "$DDPRUN" "${common[@]}" --node-rank 1 "$PROBE" --sleep 3 \
    --marker "$MARKER" >"$WORK/int${who}_1.log" 2>&1 &
  node1=$!
  timeout --foreground -s KILL 30 "$DDPRUN" "${common[@]}" --node-rank 0 "$PROBE" --sleep 3 \
    --marker "$MARKER" >"$WORK/int${who}_0.log" 2>&1 &
  node0=$!
  wait_for_lines "$WORK/int${who}_1.log" "^\[rank 1\] RANK=1$" 1
  wait_for_lines "$WORK/int${who}_0.log" "^\[rank 0\] RANK=0$" 1
  if [ "$who" = 1 ]; then kill -INT $node1; else kill -INT $node0; fi
  start=$(now)
  wait $node0; s0=$?
  wait $node1; s1=$?
  other=$((1 - who))
  [ $s0 -eq 130 ] && [ $s1 -eq 130 ] && at_most "$(elapsed_since "$start")" 6 ||
    fail "interrupt: SIGINT to node $who's ddprun; node 0 exited $s0, node 1 exited $s1, the last \
after $(elapsed_since "$start") s: $(grep -h '^ddprun' "$WORK"/int"$who"_*.log)"
  grep -q "node $who's ddprun got SIGINT" "$WORK/int${who}_${other}.log" ||
    fail "interrupt: node $other does not say that node $who's ddprun got SIGINT"
  grep -q "got SIGINT again" "$WORK/int${who}_${who}.log" &&
    fail "interrupt: node $who's ddprun got SIGINT twice (one was sent)"
  grep -q "restarting the group" "$WORK/int${who}_${other}.log" &&
    fail "interrupt: node $other restarted after node $who's ddprun was interrupted"
done

# A second ddprun given a --node-rank already taken is refused by name (it joined
# and started ranks numbered as the first's, one of them killed later).
export DDP_STORE_SECRET=$secret
port=$(free_port)
common=(--nnodes 2 -n 1 --master-port "$port" --grace-period 2 --rdzv-timeout 20)
"$DDPRUN" "${common[@]}" --node-rank 1 "$PROBE" --sleep 4 --marker "$MARKER" >"$WORK/dup1.log" 2>&1 &
node1=$!
"$DDPRUN" "${common[@]}" --node-rank 0 "$PROBE" --sleep 4 --marker "$MARKER" >"$WORK/dup0.log" 2>&1 &
node0=$!
for _ in $(seq 100); do
  grep -q "^\[rank 1\] RANK=1" "$WORK/dup1.log" && break
  sleep 0.1
done
"$DDPRUN" "${common[@]}" --node-rank 1 "$PROBE" --sleep 4 --marker "$MARKER" >"$WORK/dup2.log" 2>&1
s2=$?
wait $node0 || fail "duplicate: node 0 exited $?"
wait $node1 || fail "duplicate: the first node 1 exited $?"
if [ $s2 -eq 0 ] || ! grep -q -- "--node-rank 1 is taken: the ddprun on .* (pid $node1) joined this job with it first" \
  "$WORK/dup2.log"; then
  fail "a second --node-rank 1 exited $s2: $(cat "$WORK/dup2.log")"
fi
no_process_left 1
echo "ddprun_nnodes: ok"
