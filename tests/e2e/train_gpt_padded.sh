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
#  - the plain checkpoint (one epoch of 12 steps) resumes under padded_vocab (the
#    same model: only the spec's padding differs) and the 4 steps of its second
#    epoch log the plain resume's losses; the padded checkpoint resumes under the
#    plain spec with the losses it gives under its own; a checkpoint of another
#    vocab is still refused, naming both specs;
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
# resume_epoch2 NAME MODEL CHECKPOINT: epoch 2's 4 steps from CHECKPOINT under MODEL,
# losses to $dir/NAME.loss.
resume_epoch2() {
  "$train" --model "$2" --data synthetic --epochs 2 --max-steps 4 --batch-size 4 --seed 3 \
    --device cpu --resume "$3" --loss-log "$dir/$1.loss" >"$dir/$1.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { tail -20 "$dir/$1.log"; fail "resuming $3 under $2 exited $rc"; }
}
# same_epoch2 A B: the two runs logged epoch 2's 4 steps with the same losses (1e-5).
same_epoch2() {
  python3 - "$dir/$1.loss" "$dir/$2.loss" <<'PY'
import sys
def losses(path):
    rows = [l.split() for l in open(path)]
    return {(int(r[0]), int(r[1])): float(r[-1]) for r in rows if r and r[0].isdigit()}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
want = [(2, s) for s in range(1, 5)]
assert sorted(a) == sorted(b) == want, (sorted(a), sorted(b))
for k in want:
    assert abs(a[k] - b[k]) <= 1e-5 * abs(a[k]), f"epoch {k[0]} step {k[1]}: {a[k]} vs {b[k]}"
print(f"{sys.argv[1]} and {sys.argv[2]}: epoch 2's 4 steps agree (last {a[want[-1]]})")
PY
}
padded="$base,padded_vocab=264"
resume_epoch2 resumed_plain "$base" "$dir/plain.st"
resume_epoch2 resumed_padded "$padded" "$dir/plain.st"
same_epoch2 resumed_plain resumed_padded || fail "the plain checkpoint's losses differ under padded_vocab"
# And back: the padded checkpoint resumes under the plain spec, with the losses it
# gives under its own.
resume_epoch2 back "$base" "$dir/padded.st"
resume_epoch2 same "$padded" "$dir/padded.st"
same_epoch2 same back || fail "the padded checkpoint's losses differ under the plain spec"
other="gpt:layers=2,d=32,heads=2,ctx=32,vocab=264"
out=$("$train" --model "$other" --data synthetic --epochs 2 --max-steps 1 --device cpu --resume "$dir/padded.st" 2>&1)
rc=$?
[ $rc -ne 0 ] || fail "a checkpoint of vocab=256 resumed into vocab=264"
grep -q "the checkpoint holds model '$base,padded_vocab=264', but this run builds '$other'" <<<"$out" ||
  fail "the refusal's message: $out"
out=$("$train" --model "$base,padded_vocab=100" --data synthetic --max-steps 1 --device cpu 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "padded_vocab=100 exited $rc, not 2: $out"
grep -q "padded_vocab=100 is smaller than vocab=256" <<<"$out" || fail "the message: $out"
echo "train_gpt_padded.sh: ok"
