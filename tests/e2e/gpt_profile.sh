#!/usr/bin/env bash
# The op profile of a GPT step, ours and the PyTorch peer's, as bench/gpu/run.sh reads
# them (Note [op profile] in runtime/profile.h): `bench gpt --profile-steps 2` on
# gpt-tiny (2 layers) records each block's attention twice a step, forward and
# backward, and its shares add up to the step; torch_gpt_train.py --profile-steps 2
# --profile-out writes torch.profiler's entries; results.py profile-top reads both.
# Exit code 77 (skip) with the reason when /usr/bin/python3 (or $PYTHON) cannot import torch
# (after our half has passed).
# usage: gpt_profile.sh BENCH_BINARY
set -euo pipefail
bench=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

"$bench" gpt --model gpt-tiny --batch-size 2 --repeats 1 --warmup 1 --profile-steps 2 --json \
  >"$dir/ours.jsonl"
python3 - "$dir/ours.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by_op = {r["op"]: r for r in rows
         if r.get("section") == "gpt step op profile: by op (summed over shapes)"}
by_shape = [r for r in rows
            if r.get("section") == "gpt step op profile: the longest ops by shape (Note [op profile])"]
assert by_op and by_shape, f"no profile sections in {[r.get('section') for r in rows]}"
# 2 layers: each block's attention forward and backward once a step; one loss.
for op, calls in (("causal_self_attention", 2.0), ("causal_self_attention_backward", 2.0),
                  ("softmax_xent_forward", 1.0), ("embedding", 2.0)):
    assert op in by_op, f"no '{op}' row: {sorted(by_op)}"
    assert by_op[op]["calls_per_step"] == calls, f"{op}: {by_op[op]}"
every, outside, whole = (by_op[k]["ms_per_step"] for k in
                         ("(every op)", "(outside any op: the host between ops)", "(the whole step)"))
assert 0 < every <= whole, (every, whole)
assert abs(every + outside - whole) <= 0.002 + 1e-3 * whole, (every, outside, whole)
ops = [r for r in by_op.values() if not r["op"].startswith("(")]
assert abs(sum(r["ms_per_step"] for r in ops) - every) <= 0.001 * len(ops) + 1e-3 * every
assert all(r["shapes"] for r in by_shape if not r["op"].startswith("("))
print(f"ours: {len(ops)} ops, {every:.3f} of {whole:.3f} ms/step")
PY
ours=$(python3 "$root/bench/gpu/results.py" profile-top "$dir/ours.jsonl" 3)
echo "$ours"
[[ $ours =~ ^"in the step: ".*" ms (".*"every entry ".*" ms/step"$ ]] || fail "results.py on ours: $ours"

. "$(dirname "${BASH_SOURCE[0]}")/lib_torch.sh"  # the peer's half needs torch

"$python" "$root/bench/peer/torch_gpt_train.py" --model gpt-tiny --batch 2 --steps 1 --warmup 1 \
  --profile-steps 2 --profile-out "$dir/torch.jsonl" >"$dir/torch.out" 2>"$dir/torch.err"
grep -q "torch.profiler over 2 steps" "$dir/torch.err" || fail "no profile table: $(cat "$dir/torch.err")"
theirs=$(python3 "$root/bench/gpu/results.py" profile-top "$dir/torch.jsonl" 3)
echo "$theirs"
[[ $theirs =~ ^"in the step: ".*"every entry ".*" ms/step"$ ]] || fail "results.py on torch's: $theirs"
grep -q '"op": "aten::mm"' "$dir/torch.jsonl" || fail "no aten::mm among torch's entries"
# --profile-out alone is a usage error naming what it needs.
if "$python" "$root/bench/peer/torch_gpt_train.py" --profile-out "$dir/x" 2>"$dir/err"; then
  fail "--profile-out without --profile-steps was accepted"
fi
grep -q "give --profile-steps N" "$dir/err" || fail "unexpected message: $(cat "$dir/err")"
echo "ok"
