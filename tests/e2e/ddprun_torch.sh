#!/usr/bin/env bash
# An unmodified PyTorch DDP program (torch_ddp_script.py: init_process_group
# "gloo" from env://, all_reduce, a 3-step DDP model) under ddprun: -n 2,
# --standalone, --nnodes 2 on loopback, and --max-restarts 1 with a failure in
# attempt 0. Rank 0 hosts torch's store on MASTER_PORT; ddprun's own store is
# elsewhere (Note [two stores]). Skipped (77) where $PYTHON cannot import torch.
# usage: ddprun_torch.sh DDPRUN
set -uo pipefail
DDPRUN=$1
. "$(dirname "${BASH_SOURCE[0]}")/lib_torch.sh"
. "$(dirname "$0")/lib_ddprun.sh" "$DDPRUN" none
script="$(dirname "$0")/torch_ddp_script.py"
# every rank printed its line: ok_ranks LOG WORLD RESTART
ok_ranks() {
  local n
  n=$(grep -cE "^\[rank [0-9]+\] ok rank=[0-9]+ world=$2 allreduce=$(($2 * ($2 + 1) / 2)) restart=$3$" "$1")
  [ "$n" -eq "$2" ]
}

port=$(free_port)
"$DDPRUN" -n 2 --master-port "$port" "$python" "$script" "$MARKER" >"$WORK/n2.log" 2>&1 ||
  fail "-n 2: exit $?"
ok_ranks "$WORK/n2.log" 2 0 || fail "-n 2: not every rank succeeded"

"$DDPRUN" --standalone -n 2 "$python" "$script" "$MARKER" >"$WORK/standalone.log" 2>&1 ||
  fail "--standalone: exit $?"
ok_ranks "$WORK/standalone.log" 2 0 || fail "--standalone: not every rank succeeded"

export DDP_STORE_SECRET="e2e-$RANDOM$RANDOM"
port=$(free_port)
common=(--nnodes 2 -n 1 --master-port "$port" --grace-period 2 --rdzv-timeout 30)
"$DDPRUN" "${common[@]}" --node-rank 1 "$python" "$script" "$MARKER" >"$WORK/node1.log" 2>&1 &
node1=$!
"$DDPRUN" "${common[@]}" --node-rank 0 "$python" "$script" "$MARKER" >"$WORK/node0.log" 2>&1 ||
  fail "--nnodes 2: node 0 exited $?"
wait $node1 || fail "--nnodes 2: node 1 exited $?"
cat "$WORK/node0.log" "$WORK/node1.log" >"$WORK/nnodes.log"
ok_ranks "$WORK/nnodes.log" 2 0 || fail "--nnodes 2: not every rank succeeded"
unset DDP_STORE_SECRET

# Rank 1 fails in attempt 0; attempt 1 (TORCHELASTIC_RESTART_COUNT=1) succeeds,
# rank 0 binding MASTER_PORT again.
port=$(free_port)
"$DDPRUN" -n 2 --master-port "$port" --max-restarts 1 --grace-period 2 "$python" "$script" \
  --fail-first-attempt "$MARKER" >"$WORK/restart.log" 2>&1 || fail "--max-restarts 1: exit $?"
grep -q '^\[rank 1\] rank 1: failing on purpose in attempt 0$' "$WORK/restart.log" ||
  fail "--max-restarts 1: rank 1 did not fail in attempt 0"
grep -q '^ddprun: restarting the group: restart 1 of 1$' "$WORK/restart.log" || fail "no restart"
ok_ranks "$WORK/restart.log" 2 1 || fail "--max-restarts 1: attempt 1 did not succeed on every rank"
no_process_left 2

# MASTER_PORT held by another job (a listener here): refused before any rank
# starts (exit 2), not a group whose ranks meet the other job's store.
port=$(free_port)
"$python" -c "import socket, time
s = socket.socket(); s.bind(('127.0.0.1', $port)); s.listen(1); time.sleep(30)" &
holder=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
"$DDPRUN" -n 2 --master-port "$port" "$python" "$script" "$MARKER" >"$WORK/busy.log" 2>&1
status=$?
kill "$holder" 2>/dev/null
[ $status -eq 2 ] || fail "a busy MASTER_PORT: exit $status, expected 2: $(cat "$WORK/busy.log")"
grep -q "MASTER_PORT $port is in use on this machine" "$WORK/busy.log" ||
  fail "a busy MASTER_PORT is not named: $(cat "$WORK/busy.log")"
grep -q "\] ok rank" "$WORK/busy.log" && fail "a rank ran with a busy MASTER_PORT"
echo "ddprun_torch: ok"
