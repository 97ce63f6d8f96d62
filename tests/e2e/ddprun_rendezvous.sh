#!/usr/bin/env bash
# Rendezvous errors: the agents' store port already in use, node 0
# unreachable, a node that never comes (each names the address, exit 1); a
# missing or unsafe secret (exit 2). And MASTER_PORT is left to rank 0: our
# own ranks run while something else holds it (Note [two stores]).
# usage: ddprun_rendezvous.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
port=$(free_port)
python3 -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',$port)); s.listen(); time.sleep(20)" &
holder=$!
for _ in $(seq 100); do ss -ltn 2>/dev/null | grep -q ":$port " && break; sleep 0.05; done
"$DDPRUN" -n 2 --master-port "$port" --backend gloo "$PROBE" --allreduce --marker "$MARKER" \
  >"$WORK/master_port_taken.log" 2>&1 || fail "MASTER_PORT held by another process: exit $?, expected 0"
[ "$(grep -c '^\[rank [01]\] allreduce=3 ' "$WORK/master_port_taken.log")" -eq 2 ] ||
  fail "our ranks need MASTER_PORT: all_reduce failed while it was held"
export DDP_STORE_SECRET=e2e-secret
"$DDPRUN" --nnodes 2 --node-rank 0 --master-port 29500 --rdzv-port "$port" --rdzv-timeout 1 "$PROBE" \
  --marker "$MARKER" >"$WORK/in_use.log" 2>&1
status=$?
kill $holder 2>/dev/null; wait $holder 2>/dev/null
[ $status -eq 1 ] || fail "port in use: exit $status, expected 1"
grep -q "127.0.0.1:$port: Address already in use.*--rdzv-port" "$WORK/in_use.log" ||
  fail "port in use: the message lacks the address or the fix"
grep -q '^\[rank' "$WORK/in_use.log" && fail "ranks started although the store could not"

port=$(free_port)
"$DDPRUN" --nnodes 2 --node-rank 1 --rdzv-port "$port" --rdzv-timeout 1 "$PROBE" >"$WORK/unreachable.log" 2>&1
status=$?
[ $status -eq 1 ] || fail "unreachable master: exit $status, expected 1"
grep -q "node 1 cannot reach the rendezvous store at 127.0.0.1:$port" "$WORK/unreachable.log" ||
  fail "unreachable master: no address in the message"

"$DDPRUN" --nnodes 3 --node-rank 0 --rdzv-port "$port" --rdzv-timeout 1 "$PROBE" >"$WORK/missing.log" 2>&1
status=$?
[ $status -eq 1 ] || fail "missing nodes: exit $status, expected 1"
grep -q "nodes 1, 2 did not join the rendezvous at 127.0.0.1:$port within 1 s" "$WORK/missing.log" ||
  fail "missing nodes: the message does not name nodes 1, 2"

unset DDP_STORE_SECRET
# Several nodes need a shared secret: from the environment or a private file.
for node in 0 1; do
  "$DDPRUN" --nnodes 2 --node-rank $node --rdzv-port "$port" "$PROBE" >"$WORK/no_secret.log" 2>&1
  [ $? -eq 2 ] && grep -q "needs the store's secret.*DDP_STORE_SECRET.*--store-secret-file" \
    "$WORK/no_secret.log" || fail "node $node without a secret"
done
printf 'file-secret-%s\n' "$RANDOM$RANDOM" >"$WORK/secret"
chmod 644 "$WORK/secret"
"$DDPRUN" --nnodes 2 --node-rank 0 --store-secret-file "$WORK/secret" "$PROBE" >"$WORK/open_secret.log" 2>&1
[ $? -eq 2 ] && grep -q "mode 0644 lets others read.*chmod 600 $WORK/secret" "$WORK/open_secret.log" ||
  fail "a secret file readable by others was accepted"
"$DDPRUN" --nnodes 2 --node-rank 0 --store-secret-file "$WORK/none" "$PROBE" >"$WORK/no_file.log" 2>&1
[ $? -eq 2 ] && grep -q "store-secret-file $WORK/none: cannot open it" "$WORK/no_file.log" ||
  fail "a missing secret file"
echo "ddprun_rendezvous: ok"
