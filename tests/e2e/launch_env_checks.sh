#!/usr/bin/env bash
# Ranks started without ddprun (mpirun, srun, RANK set by hand): what they were
# started with is checked (collectives/bootstrap.cpp, Note [job check]):
#   stale:  RANK/WORLD_SIZE left in the environment of a process mpirun started
#           (each rank trained alone, exit 0, before)
#   dup:    two processes given RANK=1: one of them is named, the job goes on
#   world:  ranks given different WORLD_SIZE (gloo blamed the host name before)
#   debug:  DDP_DEBUG=detail on one rank only; DDP_DEBUG=bogus
#   flags:  another --lr on one rank (Note [same flags] in trainer/trainer.cpp)
#   bind:   rank 0 reaches the store as 127.0.0.2, rank 1 as 127.0.0.1 (a host
#           name the nodes resolve differently): rank 0's store listens on every
#           interface, as torch's TCPStore
# usage: launch_env_checks.sh TRAIN
set -uo pipefail
train=$1
dir=$(mktemp -d)
trap 'pkill -KILL -f -- "--loss-log $dir/" 2>/dev/null; rm -rf "$dir"' EXIT
fail() {
  echo "launch_env_checks.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -5 "$f" >&2; }; done
  exit 1
}
. "$(dirname "$0")/lib_ports.sh"
for v in RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDPRUN_RUN_ID \
  DDPRUN_STORE DDPRUN_STORE_ADDR TORCHELASTIC_RUN_ID OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
  PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS DDP_DEBUG DDP_STORE_SECRET; do
  unset "$v"
done
export DDP_BACKEND=gloo DDP_TIMEOUT_S=8 MASTER_ADDR=127.0.0.1
task=(--data synthetic --synthetic-size 256 --max-steps 2 --epochs 1 --quiet)
# rank NAME R W [VAR=VALUE...] [-- FLAGS...]: train as rank R of W in the background
# (pid in $!).
rank() {
  local name=$1 r=$2 w=$3 vars=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    vars+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift
  env RANK="$r" WORLD_SIZE="$w" "${vars[@]}" "$train" "${task[@]}" --loss-log "$dir/$name.loss" "$@" \
    >"$dir/$name.log" 2>&1 &
}

# stale
OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 RANK=0 WORLD_SIZE=1 "$train" "${task[@]}" \
  >"$dir/stale.log" 2>&1
code=$?
[ "$code" -eq 1 ] || fail "stale: exit $code, not 1"
grep -q "RANK=0 WORLD_SIZE=1 disagree with mpirun's OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2" \
  "$dir/stale.log" || fail "stale: not named"
echo "stale: a RANK/WORLD_SIZE that disagrees with mpirun's is refused"

# dup
export MASTER_PORT
MASTER_PORT=$(free_port)
rank dup0 0 2
p0=$!
rank dupa 1 2
pa=$!
rank dupb 1 2
pb=$!
wait "$p0" || fail "dup: rank 0 exited $?"
wait "$pa"
ca=$?
wait "$pb"
cb=$?
[ $((ca == 0)) -ne $((cb == 0)) ] || fail "dup: the two rank-1 processes exited $ca and $cb (one should fail)"
cat "$dir/dupa.log" "$dir/dupb.log" >"$dir/dup.log"
grep -q "rank 1: another process was started with rank 1 on the store at 127.0.0.1:$MASTER_PORT" \
  "$dir/dup.log" || fail "dup: the second rank 1 is not named"
echo "dup: the second process given rank 1 is named; ranks 0 and 1 trained"

# world
MASTER_PORT=$(free_port)
rank world0 0 2
p0=$!
rank world1 1 3
p1=$!
wait "$p1" && fail "world: rank 1 of 3 exited 0"
wait "$p0" && fail "world: rank 0 exited 0 without its rank 1"
grep -q "rank 1 was started with world size 3, DDP_DEBUG off, but rank 0 (the store at 127.0.0.1:$MASTER_PORT) with world size 2, DDP_DEBUG off" \
  "$dir/world1.log" || fail "world: the world sizes are not named"
echo "world: ranks given different WORLD_SIZE are named"

# debug
MASTER_PORT=$(free_port)
rank debug0 0 2
p0=$!
rank debug1 1 2 DDP_DEBUG=DETAIL
p1=$!
wait "$p1" && fail "debug: rank 1 exited 0"
wait "$p0"
grep -q "rank 1 was started with world size 2, DDP_DEBUG detail, but rank 0 .* with world size 2, DDP_DEBUG off" \
  "$dir/debug1.log" || fail "debug: DDP_DEBUG on one rank only is not named"
MASTER_PORT=$(free_port)
rank bogus 0 2 DDP_DEBUG=bogus
wait $! && fail "debug: DDP_DEBUG=bogus ran"
grep -q "DDP_DEBUG=bogus: expected off, info or detail" "$dir/bogus.log" || fail "debug: DDP_DEBUG=bogus not named"
echo "debug: DDP_DEBUG on one rank only, and a bad value, are named (DETAIL is detail)"

# flags (Note [same flags] in trainer/trainer.cpp): another --lr on rank 1 made its
# replica diverge, exit 0.
MASTER_PORT=$(free_port)
rank flags0 0 2
p0=$!
rank flags1 1 2 -- --lr 0.05
p1=$!
wait "$p0" && fail "flags: rank 0 exited 0 beside a rank with another --lr"
wait "$p1" && fail "flags: rank 1 exited 0 with another --lr"
grep -q "the ranks were started with different training flags: rank 1.s --lr is 0.05, rank 0.s is 0.02" \
  "$dir/flags1.log" || fail "flags: --lr not named"
echo "flags: a rank given another --lr is named"

# bind
MASTER_PORT=$(free_port)
rank bind0 0 2 MASTER_ADDR=127.0.0.2 DDP_GLOO_HOSTNAME=127.0.0.1
p0=$!
rank bind1 1 2 DDP_GLOO_HOSTNAME=127.0.0.1
p1=$!
wait "$p0" || fail "bind: rank 0 (MASTER_ADDR=127.0.0.2) exited $?"
wait "$p1" || fail "bind: rank 1 (MASTER_ADDR=127.0.0.1) exited $?"
echo "bind: rank 0's store answered rank 1 on another of its addresses"
echo "launch_env_checks.sh: ok"
