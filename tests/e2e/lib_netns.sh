# shellcheck shell=bash
# Helpers sourced by the netns_*.sh e2e tests: two "hosts" on one machine.
#
# netns_up makes two network namespaces joined by a veth pair:
#   $NS0 with $IP0 (10.77.0.1/24) and $NS1 with $IP1 (10.77.0.2/24), loopback up.
# The names carry this shell's pid and a random number, so parallel runs never
# share them (the addresses may repeat: each pair is its own network). The EXIT
# trap kills every process left in either namespace and deletes both (the veth
# pair goes with them), also after a failure or a signal; namespaces left by a
# run that was SIGKILLed (a ctest timeout) are removed by the next run.
#
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason where namespaces cannot be
# made: not root, no `ip` (apt-get install iproute2), no CAP_NET_ADMIN.
set -uo pipefail
WORK=$(mktemp -d)
NS0="ddp-n0-$$-$RANDOM" NS1="ddp-n1-$$-$RANDOM"
VETH0=ddpveth0 VETH1=ddpveth1  # created inside the namespaces, so they never clash
# shellcheck disable=SC2034  # SUBNET: for the scripts that source this file
IP0=10.77.0.1 IP1=10.77.0.2 SUBNET=10.77.0.0/24

skip() {
  echo "SKIP: $*"
  exit 77
}

fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f (last 30 lines)" >&2; tail -30 "$f" >&2; }; done
  exit 1
}

# netns_delete NS...: SIGKILLs every process in each namespace, then deletes it.
netns_delete() {
  local ns pids
  for ns in "$@"; do
    [ -e "/run/netns/$ns" ] || continue
    pids=$(ip netns pids "$ns" 2>/dev/null)
    # shellcheck disable=SC2086  # one pid per word
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns delete "$ns" 2>/dev/null
  done
}
netns_cleanup() {
  netns_delete "$NS0" "$NS1"
  rm -rf "$WORK"
}
# Namespaces of earlier runs whose shell is gone (ddp-n<i>-<pid>-<random>).
netns_delete_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | sed -n 's/^\(ddp-n[01]-[0-9]*-[0-9]*\).*/\1/p'); do
    pid=${ns#ddp-n?-}
    pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null || netns_delete "$ns"
  done
}
trap netns_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

netns_up() {
  [ "$(id -u)" -eq 0 ] || skip "network namespaces need root (uid $(id -u))"
  command -v ip >/dev/null || skip "no 'ip' command (apt-get install iproute2)"
  netns_delete_stale
  ip netns add "$NS0" 2>"$WORK/netns.err" ||
    skip "cannot create a network namespace (CAP_NET_ADMIN?): $(cat "$WORK/netns.err")"
  ip netns add "$NS1" || fail "cannot create a second network namespace"
  ip link add "$VETH0" netns "$NS0" type veth peer name "$VETH1" netns "$NS1" 2>"$WORK/netns.err" ||
    skip "cannot create a veth pair: $(cat "$WORK/netns.err")"
  if ! { ip -n "$NS0" addr add "$IP0/24" dev "$VETH0" && ip -n "$NS1" addr add "$IP1/24" dev "$VETH1" &&
    ip -n "$NS0" link set "$VETH0" up && ip -n "$NS1" link set "$VETH1" up &&
    ip -n "$NS0" link set lo up && ip -n "$NS1" link set lo up; }; then
    fail "cannot configure the veth pair"
  fi
  # The link is up once a TCP connect reaches the peer (refused is fine: nothing listens).
  local _
  for _ in $(seq 50); do
    ip netns exec "$NS0" python3 - "$IP1" <<'EOF' && return 0
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=0.2).close()
except ConnectionRefusedError:
    pass
EOF
    sleep 0.1
  done
  fail "$NS0 cannot reach $IP1 over the veth pair"
}

# A free TCP port (addresses are per namespace, so any local free port is free there).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# no_process_left: nothing runs in either namespace any more.
no_process_left() {
  local ns
  for ns in "$NS0" "$NS1"; do
    [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] || fail "processes left in $ns: $(ip netns pids "$ns")"
  done
}

# expect_same_as_one_node NAME WORLD WHAT: the two-namespace checkpoint equals the
# one-node run's of WORLD ranks ($WORK/{two_nodes,one_node}.safetensors, relative
# 1e-5); then no process is left and "NAME: ok (...)" is printed. WHAT names the
# two-node run in the failure message.
expect_same_as_one_node() {
  local name=$1 world=$2 what=$3 status
  python3 "$(dirname "${BASH_SOURCE[0]}")/compare_checkpoints.py" "$WORK/one_node.safetensors" \
    "$WORK/two_nodes.safetensors" --rtol 1e-5 >"$WORK/compare.log" 2>&1
  status=$?
  cat "$WORK/compare.log"
  [ $status -eq 0 ] || fail "$what differs from $world ranks on one node (shm)"
  no_process_left
  echo "$name: ok ($world ranks on 2 namespaces match one node: $(tail -1 "$WORK/compare.log" | sed 's/^compare_checkpoints: //'))"
}
