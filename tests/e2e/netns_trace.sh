#!/usr/bin/env bash
# Two nodes on one machine (lib_netns.sh), one rank each over gloo, with
# `ddprun --trace DIR` on both: each rank aligns its clock with node 0's ddprun
# through the store (TIME over the veth pair), node 1's ddprun merges nothing,
# node 0's merges both ranks' files (DIR is shared here, as on a cluster file
# system), and check_trace.py accepts the result; rank 1's file reads as if its
# clock ran 4 s ahead (DDP_TRACE_TEST_SKEW_NS), as another node's would.
#
# usage: netns_trace.sh DDPRUN TRAIN
# Exit 77 when namespaces cannot be made (see lib_netns.sh).
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/e2e/lib_netns.sh
. "$here/lib_netns.sh"
ddprun=$1 train=$2
netns_up

args=(--data synthetic --synthetic-size 1280 --batch-size 64 --epochs 1 --bucket-cap-mb 0.2
      --device cpu)
export DDP_STORE_SECRET="netns-$RANDOM$RANDOM" DDP_TIMEOUT_S=60 OMP_NUM_THREADS=1 \
  OPENBLAS_NUM_THREADS=1 DDP_TRACE_TEST_SKEW_NS=4000000000
port=$(free_port)
common=(--nnodes 2 -n 1 --master-addr "$IP0" --master-port "$port" --grace-period 2 --rdzv-timeout 30
        --trace "$WORK/trace")
timeout -k 5 100 ip netns exec "$NS1" "$ddprun" "${common[@]}" --node-rank 1 "$train" "${args[@]}" \
  >"$WORK/node1.log" 2>&1 &
node1=$!
timeout -k 5 100 ip netns exec "$NS0" "$ddprun" "${common[@]}" --node-rank 0 "$train" "${args[@]}" \
  >"$WORK/node0.log" 2>&1 &
node0=$!
wait $node0 || fail "node 0 exited $?"
wait $node1 || fail "node 1 exited $?"
grep -q "ddprun: trace: merged 2 rank(s)" "$WORK/node0.log" || fail "node 0 did not merge 2 ranks"
grep -q "ddprun: trace:" "$WORK/node1.log" && fail "node 1 merged too"
grep -q "ddprun store at $IP0:" "$WORK/trace/trace.json" || fail "not aligned to node 0's store"
python3 "$here/check_trace.py" "$WORK/trace/trace.json" --ranks 2 --steps 10 --buckets ||
  fail "the merged trace is wrong"
echo "netns_trace.sh: ok"
