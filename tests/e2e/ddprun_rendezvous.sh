#!/usr/bin/env bash
# Rendezvous errors: the port already in use, node 0 unreachable, a node that
# never comes; each names the address and exits 1.
# usage: ddprun_rendezvous.sh DDPRUN PROBE
. "$(dirname "$0")/lib_ddprun.sh"
port=$(free_port)
python3 -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',$port)); s.listen(); time.sleep(20)" &
holder=$!
for _ in $(seq 100); do ss -ltn 2>/dev/null | grep -q ":$port " && break; sleep 0.05; done
"$DDPRUN" -n 2 --master-port "$port" "$PROBE" --marker "$MARKER" >"$WORK/in_use.log" 2>&1
status=$?
kill $holder 2>/dev/null; wait $holder 2>/dev/null
[ $status -eq 1 ] || fail "port in use: exit $status, expected 1"
grep -q "127.0.0.1:$port: Address already in use.*--master-port.*--standalone" "$WORK/in_use.log" ||
  fail "port in use: the message lacks the address or the fix"
grep -q '^\[rank' "$WORK/in_use.log" && fail "ranks started although the store could not"

export DDP_STORE_SECRET=e2e-secret
port=$(free_port)
"$DDPRUN" --nnodes 2 --node-rank 1 --master-port "$port" --rdzv-timeout 1 "$PROBE" >"$WORK/unreachable.log" 2>&1
status=$?
[ $status -eq 1 ] || fail "unreachable master: exit $status, expected 1"
grep -q "node 1 cannot reach the rendezvous store at 127.0.0.1:$port" "$WORK/unreachable.log" ||
  fail "unreachable master: no address in the message"

"$DDPRUN" --nnodes 3 --node-rank 0 --master-port "$port" --rdzv-timeout 1 "$PROBE" >"$WORK/missing.log" 2>&1
status=$?
[ $status -eq 1 ] || fail "missing nodes: exit $status, expected 1"
grep -q "nodes 1, 2 did not join the rendezvous at 127.0.0.1:$port within 1 s" "$WORK/missing.log" ||
  fail "missing nodes: the message does not name nodes 1, 2"

unset DDP_STORE_SECRET
"$DDPRUN" --nnodes 2 --node-rank 1 --master-port "$port" "$PROBE" >"$WORK/no_secret.log" 2>&1
[ $? -eq 1 ] && grep -q "needs DDP_STORE_SECRET" "$WORK/no_secret.log" || fail "node 1 without a secret"
echo "ddprun_rendezvous: ok"
