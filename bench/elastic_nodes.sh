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
# usage: bench/elastic_nodes.sh DDPRUN TRAIN [RUNS]
# environment: KILL_STEP (50), SAVE_EVERY (20), NODE_TIMEOUT (3),
#   COLLECTIVE_TIMEOUT (10)
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

# agents NAME POLICY...: both agents of one job; node 0's stamped lines go to
# NAME.log (appended), node 1's output to NAME.node1.log. Sets node0, node1.
agents() {
  local name=$1
  shift
  local port
  port=$(free_port)  # the agents' store takes port + 1, ddprun's default --rdzv-port
  local common=(--nnodes 2 -n 2 --master-port "$port" --grace-period 2
    --rdzv-timeout 30 "$@")
  local job=("$train" --backend gloo --data synthetic --synthetic-size 20000 --epochs 8 --seed 5
    --batch-size 64 --save-every "$save_every" --resume auto --log-every 1 --save "$dir/$name.st")
  "$ddprun" "${common[@]}" --node-rank 1 "${job[@]}" >>"$dir/$name.node1.log" 2>&1 &
  node1=$!
  script -qefc "$(printf '%q ' "$ddprun" "${common[@]}" --node-rank 0 "${job[@]}")" /dev/null |
    python3 "$dir/stamp.py" "$dir/$name.log" &
  node0=$!
}

# job NAME CASE: one run; NAME.death holds the time of the loss.
job() {
  local name=$1 case=$2
  local policy=(--on-failure continue --node-timeout "$node_timeout")
  [ "$case" = resubmit ] && policy=()
  agents "$name" "${policy[@]}"
  for _ in $(seq 3000); do
    grep -q "\[rank 0\] epoch 1 step $kill_step/" "$dir/$name.log" 2>/dev/null && break
    sleep 0.01
  done
  date +%s.%N >"$dir/$name.death"
  case $case in
    closed | resubmit) kill -KILL "$node1" ;;
    stopped) kill -STOP "$node1" ;;
    frozen) kill -STOP "$node1" $(pgrep -P "$node1") ;;
  esac
  local code=0
  wait "$node0" || code=$?
  { kill -KILL "$node1" $(pgrep -P "$node1"); kill -CONT "$node1"; wait "$node1"; } 2>/dev/null || true
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

cases=(closed stopped frozen resubmit)
for i in $(seq "$runs"); do
  for c in "${cases[@]}"; do
    job "${c}_$i" "$c"
    echo "elastic_nodes.sh: ${c}_$i done" >&2
  done
done

python3 - "$dir" "$runs" "$kill_step" "$node_timeout" "$DDP_TIMEOUT_S" <<'PY'
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
    steps = [(t, int(m[1]), int(m[2])) for t, text in lines
             if (m := re.match(r"\[rank 0\] epoch (\d+) step (\d+)/", text))]
    after = [(t, e, s) for t, e, s in steps if t > death]
    done_before = max(s for t, e, s in steps if t <= death and e == 1)
    # Steps done twice: epoch 1 steps logged after the loss at or below the last one before it.
    twice = sum(1 for t, e, s in after if e == 1 and s <= done_before)
    reported = next((t for t, text in lines if t > death and
                     re.search(r"was lost|failed|resubmitted", text)), float("nan"))
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
        "stopped": f"node 1's ddprun stopped (--node-timeout {node_timeout})",
        "frozen": f"node 1 frozen, agent and ranks (--node-timeout {node_timeout}, DDP_TIMEOUT_S {timeout})",
        "resubmit": "peer: --on-failure restart, both agents started again at once, --resume auto"}
print(f"Node 1 (ranks 2,3) of 2 lost after rank 0 logged step {S} of epoch 1; "
      f"medians of {runs} runs; seconds after the loss:\n")
print("| case | steps done twice | node 0 reports it | going on without node 1 | "
      f"first step past {S} completed |")
print("|---|---|---|---|---|")
for c, label in rows.items():
    m = [measure(f"{c}_{i}") for i in range(1, runs + 1)]
    med = lambda k: statistics.median(x[k] for x in m)
    print(f"| {label} | {med('twice'):.0f} | {med('reported'):.3f} | {med('again'):.3f} | "
          f"{med('next'):.3f} |")
    print(f"{c}: " + "; ".join(f"twice {x['twice']} reported {x['reported']:.3f} again "
                               f"{x['again']:.3f} next {x['next']:.3f}" for x in m), file=sys.stderr)
PY
