#!/usr/bin/env bash
# A dead rank under ddprun --on-failure continue next to --on-failure restart
# (docs/benchmarks.md, "Elastic training"), one run after another in this script.
# The job: `ddprun --standalone -n 4 train` on the mlp, --backend shm --data
# synthetic --synthetic-size 20000 --epochs 2 --seed 5 --batch-size 64 (79 steps
# an epoch at 4 ranks), --save, --save-every SAVE_EVERY, --resume auto,
# --loss-log, --metrics, under
#   continue  ddprun --on-failure continue
#   restart   ddprun --max-restarts 1 (--on-failure restart, the default): the
#             group restarts and resumes from the last --save-every checkpoint
# 1. A failure (KILL_RUNS pairs): DDP_TEST_KILL_AT=2:KILL_STEP, launch rank 2
#    SIGKILLs itself right after step KILL_STEP of epoch 1 (default 50; the last
#    checkpoint before it is at step 40, so restart loses SAVE_EVERY / 2 steps,
#    its average). These runs add --log-every 1 and run under script(1), so that
#    each line (rank 0's after every step, ddprun's, the survivors') is stamped
#    with the time it arrives; rank 0's line of step KILL_STEP is the death (the
#    victim dies right after that step, past the same collectives). Reported:
#    the steps done twice (continue: KILL_STEP - the step the survivors went on
#    from; restart: KILL_STEP - R of "resumed from ... at step R"), the time from
#    the death to ddprun's report of it, to the group going again (continue: the
#    last survivor's "going on from" line; restart: "resumed from"), to the first
#    step completed after it and to step KILL_STEP + 1 (the first step not done
#    before), a step's time before the death, and the job's wall time next to
#    the same job without the kill (also --log-every 1, under script(1)).
# 2. No failure (RUNS pairs, default 15, the order alternating; output to a file,
#    no --log-every): ms/step (the --metrics rows' step_ms weighted by their
#    steps: training time over steps, evaluation excluded) and the job's wall
#    time; medians, and continue / restart as the ratio of the medians and the
#    median of the back-to-back pairs' ratios (which drift in the load cancels).
# A shared machine: each job notes the CPU time other processes took while it
# ran; a round (a pair, or a kill group) where that passed MAX_OTHER of the CPUs
# runs once more (RUNS such reruns in all), each round after up to 5 s of
# waiting for an idle second. Prints markdown tables and the others' share; the
# raw figures of every run go to stderr. About 1.5 minutes on a quiet 2-core
# machine, up to about 5 on a busy one.
# usage: bench/elastic.sh DDPRUN TRAIN [RUNS]
# environment: KILL_RUNS (default 3), KILL_STEP (50), SAVE_EVERY (20),
#   MAX_OTHER (0.05), EXTRA (train flags added to every job of both policies,
#   e.g. "--zero 1 --zero-replicas 2")
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
case ${1:-} in -h | --help) usage; exit 0 ;; esac
if (($# < 2 || $# > 3)); then usage >&2; exit 2; fi
ddprun=$1 train=$2 runs=${3:-15}
kill_runs=${KILL_RUNS:-3} kill_step=${KILL_STEP:-50} save_every=${SAVE_EVERY:-20}
if ((kill_step < 21 || kill_step > 78)); then
  echo "elastic.sh: KILL_STEP=$kill_step: expected 21..78 (in epoch 1, past 20 timed steps)" >&2
  exit 2
fi
command -v script >/dev/null || { echo "elastic.sh: needs script(1) (util-linux)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export DDP_FLIGHT_DIR=$dir/flight  # the restarts' flight recorder dumps go with it

common=(--backend shm --data synthetic --synthetic-size 20000 --epochs 2 --seed 5 --batch-size 64
        --save-every "$save_every" --resume auto)
read -ra extra <<<"${EXTRA:-}"
common+=("${extra[@]}")

# Kill runs and their references run under a pseudo-terminal (script(1)), so
# that ddprun passes each line on as it comes, with --log-every 1 (rank 0 prints
# a line after every step); stamp.py writes each line prefixed by the time it
# arrived. (The --loss-log cannot time the steps under restart: only continue
# flushes it every row; restart flushes it before each checkpoint.)
cat >"$dir/stamp.py" <<'PY'
import sys, time
with open(sys.argv[1], "w") as f:
    for line in sys.stdin:
        f.write(f"{time.time():.6f} {line.rstrip()}\n")
        f.flush()
PY

# Other processes' CPU time during a job: the CPUs' busy time (/proc/stat) less
# this script's reaped children's (`times`: ddprun, the ranks, script, stamp.py).
ncpu=$(getconf _NPROCESSORS_ONLN) hz=$(getconf CLK_TCK) max_other=${MAX_OTHER:-0.05}
busy_jiffies() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
children_cpu() {  # this shell's reaped children's user + system seconds
  times >"$dir/times"
  awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); s += 60 * t[1] + t[2] }
                 print s }' "$dir/times"
}
wait_quiet() {
  local a b
  for _ in $(seq 5); do
    a=$(busy_jiffies); sleep 1; b=$(busy_jiffies)
    if (((b - a) * 100 <= hz * ncpu * 5)); then return 0; fi
  done
  return 0
}

# job NAME continue|restart clean|kill|logged: one ddprun job, writing NAME.log,
# NAME.m (metrics), NAME.wall ("START SECONDS OTHERS_SHARE"). clean: output to a
# file; kill: DDP_TEST_KILL_AT, stamped lines; logged: stamped lines, no kill.
# Returns 1 when the others' share passed MAX_OTHER.
job() {
  local out=$dir/$1 mode=$2 kind=$3
  rm -f "$out".*  # a checkpoint left there would be resumed
  local policy=(--max-restarts 1)
  [ "$mode" = continue ] && policy=(--on-failure continue)
  local cmd=("$ddprun" --standalone -n 4 "${policy[@]}" "$train" "${common[@]}" --save "$out.st"
             --loss-log "$out.loss" --metrics "$out.m")
  local start end code=0 busy0 busy1 own0 own1
  children_cpu >"$dir/own"; own0=$(<"$dir/own")
  busy0=$(busy_jiffies)
  start=$(date +%s.%N)
  if [ "$kind" = clean ]; then
    "${cmd[@]}" >"$out.log" 2>&1 || code=$?
  else
    local kill=""
    [ "$kind" = kill ] && kill=2:$kill_step
    DDP_TEST_KILL_AT=$kill script -qefc "$(printf '%q ' "${cmd[@]}" --log-every 1)" /dev/null |
      python3 "$dir/stamp.py" "$out.log" || code=$?
  fi
  end=$(date +%s.%N)
  busy1=$(busy_jiffies)
  children_cpu >"$dir/own"; own1=$(<"$dir/own")
  ((code == 0)) || { echo "elastic.sh: $1 exited $code:" >&2; tail -30 "$out.log" >&2; exit 1; }
  awk -v s="$start" -v e="$end" -v b="$((busy1 - busy0))" -v hz="$hz" -v n="$ncpu" -v o0="$own0" \
    -v o1="$own1" 'BEGIN { others = b / hz - (o1 - o0); if (others < 0) others = 0
                           printf "%.6f %.6f %.4f\n", s, e - s, others / (n * (e - s)) }' >"$out.wall"
  awk -v m="$max_other" '{ exit !($3 <= m) }' "$out.wall"
}

# round KIND I: the jobs of pair (clean) or kill group (kill) I, both modes, the
# order alternating; run once more when a job was disturbed, while reruns are
# left.
redos=0
round() {
  local kind=$1 i=$2 mode ok try
  local order=(continue restart)
  ((i % 2)) && order=(restart continue)
  for try in 1 2; do
    wait_quiet
    ok=1
    for mode in "${order[@]}"; do
      if [ "$kind" = clean ]; then
        job "clean_${mode}_$i" "$mode" clean || ok=0
      else
        job "kill_${mode}_$i" "$mode" kill || ok=0
        job "logged_${mode}_$i" "$mode" logged || ok=0
      fi
    done
    if ((ok || try == 2 || redos >= runs)); then return 0; fi
    redos=$((redos + 1))
    echo "elastic.sh: $kind round $i again: other processes took more than $max_other of the CPUs" >&2
  done
}

for ((i = 0; i < runs || i < kill_runs; i++)); do
  if ((i < runs)); then round clean "$i"; fi
  if ((i < kill_runs)); then round kill "$i"; fi
done
echo "$redos" >"$dir/redos"

python3 - "$dir" "$runs" "$kill_runs" "$kill_step" "$save_every" <<'PY'
import json, re, statistics, sys
d, runs, kill_runs, S, K = sys.argv[1], *map(int, sys.argv[2:])
med = statistics.median
policies = {"continue": "continue", "restart": "restart, --max-restarts 1"}

def wall(name):
    return float(open(f"{d}/{name}.wall").read().split()[1])

def other(name):
    return 100 * float(open(f"{d}/{name}.wall").read().split()[2])

def ms_per_step(name):
    rows = [json.loads(l) for l in open(f"{d}/{name}.m") if l.strip()]
    return sum(r["step_ms"] * r["steps"] for r in rows) / sum(r["steps"] for r in rows)

def kill_run(mode, i):
    name = f"kill_{mode}_{i}"
    lines = []
    for l in open(f"{d}/{name}.log"):
        t, _, text = l.rstrip("\n").partition(" ")
        lines.append((float(t), text))
    steps = [(t, int(m[1]), int(m[2])) for t, text in lines
             if (m := re.match(r"\[rank 0\] epoch (\d+) step (\d+)/", text))]
    def at(pattern, after):
        return next((t, m) for t, text in lines if t >= after and (m := re.search(pattern, text)))
    def step_at(step, after):
        return next(t for t, e, s in steps if (e, s) == (1, step) and t >= after)
    death = step_at(S, 0)
    r = {}
    r["ddprun"] = at(r"^ddprun: rank 2 \(pid \d+\) failed", death)[0] - death
    if mode == "continue":
        went_on = [(t, int(m[1])) for t, text in lines
                   if (m := re.search(r"going on from step (\d+)", text))]
        assert len(went_on) == 3 and len({s for _, s in went_on}) == 1, f"{name}: {went_on}"
        r["lost"] = S - went_on[0][1]
        r["going"] = max(t for t, _ in went_on) - death
    else:
        t, m = at(r"resumed from \S+ at step (\d+)", death)
        r["lost"] = S - int(m[1])
        r["going"] = t - death
    r["first"] = step_at(S - r["lost"] + 1, death) - death
    r["next"] = step_at(S + 1, death) - death
    r["step_ms"] = 1000 * (death - step_at(S - 20, 0)) / 20
    r["wall"] = wall(name)
    r["others%"] = other(name)
    twice = len(steps) - len({(e, s) for _, e, s in steps})
    assert twice == r["lost"], f"{name}: {twice} step lines twice, {r['lost']} steps lost"
    final = [tuple(map(int, l.split()[:2])) for l in open(f"{d}/{name}.loss")]
    assert len(final) == len(set(final)), f"{name}: a step twice in the final --loss-log"
    print(f"{name}: " + " ".join(f"{k} {v:.3f}" for k, v in r.items()), file=sys.stderr)
    return r

clean = {m: [(ms_per_step(f"clean_{m}_{i}"), wall(f"clean_{m}_{i}")) for i in range(runs)]
         for m in policies}
for m, v in clean.items():
    print(f"clean {m}: ms/step " + " ".join(f"{a:.3f}" for a, _ in v) + "; wall s " +
          " ".join(f"{b:.2f}" for _, b in v) + "; others' CPU % " +
          " ".join(f"{other(f'clean_{m}_{i}'):.0f}" for i in range(runs)), file=sys.stderr)
logged = {m: [wall(f"logged_{m}_{i}") for i in range(kill_runs)] for m in policies}
for m, v in logged.items():
    print(f"logged {m}: wall s " + " ".join(f"{b:.2f}" for b in v), file=sys.stderr)

print(f"Launch rank 2 of 4 killed after step {S} of epoch 1 (DDP_TEST_KILL_AT=2:{S}), "
      f"--save-every {K}; medians of {kill_runs} run(s) of each; times in s from the death")
print()
print("| --on-failure | steps done twice | ddprun reports the death | group going again | "
      f"first step completed | step {S + 1} completed | a step before (ms) | job wall (s) | "
      "same job without the kill (s) |")
print("|---|---|---|---|---|---|---|---|---|")
for mode, policy in policies.items():
    rs = [kill_run(mode, i) for i in range(kill_runs)]
    m = lambda k: med(r[k] for r in rs)
    print(f"| {policy} | {m('lost'):g} | {m('ddprun'):.3f} | {m('going'):.3f} | {m('first'):.3f} | "
          f"{m('next'):.3f} | {m('step_ms'):.1f} | {m('wall'):.2f} | {med(logged[mode]):.2f} |")
print()
print(f"No failure: {runs} run(s) of each, in back-to-back pairs")
print()
print("| --on-failure | ms/step median | min - max | job wall median (s) | min - max |")
print("|---|---|---|---|---|")
for mode, policy in policies.items():
    steps = [a for a, _ in clean[mode]]
    walls = [b for _, b in clean[mode]]
    print(f"| {policy} | {med(steps):.3f} | {min(steps):.3f} - {max(steps):.3f} | "
          f"{med(walls):.2f} | {min(walls):.2f} - {max(walls):.2f} |")
def ratios(k):
    rs = sorted(c[k] / r[k] for c, r in zip(clean["continue"], clean["restart"]))
    of_medians = med(c[k] for c in clean["continue"]) / med(r[k] for r in clean["restart"])
    return f"{of_medians:.3f}; pairs {med(rs):.3f}", f"{rs[0]:.3f} - {rs[-1]:.3f}"
(s_ratio, s_range), (w_ratio, w_range) = ratios(0), ratios(1)
print(f"| continue / restart (of the medians; median of the pairs') | {s_ratio} | {s_range} | "
      f"{w_ratio} | {w_range} |")
import glob
others = [float(open(f).read().split()[2]) for f in glob.glob(f"{d}/*.wall")]
print()
print(f"Other processes' share of the {__import__('os').cpu_count()} CPUs during the jobs: median "
      f"{100 * med(others):.1f}%, at most {100 * max(others):.1f}%; "
      f"{open(f'{d}/redos').read().strip()} round(s) run again for theirs")
PY
