#!/usr/bin/env bash
# scale_gpt.sh SCALE: a sweep of gpt-tiny on the synthetic token stream (ours,
# weak scaling, world sizes 1 and 2, 3 steps) writes both points with
# tokens_per_s = samples_per_s x 64 (the context: a sample is a sequence), and a
# gpt spec with commas in --models is one model (its commas are ';' in the CSV);
# a second run finds both points done (the spec reads back).
set -uo pipefail
scale=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "scale_gpt: FAIL: $*" >&2
  for f in "$dir"/*.log "$dir"/s.csv; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
"$scale" --world-sizes 1,2 --models gpt:layers=1,d=32,heads=2,ctx=64 --impls ours --scaling weak \
  --batch 4 --steps 3 --csv "$dir/s.csv" --timeout 120 >"$dir/run.log" 2>&1 || fail "scale exited $?"
python3 - "$dir/s.csv" <<'PY' || fail "CSV rows wrong"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["world_size"] for r in rows] == ["1", "2"], rows
for r in rows:
    assert r["model"] == "gpt:layers=1;d=32;heads=2;ctx=64", r  # the spec's commas as ';'
    sps, tps = float(r["samples_per_s"]), float(r["tokens_per_s"])
    assert sps > 0 and abs(tps - 64 * sps) <= 1e-3 * tps + 64 * 0.05, (sps, tps)
print("scale_gpt: rows", [(r["world_size"], r["tokens_per_s"]) for r in rows])
PY
"$scale" --world-sizes 1,2 --models gpt:layers=1,d=32,heads=2,ctx=64 --impls ours --scaling weak \
  --batch 4 --steps 3 --csv "$dir/s.csv" --timeout 120 >"$dir/again.log" 2>&1 || fail "scale again exited $?"
grep -q "0 to run" "$dir/again.log" || fail "the second run did not find the points done"
grep -qE 'W=2 4/rank #0: [0-9]+ samples/s \([0-9]+ tokens/s\)' "$dir/run.log" || fail "no tokens/s in the progress"
echo "scale_gpt: ok"
