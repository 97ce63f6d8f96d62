#!/usr/bin/env bash
# train and sample with a padded LM head (Note [padded head]; docs/models.md,
# padded_vocab=), on the synthetic stream (no corpus needed):
#  - 12 steps of a small gpt with padded_vocab=264 log the losses of the same
#    model without it, step for step (relative 1e-5: the padding's -inf logits add
#    nothing; only the order of a row's sums may differ), and save the same weights
#    (the same shapes: the padding is the product's, not the model's) within 1e-3:
#    AdamW turns the rounding noise of c_attn's key bias gradient (zero but for
#    rounding, as e2e.train_zero3 notes) into full steps whose sign the BLAS
#    kernel's summation order decides (measured 9e-5 under OpenBLAS's Haswell and
#    Zen kernels, 0 under Cooperlake's);
#  - sample from the padded checkpoint gives the unpadded one's text for the seed;
#  - padded_vocab below vocab is a usage error naming the value.
# usage: train_gpt_padded.sh TRAIN SAMPLE
set -uo pipefail
train=$1 sample=$2
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "train_gpt_padded.sh: FAIL: $*" >&2; exit 1; }
base="gpt:layers=2,d=32,heads=2,ctx=32,vocab=256"
for form in plain padded; do
  model=$base
  [ "$form" = padded ] && model="$base,padded_vocab=264"
  "$train" --model "$model" --data synthetic --max-steps 12 --batch-size 4 --seed 3 \
    --device cpu --loss-log "$dir/$form.loss" --save "$dir/$form.st" >"$dir/$form.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { tail -20 "$dir/$form.log"; fail "train ($form) exited $rc"; }
done
python3 - "$dir/plain.loss" "$dir/padded.loss" <<'PY' || fail "the padded head's losses are not the plain head's"
import sys
def losses(path):
    out = []
    for line in open(path):
        parts = line.split()
        if parts and parts[0].isdigit():
            out.append(float(parts[-1]))
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 12 and len(b) == 12, (len(a), len(b))
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(x), f"step {i + 1}: {x} vs {y}"
print(f"12 losses agree (first {a[0]}, last {a[-1]})")
PY
python3 "$here/compare_checkpoints.py" "$dir/plain.st" "$dir/padded.st" --rtol 1e-3 >"$dir/compare.log" 2>&1 ||
  { cat "$dir/compare.log"; fail "the padded head's checkpoint differs from the plain one's"; }
"$sample" --checkpoint "$dir/plain.st" --tokens 40 --prompt "ab" --seed 5 >"$dir/plain.txt" 2>&1 ||
  fail "sample (plain) exited $?"
"$sample" --checkpoint "$dir/padded.st" --tokens 40 --prompt "ab" --seed 5 >"$dir/padded.txt" 2>&1 ||
  fail "sample (padded) exited $?: $(cat "$dir/padded.txt")"
cmp -s "$dir/plain.txt" "$dir/padded.txt" ||
  fail "sample's text differs: $(cat -v "$dir/plain.txt") vs $(cat -v "$dir/padded.txt")"
out=$("$train" --model "$base,padded_vocab=100" --data synthetic --max-steps 1 --device cpu 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "padded_vocab=100 exited $rc, not 2: $out"
grep -q "padded_vocab=100 is smaller than vocab=256" <<<"$out" || fail "the message: $out"
echo "train_gpt_padded.sh: ok"
