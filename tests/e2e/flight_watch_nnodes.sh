#!/usr/bin/env bash
# Note [hang on several nodes] (launcher/group.cpp): two agents on one machine,
# one rank each; rank 1 (node 1) is stuck outside any collective while rank 0
# (node 0) waits in the all_reduce. Node 1's detector sees nothing (no rank of
# its waits), so node 0 publishes the hang; node 1 finds its stalled rank,
# blames it and publishes the failure; node 0 ends on that verdict instead of
# blaming its own waiting rank 0.
# usage: flight_watch_nnodes.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh" "$1" "$2"
export TMPDIR="$WORK"
export DDP_STORE_SECRET="e2e-$RANDOM$RANDOM"
port=$(free_port)
common=(--nnodes 2 -n 1 --master-addr 127.0.0.1 --master-port "$port" --hang-timeout 3
        --grace-period 1 --rdzv-timeout 20)
probe=("$PROBE" --marker "$MARKER" --allreduce --allreduce-stall 60 --on-rank 1)
"$DDPRUN" "${common[@]}" --node-rank 1 "${probe[@]}" >"$WORK/node1.log" 2>&1 &
node1=$!
"$DDPRUN" "${common[@]}" --node-rank 0 "${probe[@]}" >"$WORK/node0.log" 2>&1 &
node0=$!
wait $node0; s0=$?
wait $node1; s1=$?
if [ $s0 -ne 124 ] || [ $s1 -ne 124 ]; then
  fail "a hang: node 0 exited $s0, node 1 exited $s1, expected 124"
fi
pid1=$(rank_pid "$WORK/node1.log" 1)
grep -q "^ddprun: to blame: rank 1 (pid $pid1) made no progress for" "$WORK/node1.log" ||
  fail "node 1 does not blame its stalled rank 1"
# The stalled rank is SIGKILLed at once, and the announcement says so.
grep -q "; sent SIGKILL to rank 1 at once (it cannot act on SIGTERM)$" "$WORK/node1.log" ||
  fail "node 1 does not say it SIGKILLed rank 1 at once"
# Node 1's ranks completed every collective they issued: its diagnosis says why it
# captured (the hang), not that the job was healthy or a running job's snapshot.
grep -q "^ddprun: flight recorder: a hang, yet every rank of this node completed every \
collective it issued: rank 1 is stalled outside any collective .* while ranks on other nodes \
wait in one for them$" "$WORK/node1.log" || fail "node 1's diagnosis does not say rank 1 stalled"
grep -qE "no collective is pending|not a hang" "$WORK/node1.log" &&
  fail "node 1's diagnosis calls the hang a healthy job or a snapshot"
# A rank that never made progress was silent since it started, not for 0 s.
grep -q "made no progress for 0.0 s" "$WORK/node1.log" &&
  fail "node 1 says its stalled rank was silent for 0.0 s"
grep -q "the group failed elsewhere: rank 1 (pid $pid1) made no progress for .* on node 1" \
  "$WORK/node0.log" || fail "node 0 does not end on node 1's verdict on rank 1"
grep -qE "^ddprun: (to blame: rank 0|no verdict from the other nodes)" "$WORK/node0.log" &&
  fail "node 0 blames its own waiting rank 0"
no_process_left 2
echo "flight_watch_nnodes: ok"
