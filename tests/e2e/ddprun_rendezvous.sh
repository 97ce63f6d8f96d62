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
grep -q "nodes 1,2 did not join the rendezvous at 127.0.0.1:$port within 1 s" "$WORK/missing.log" ||
  fail "missing nodes: the message does not name nodes 1, 2"

# Note [node 0's address]: a host name that resolves to loopback (Debian maps
# its own name to 127.0.1.1) is refused at once, naming the fix.
name=$(hostname)
resolved=$(getent ahosts "$name" | awk 'NR == 1 { print $1 }')
case "$resolved" in
127.* | ::1)
  "$DDPRUN" --nnodes 2 --node-rank 0 --master-addr "$name" --rdzv-port "$port" "$PROBE" \
    >"$WORK/loopback.log" 2>&1
  status=$?
  [ $status -eq 2 ] || fail "$name resolving to $resolved: exit $status, expected 2"
  grep -q "'$name' (--master-addr, or --rdzv-endpoint's HOST) resolves to $resolved.*--rdzv-bind 0.0.0.0" \
    "$WORK/loopback.log" || fail "the loopback refusal does not name $resolved and --rdzv-bind 0.0.0.0"
  ;;
*) echo "skipped the loopback-name check: $name resolves to '$resolved'" ;;
esac

# A name that never resolves: node 0 retries until --rdzv-timeout, naming it.
"$DDPRUN" --nnodes 2 --node-rank 0 --master-addr no-such-host.invalid --rdzv-port "$port" \
  --rdzv-timeout 2 "$PROBE" >"$WORK/unresolved.log" 2>&1
status=$?
[ $status -eq 1 ] || fail "an unresolvable --master-addr: exit $status, expected 1"
grep -q "cannot resolve 'no-such-host.invalid' yet .*retrying for up to 2 s" "$WORK/unresolved.log" &&
  grep -q "node 0 cannot resolve 'no-such-host.invalid' .* within 2 s" "$WORK/unresolved.log" ||
  fail "an unresolvable --master-addr was not retried until --rdzv-timeout"

# A name that appears after the start (pod 0's DNS record in Kubernetes): in a
# mount namespace of their own, both nodes see a private /etc/hosts that gets
# the name 2 s later; the job succeeds.
if unshare -m --propagation private true 2>/dev/null; then
  cp /etc/hosts "$WORK/hosts"
  unshare -m --propagation private bash -c '
    mount --bind "$1/hosts" /etc/hosts || exit 99
    (sleep 2; echo "127.0.0.1 pod0.ddprun-test" >>"$1/hosts") &
    pids=()
    for node in 0 1; do
      "$2" --nnodes 2 --node-rank $node --master-addr pod0.ddprun-test --rdzv-bind 127.0.0.1 \
        --rdzv-port "$3" --master-port "$4" --rdzv-timeout 30 "$5" >"$1/late_dns.$node.log" 2>&1 &
      pids+=($!)
    done
    wait "${pids[0]}" && wait "${pids[1]}"' _ "$WORK" "$DDPRUN" "$port" "$(free_port)" "$PROBE"
  status=$?
  [ $status -eq 0 ] || fail "a name resolvable only 2 s after the start: exit $status; $(cat "$WORK"/late_dns.*.log)"
  grep -q "cannot resolve 'pod0.ddprun-test' yet" "$WORK/late_dns.0.log" ||
    fail "node 0 did not wait for the name to resolve"
else
  echo "skipped the late-name check: unshare -m is not allowed here"
fi

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
