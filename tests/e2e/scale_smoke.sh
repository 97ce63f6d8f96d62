#!/usr/bin/env bash
# scale_smoke.sh SCALE: a tiny sweep (ours, MLP, world sizes 1 and 2, strong and
# weak scaling, 5 steps) writes a CSV with the 4 points and a well-formed SVG
# with their 2 series; running it again measures nothing new (resume), and
# extending it with --repeats 2 runs exactly the 4 new points.
set -uo pipefail
scale=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "scale_smoke: FAIL: $*" >&2
  for f in "$dir"/*.log "$dir"/s.csv; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
# shellcheck disable=SC2054  # "1,2" is one value
args=(--world-sizes 1,2 --models mlp --impls ours --global-batch 64 --batch 32 --steps 5
      --csv "$dir/s.csv" --timeout 120)

"$scale" "${args[@]}" >"$dir/run1.log" 2>&1 || fail "first sweep exited $?"
[ -f "$dir/s.csv" ] || fail "no s.csv written"
[ -f "$dir/s.svg" ] || fail "no s.svg written"
[ "$(wc -l <"$dir/s.csv")" -eq 5 ] || fail "expected a header and 4 rows in s.csv"
head -1 "$dir/s.csv" | grep -q '^impl,model,scaling,backend,bucket_cap_mb,world_size,' || fail "CSV header"
for scaling in strong weak; do
  for w in 1 2; do
    grep -qE "^ours,mlp,$scaling,auto,25,$w,[0-9]+,[0-9]+,5,1,0,[0-9.]+," "$dir/s.csv" ||
      fail "no row for $scaling scaling at world size $w"
  done
done
# Efficiency is 1 at the baseline of each series.
[ "$(grep -cE '^ours,mlp,(strong|weak),auto,25,1,.*,1\.0000,' "$dir/s.csv")" -eq 2 ] ||
  fail "world size 1 rows must have efficiency 1.0000"
grep -qE '^scale: \[4/4\] ours mlp weak auto 25MiB W=2 32/rank #0: [0-9]+ samples/s, efficiency' \
  "$dir/run1.log" || fail "no progress line for the last point"
python3 - "$dir/s.svg" <<'EOF' || fail "the SVG is not well-formed or lacks the series"
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
labels = sorted(g.get("data-label") for g in root.iter("{http://www.w3.org/2000/svg}g")
                if g.get("class") == "series")
assert labels == ["ours mlp strong", "ours mlp weak"], labels
EOF

"$scale" "${args[@]}" >"$dir/run2.log" 2>&1 || fail "second sweep exited $?"
grep -q "4 points planned, 4 already in .*, 0 to run" "$dir/run2.log" || fail "the rerun did not skip every point"
"$scale" "${args[@]}" --repeats 2 >"$dir/run3.log" 2>&1 || fail "third sweep exited $?"
grep -q "8 points planned, 4 already in .*, 4 to run" "$dir/run3.log" || fail "--repeats 2 must run 4 new points"
[ "$(wc -l <"$dir/s.csv")" -eq 9 ] || fail "expected 8 rows after --repeats 2"
echo "scale_smoke: ok"
