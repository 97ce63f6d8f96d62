#!/usr/bin/env bash
# The timeline of an uneven run (docs/observability.md, Note [uneven epochs] in
# trainer/uneven.h): `ddprun --trace DIR train --drop-last false` leaves a
# merged trace that check_trace.py accepts with --buckets. Ranks 1 and 2 shadow
# the third step of each epoch, and their shadowed buckets must become "ready"
# before their all-reduces as in a backward (Reducer::shadow), so every rank
# shows as many steps (3 per epoch, shadowed ones included) and as many bucket
# all-reduces, each after its bucket's ready instant.
# usage: train_join_trace.sh DDPRUN TRAIN BACKEND
set -uo pipefail
ddprun=$1 train=$2 backend=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "train_join_trace.sh: FAIL: $*" >&2
  [ -f "$dir/run.log" ] && tail -20 "$dir/run.log" >&2
  exit 1
}

# 97 samples over 3 ranks: 33, 32, 32; batches of 16: 3, 2, 2 steps per epoch;
# buckets of 0.2 MB: several per step.
timeout 120 "$ddprun" --standalone -n 3 --backend "$backend" --trace "$dir/t" "$train" \
  --data synthetic --synthetic-size 97 --batch-size 16 --epochs 2 --seed 3 --drop-last false \
  --bucket-cap-mb 0.2 >"$dir/run.log" 2>&1 || fail "ddprun exited $?"
grep -q "ranks take 2 to 3 steps per epoch" "$dir/run.log" || fail "not an uneven run"
grep -q "ddprun: trace: merged 3 rank(s)" "$dir/run.log" || fail "ddprun did not merge 3 ranks"
python3 "$here/check_trace.py" "$dir/t/trace.json" --ranks 3 --steps 6 --buckets ||
  fail "the merged trace of an uneven run is wrong"
# The shadowed steps are on the timeline: ranks 1 and 2 each have 2 (step args shadow 1).
python3 - "$dir/t/trace.json" <<'PY' || fail "shadowed steps"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
shadowed = {}
for e in events:
    if e["ph"] == "X" and e["name"] == "step" and e.get("args", {}).get("shadow") == 1:
        rank = e["pid"] - 1  # pid = rank + 1 (Perfetto treats pid 0 specially)
        shadowed[rank] = shadowed.get(rank, 0) + 1
assert shadowed == {1: 2, 2: 2}, f"shadowed steps per rank: {shadowed}, expected ranks 1 and 2: 2"
print("shadowed steps: ranks 1 and 2, 2 each")
PY
echo "train_join_trace.sh: ok ($backend)"
