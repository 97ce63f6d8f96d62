#!/usr/bin/env bash
# Two nodes on one machine (two network namespaces joined by a veth pair) under
# Open MPI: mpirun runs in node 0's namespace with the host list "IP0,IP1"; its
# rsh agent is a script that enters the namespace owning the target address
# (`ip netns exec NS sh -c CMD`) where a cluster would ssh. NPROC ranks per node,
# the mpi backend (what `auto` picks under mpirun), MPI traffic over TCP on the
# veth pair. The trained parameters must equal those of `ddprun -n 2*NPROC` on
# one node (shm) with the same flags: byte-identical or within 1e-5 relative.
#
# usage: netns_mpirun.sh MPIRUN DDPRUN TRAIN NPROC  (ddprun runs the one-node reference)
# Exit 77 when namespaces cannot be made (see lib_netns.sh) or mpirun is missing.
# NETNS_NODE1_ARGS: extra train flags for the ranks on node 1 (e.g. "--lr 0.06"),
# to check that the comparison fails when the nodes disagree.
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/e2e/lib_netns.sh
. "$here/lib_netns.sh"
mpirun=$1 ddprun=$2 train=$3 nproc=$4
world=$((2 * nproc))
[ "$mpirun" != none ] || skip "this build has no MPI (apt-get install libopenmpi-dev openmpi-bin, reconfigure)"
command -v "$mpirun" >/dev/null || skip "no mpirun ('$mpirun'; apt-get install openmpi-bin)"
netns_up

args=(--data synthetic --synthetic-size 1024 --epochs 2 --max-steps 6 --batch-size 16
      --lr-schedule constant --lr 0.05 --seed 7 --device cpu --quiet)
export DDP_TIMEOUT_S=60 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

"$ddprun" --standalone -n "$world" --grace-period 2 "$train" "${args[@]}" --save "$WORK/one_node.safetensors" \
  >"$WORK/one_node.log" 2>&1 || fail "one-node run exited $?"

# The rsh agent: Open MPI calls it as `AGENT HOST COMMAND...` (as it would ssh)
# to start its daemon on HOST; it runs COMMAND in HOST's namespace instead.
agent="$WORK/netns_rsh"
cat >"$agent" <<EOF
#!/bin/sh
host=\$1; shift
case \$host in
  $IP0) ns=$NS0 ;;
  $IP1) ns=$NS1 ;;
  *) echo "netns_rsh: unknown host '\$host' (known: $IP0, $IP1)" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$agent"

# Each rank runs a wrapper that passes NETNS_NODE1_ARGS on node 1 only.
rank_cmd="$WORK/rank.sh"
cat >"$rank_cmd" <<EOF
#!/bin/sh
node=0 extra=""
if ip addr show 2>/dev/null | grep -q "inet $IP1/"; then node=1 extra="${NETNS_NODE1_ARGS:-}"; fi
echo "rank \$OMPI_COMM_WORLD_RANK runs on node \$node" >&2
exec "$train" "\$@" \$extra
EOF
chmod +x "$rank_cmd"

# shellcheck disable=SC2054  # "self,tcp" is one value
mca=(--mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1
     --mca btl self,tcp --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET")
# -x: the variables the ranks need (rsh starts the daemon with a bare command line).
# timeout: mpirun must not outlive the test (ctest's TIMEOUT would kill only this shell).
timeout -k 5 100 ip netns exec "$NS0" "$mpirun" --allow-run-as-root --oversubscribe -np "$world" \
  --host "$IP0:$nproc,$IP1:$nproc" "${mca[@]}" --tag-output \
  -x DDP_TIMEOUT_S -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x DDP_LOG_LEVEL=debug -x PATH \
  "$rank_cmd" "${args[@]}" --save "$WORK/two_nodes.safetensors" \
  --metrics "$WORK/metrics.jsonl" >"$WORK/mpirun.log" 2>&1 </dev/null ||
  fail "mpirun across two namespaces exited $?"

for r in $(seq 0 $((world - 1))); do
  grep -q "^\[1,$r\]<[a-z]*>:.*process group: backend mpi rank $r/$world on cpu" "$WORK/mpirun.log" ||
    fail "rank $r did not use the mpi backend"
done
for r in $(seq 0 $((world - 1))); do  # mpirun fills the first host's slots first
  grep -q "^\[1,$r\]<stderr>:rank $r runs on node $((r / nproc))$" "$WORK/mpirun.log" ||
    fail "rank $r did not run in node $((r / nproc))'s namespace"
done
grep -q "\"world_size\": $world" "$WORK/metrics.jsonl" || fail "metrics lack world_size $world"
expect_same_as_one_node netns_mpirun "$world" "mpirun over 2 namespaces x $nproc ranks"
