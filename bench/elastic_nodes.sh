#!/usr/bin/env bash
# A lost node under ddprun --on-failure continue (docs/elastic.md, "Across
# nodes"; docs/benchmarks.md): two agents on this machine (--nnodes 2 -n 2,
# gloo), node 1 lost right after rank 0 logged step KILL_STEP of epoch 1, in the
# three ways node 0 can learn of it, next to the peer:
#   closed    node 1's ddprun SIGKILLed (its ranks die with it): node 0 sees its
#             store connection close
#   stopped   node 1's ddprun SIGSTOPped, its ranks running on: node 0 takes
#             them out after --node-timeout NODE_TIMEOUT (default 3)
#   frozen    node 1's ddprun and ranks SIGSTOPped, as a machine gone without
#             closing its connections: --node-timeout as above, and ranks 0,1
#             wait in their collective until its timeout (DDP_TIMEOUT_S =
#             COLLECTIVE_TIMEOUT, default 10, for every run of the script)
#   node0     node 0 lost instead (its ddprun SIGKILLed, its ranks die with it)
#             under --rdzv-backup: node 1's backup of the store takes over and
#             node 1 keeps the membership (Note [node 0 lost])
#   resubmit  the peer: --on-failure restart cannot take a new agent into a
#             running group, so a lost node ends the job; the script (as a
#             scheduler would) starts both agents again at once, and they
#             resume from the last --save-every checkpoint (--resume auto)
# The job: train --backend gloo --data synthetic --synthetic-size 20000
# --epochs 8 --seed 5 --batch-size 64 (79 steps an epoch at 4 ranks; it
# outlasts --node-timeout after the loss)
# --save-every SAVE_EVERY (20) --resume auto --log-every 1. Node 0 runs under
# script(1), so each of rank 0's step lines is stamped as it arrives. Reported,
# medians of RUNS runs (default 3) of each case: the steps done twice, and the
# seconds from the loss to node 0's report of it, to the group going on without
# node 1 (continue: ranks 0,1 regrouped; the peer: the resubmitted job's first
# step) and to the first step past KILL_STEP completed after that (until node
# 0 takes node 1 out, a stopped agent's ranks train on, so steps past KILL_STEP
# may complete before it).
# Then PAIRS (default 5) back-to-back pairs of the same job without a failure
# (4 epochs), --on-failure continue with and without --rdzv-backup, the order
# alternating: ms/step (the median of rank 0's per-epoch figures) and wall.
# usage: bench/elastic_nodes.sh DDPRUN TRAIN [RUNS]
# environment: KILL_STEP (50), SAVE_EVERY (20), NODE_TIMEOUT (3),
#   COLLECTIVE_TIMEOUT (10), PAIRS (5), CASES (closed stopped frozen node0 resubmit)
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case ${1:-} in -h | --help) usage; exit 0 ;; esac
if (($# < 2 || $# > 3)); then usage >&2; exit 2; fi
ddprun=$1 train=$2 runs=${3:-3}
kill_step=${KILL_STEP:-50} save_every=${SAVE_EVERY:-20} node_timeout=${NODE_TIMEOUT:-3}
export DDP_TIMEOUT_S=${COLLECTIVE_TIMEOUT:-10}
export DDP_STORE_SECRET="bench-$RANDOM$RANDOM"
if ((kill_step < 21 || kill_step > 78)); then
  echo "elastic_nodes.sh: KILL_STEP=$kill_step: expected 21..78 (in epoch 1)" >&2
  exit 2
fi
command -v script >/dev/null || { echo "elastic_nodes.sh: needs script(1) (util-linux)" >&2; exit 2; }
dir=$(mktemp -d)
cleanup() {
  pkill -CONT -f -- "--save $dir/" 2>/dev/null || true
  pkill -KILL -f -- "--save $dir/" 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
cat >"$dir/stamp.py" <<'PY'
import sys, time
with open(sys.argv[1], "a") as f:
    for line in sys.stdin:
        f.write(f"{time.time():.6f} {line.rstrip()}\n")
        f.flush()
PY
# free_port: a port P below the kernel's ephemeral range with P + 1 free too (a port
# from bind(0) could be taken by another test's connection before ddprun listens on
# it: "cannot listen on 127.0.0.1:P: Address already in use" failed this test once).
. "$(dirname "$0")/../tests/e2e/lib_ports.sh"

# agents NAME [--epochs N] POLICY...: both agents of one job, each under
# script(1), their lines stamped into NAME.log (appended: after node 0 is lost,
# launch rank 2 is the one that logs). Sets node0, node1 (the pipelines, to wait
# for) and agent0, agent1 (the ddprun processes, to kill).
agents() {
  local name=$1 epochs=8
  shift
  if [ "${1:-}" = --epochs ]; then epochs=$2; shift 2; fi
  local port backup=()
  port=$(free_port)  # the agents' store takes port + 1, ddprun's default --rdzv-port
  if [ "${1:-}" = --rdzv-backup ]; then  # node 1 hosts the store's backup: a port of its own
    backup=(--rdzv-backup "127.0.0.1:$(free_port_besides "$port")")
    shift
  fi
  local common=(--nnodes 2 -n 2 --master-port "$port" --grace-period 2
    --rdzv-timeout 30 "${backup[@]}" "$@")
  local job=("$train" --backend gloo --data synthetic --synthetic-size 20000 --epochs "$epochs"
    --seed 5 --batch-size 64 --save-every "$save_every" --resume auto --log-every 1
    --save "$dir/$name.st")
  script -qefc "$(printf '%q ' "$ddprun" "${common[@]}" --node-rank 1 "${job[@]}")" /dev/null |
    python3 "$dir/stamp.py" "$dir/$name.log" &
  node1=$!
  script -qefc "$(printf '%q ' "$ddprun" "${common[@]}" --node-rank 0 "${job[@]}")" /dev/null |
    python3 "$dir/stamp.py" "$dir/$name.log" &
  node0=$!
  agent0="" agent1=""
  for _ in $(seq 500); do
    agent0=$(agent_pid "$name" 0) agent1=$(agent_pid "$name" 1)
    [ -n "$agent0" ] && [ -n "$agent1" ] && return
    sleep 0.01
  done
  echo "elastic_nodes.sh: $name: the agents did not start" >&2
  exit 1
}

# agent_pid NAME NODE: the pid of that node's ddprun in job NAME.
agent_pid() {
  local p
  for p in $(pgrep -f -- "--node-rank $2 .*--save $dir/$1.st"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = ddprun ] && { echo "$p"; return; }
  done
}

# job NAME CASE: one run; NAME.death holds the time of the loss.
job() {
  local name=$1 case=$2
  local policy=(--on-failure continue --node-timeout "$node_timeout")
  [ "$case" = node0 ] && policy=(--rdzv-backup "${policy[@]}")
  [ "$case" = resubmit ] && policy=()
  agents "$name" "${policy[@]}"
  for _ in $(seq 3000); do
    grep -q "\[rank 0\] epoch 1 step $kill_step/" "$dir/$name.log" 2>/dev/null && break
    sleep 0.01
  done
  date +%s.%N >"$dir/$name.death"
  case $case in
    closed | resubmit) kill -KILL "$agent1" ;;
    stopped) kill -STOP "$agent1" ;;
    frozen) kill -STOP "$agent1" $(pgrep -P "$agent1") ;;
    node0) kill -KILL "$agent0" ;;
  esac
  local code=0 survivor=$node0 lost=$agent1
  [ "$case" = node0 ] && survivor=$node1 lost=$agent0
  wait "$survivor" || code=$?
  { kill -KILL "$lost" $(pgrep -P "$lost"); kill -CONT "$lost"; } 2>/dev/null || true
  # script(1) stops itself while its child is stopped: continue it, so it reaps it.
  pkill -CONT -f -- "--save $dir/$name.st" 2>/dev/null || true
  wait "$node0" "$node1" 2>/dev/null || true
  if [ "$case" = resubmit ]; then
    ((code != 0)) || { echo "elastic_nodes.sh: $name: the job went on without node 1" >&2; exit 1; }
    echo "$(date +%s.%N) resubmitted" >>"$dir/$name.log"
    code=0
    agents "$name"
    wait "$node0" || code=$?
    wait "$node1" || code=$?
  fi
  ((code == 0)) || { echo "elastic_nodes.sh: $name exited $code:" >&2; tail -30 "$dir/$name.log" >&2; exit 1; }
}

read -ra cases <<<"${CASES:-closed stopped frozen node0 resubmit}"
for i in $(seq "$runs"); do
  for c in "${cases[@]}"; do
    job "${c}_$i" "$c"
    echo "elastic_nodes.sh: ${c}_$i done" >&2
  done
done

python3 - "$dir" "$runs" "$kill_step" "$node_timeout" "$DDP_TIMEOUT_S" "${cases[*]}" <<'PY'
import re, statistics, sys
d, runs, S, node_timeout, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

def measure(name):
  try:
    return measure_one(name)
  except StopIteration:
    sys.exit(f"elastic_nodes.sh: {name}: no step past {S} of epoch 1 logged after the loss")

def measure_one(name):
    death = float(open(f"{d}/{name}.death").read())
    lines = []
    for raw in open(f"{d}/{name}.log", errors="replace"):
        t, _, text = raw.partition(" ")
        lines.append((float(t), text.strip()))
    # Rank 0 logs the steps; after node 0 is lost, launch rank 2 (the new rank 0).
    steps = [(t, int(m[1]), int(m[2])) for t, text in lines
             if (m := re.match(r"\[rank [02]\] epoch (\d+) step (\d+)/", text))]
    after = [(t, e, s) for t, e, s in steps if t > death]
    done_before = max(s for t, e, s in steps if t <= death and e == 1)
    # Steps done twice: epoch 1 steps logged after the loss at or below the last one before it.
    twice = sum(1 for t, e, s in after if e == 1 and s <= done_before)
    # ddprun's own report (a rank's failed collective comes first, and is not it).
    reported = next((t for t, text in lines if t > death and
                     re.match(r"ddprun: .*(was lost|failed)|resubmitted", text)), float("nan"))
    # Going on without node 1: the ranks left regrouped (continue), or the
    # resubmitted job's first step.
    again = next((t for t, text in lines if t > death and
                  re.search(r"membership 1 is ranks", text)), None)
    if again is None:
        resubmitted = next((t for t, text in lines if text == "resubmitted"), None)
        if resubmitted is None:
            sys.exit(f"elastic_nodes.sh: {name}: the ranks left never regrouped (did the job "
                     "end before --node-timeout?)")
        again = next(t for t, e, s in after if t > resubmitted)
    # The first step past KILL_STEP completed once the group went on (a step
    # completed as the node went, its line unprinted, is not redone).
    nxt = next(t for t, e, s in after if t >= again and (e, s) > (1, S))
    return dict(twice=twice, reported=reported - death, again=again - death, next=nxt - death)

rows = {"closed": "node 1's ddprun killed (store connection closed)",
        "node0": "node 0's ddprun killed, --rdzv-backup: node 1's backup store takes over",
        "stopped": f"node 1's ddprun stopped (--node-timeout {node_timeout})",
        "frozen": f"node 1 frozen, agent and ranks (--node-timeout {node_timeout}, DDP_TIMEOUT_S {timeout})",
        "resubmit": "peer: --on-failure restart, both agents started again at once, --resume auto"}
cases = sys.argv[6].split()
print(f"A node of 2 lost after rank 0 logged step {S} of epoch 1 (node 1, ranks 2,3, but "
      f"in the node0 case node 0, ranks 0,1); medians of {runs} runs; seconds after the loss:\n")
print("| case | steps done twice | the survivor reports it | going on without the node | "
      f"first step past {S} completed |")
print("|---|---|---|---|---|")
for c, label in rows.items():
    if c not in cases:
        continue
    m = [measure(f"{c}_{i}") for i in range(1, runs + 1)]
    med = lambda k: statistics.median(x[k] for x in m)
    print(f"| {label} | {med('twice'):.0f} | {med('reported'):.3f} | {med('again'):.3f} | "
          f"{med('next'):.3f} |")
    print(f"{c}: " + "; ".join(f"twice {x['twice']} reported {x['reported']:.3f} again "
                               f"{x['again']:.3f} next {x['next']:.3f}" for x in m), file=sys.stderr)
PY

# No failure: PAIRS pairs, --on-failure continue with and without --rdzv-backup.
pairs=${PAIRS:-5}
((pairs > 0)) || exit 0
for i in $(seq "$pairs"); do
  order=(plain backup)
  ((i % 2 == 0)) && order=(backup plain)
  for c in "${order[@]}"; do
    flags=(--on-failure continue --node-timeout "$node_timeout")
    [ "$c" = backup ] && flags=(--rdzv-backup "${flags[@]}")
    start=$(date +%s.%N)
    agents "nofail_${c}_$i" --epochs 4 "${flags[@]}"
    code=0
    wait "$node0" || code=$?
    wait "$node1" || code=$?
    ((code == 0)) || { echo "elastic_nodes.sh: nofail_${c}_$i exited $code" >&2; exit 1; }
    echo "$start $(date +%s.%N)" >"$dir/nofail_${c}_$i.wall"
  done
  echo "elastic_nodes.sh: pair $i done" >&2
done
python3 - "$dir" "$pairs" <<'PY'
import re, statistics, sys
d, pairs = sys.argv[1], int(sys.argv[2])
def figures(name):
    ms = [float(m[1]) for line in open(f"{d}/{name}.log", errors="replace")
          if (m := re.search(r"\[rank 0\] epoch \d+/\d+: .* ([0-9.]+) ms/step", line))]
    a, b = map(float, open(f"{d}/{name}.wall").read().split())
    return statistics.median(ms), b - a
rows = {c: [figures(f"nofail_{c}_{i}") for i in range(1, pairs + 1)] for c in ("plain", "backup")}
print(f"\nNo failure: {pairs} back-to-back pairs of the 2-node job (4 epochs), the order "
      "alternating:\n")
print("| --on-failure continue | ms/step median | min - max | job wall median (s) | min - max |")
print("|---|---|---|---|---|")
for c, label in (("plain", "without --rdzv-backup"), ("backup", "with --rdzv-backup")):
    ms = [x[0] for x in rows[c]]; wall = [x[1] for x in rows[c]]
    print(f"| {label} | {statistics.median(ms):.3f} | {min(ms):.3f} - {max(ms):.3f} | "
          f"{statistics.median(wall):.2f} | {min(wall):.2f} - {max(wall):.2f} |")
ratios = [b[0] / p[0] for p, b in zip(rows["plain"], rows["backup"])]
print(f"| with / without (median of the pairs' ms/step ratios) | {statistics.median(ratios):.3f} "
      f"| {min(ratios):.3f} - {max(ratios):.3f} | | |")
PY
