#!/usr/bin/env bash
# Token shards (runtime/data/token_shards.h) and `tokenize` (models/tokenize.cpp):
#  1. tokenize --brown: GPT-2 tokens of the Brown corpus in shards of 300,000
#     (several train shards, one validation shard of every 10th document), each
#     document after an <|endoftext|>; --decode of the validation shard gives
#     back 50 documents, the first of them cats.txt's 10th (its words in order),
#     a text file of one's own round-trips byte for byte, and a folder tokenized
#     into itself twice holds its one document once (earlier shards replaced,
#     shards and hidden files not read as text);
#  2. a shard written by NumPy as llm.c's scripts write them (int32 header, uint16
#     tokens): a sequence over tokens 256..511 (past the byte range) whose next
#     token is determined by the last: gpt with vocab=512 learns it (the val
#     loss falls far below ln 256) in one process and under ddprun -n 2, and the
#     metrics call the figure val_bits_per_token;
#  3. train --model gpt2-sized vocabulary on the Brown shards: the first loss is
#     near ln 50257 (a uniform guess over GPT-2's tokens) and falls, `sample`
#     continues a prompt in GPT-2 tokens, decoded to text, and refuses to feed it
#     bytes (--tokenizer bytes);
#  4. errors: a model whose vocabulary is smaller than the tokens, the mlp given
#     shards, a truncated shard (named with the offset and the sizes).
# Without the Brown corpus or the GPT-2 vocabulary it skips (77) unless
# DDP_REQUIRE_DATA=1 (deploy/test.sh), as without numpy.
# With QUICK as a fifth argument (e2e.token_shards_quick, which CI's sanitizer
# phase keeps) it leaves out the ddprun run, step 3 and sample: the 50257-token
# model took most of the test's 92 s under ASan.
# usage: token_shards.sh TOKENIZE TRAIN DDPRUN SAMPLE [quick]
set -uo pipefail
tokenize=$1 train=$2 ddprun=$3 sample=$4 quick=${5:-}
python=${PYTHON:-/usr/bin/python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "token_shards.sh: FAIL: $*" >&2
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
  exit 1
}
skip() {
  [ "${DDP_REQUIRE_DATA:-0}" = 1 ] && fail "$1"
  echo "token_shards.sh: skipped: $1"
  exit 77
}
corpus=${DDP_BROWN_DIR:-/usr/share/datasets/brown}
vocab=${DDP_GPT2_BPE_DIR:-/usr/share/datasets/gpt2-bpe}
[ -f "$corpus/cats.txt" ] || skip "no Brown corpus in $corpus (deploy/install-deps.sh installs it)"
[ -f "$vocab/vocab.bpe" ] || skip "no GPT-2 vocabulary in $vocab (deploy/install-deps.sh installs it)"
"$python" -c 'import numpy' >/dev/null 2>&1 || skip "$python cannot import numpy"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# 1. The Brown corpus as GPT-2 tokens.
"$tokenize" --brown --out "$dir/brown" --shard-tokens 300000 >"$dir/tokenize.log" 2>&1 ||
  fail "tokenize --brown exited $?"
grep -q "^summary: 500 documents (50 validation)" "$dir/tokenize.log" || fail "no summary of 500 documents"
train_shards=$(find "$dir/brown" -name 'brown_train_*.bin' | wc -l)
[ "$train_shards" -ge 3 ] || fail "expected several train shards of 300000 tokens, found $train_shards"
[ -f "$dir/brown/brown_val_000000.bin" ] || fail "no validation shard"
"$tokenize" --decode "$dir/brown/brown_val_000000.bin" >"$dir/val.txt" 2>"$dir/decode.log" ||
  fail "tokenize --decode exited $?"
"$python" - "$corpus" "$dir/val.txt" <<'PY' || fail "the decoded validation shard is not the validation text"
import sys
# The validation documents as the byte models read them (runtime/data/text_corpus.h):
# the same text must come back, each document after an <|endoftext|>.
text = open(sys.argv[2], "rb").read().decode("utf-8")
docs = text.split("<|endoftext|>")
assert docs[0] == "" and len(docs) == 51, (docs[0][:40], len(docs))
assert all(len(d) > 1000 for d in docs[1:]), [len(d) for d in docs[1:]][:5]
# The first validation document is the 10th in cats.txt: its first 30 words, tags
# cut off, come back in order.
name = [l.split()[0] for l in open(f"{sys.argv[1]}/cats.txt") if l.split()][9]
words = [w.rsplit("/", 1)[0] for w in open(f"{sys.argv[1]}/{name}").read().split()][:30]
at = 0
for w in words:
    if w in ("``", "''"):
        continue
    at = docs[1].find(w, at)
    assert at >= 0, f"{name}: '{w}' not found in order in the first validation document"
print(f"validation: {len(docs) - 1} documents, {len(text)} characters")
PY
printf 'naïve café — “quotes”, 2024\tI\x27m here.\n\n  ok  ' >"$dir/mine.txt"
"$tokenize" --out "$dir/mine" --val-every 0 "$dir/mine.txt" >"$dir/mine.log" 2>&1 || fail "tokenize FILE exited $?"
"$tokenize" --decode "$dir/mine/data_train_000001.bin" >"$dir/mine.back" 2>>"$dir/mine.log" ||
  fail "tokenize --decode exited $?"
cmp -s <(printf '<|endoftext|>'; cat "$dir/mine.txt") "$dir/mine.back" ||
  fail "a text file did not round-trip: $(od -c "$dir/mine.back" | head -3)"
# A folder given as its own --out, twice: the second run reads the text file only
# (not the first run's shards, not a hidden file) and replaces the first run's
# shards, so the folder holds the one document once (Note [tokenize folders]).
mkdir "$dir/own"
cp "$dir/mine.txt" "$dir/own/a.txt"
printf 'not a document' >"$dir/own/.hidden"
"$tokenize" --out "$dir/own" --val-every 0 --shard-tokens 5 "$dir/own" >"$dir/own.log" 2>&1 ||
  fail "tokenize into its own folder exited $?"
first=$(find "$dir/own" -name 'data_train_*.bin' | wc -l)
[ "$first" -ge 3 ] || fail "expected several 5-token shards, found $first"
"$tokenize" --out "$dir/own" --val-every 0 "$dir/own" >>"$dir/own.log" 2>&1 ||
  fail "tokenize again exited $?"
grep -q "left out 1 hidden file(s), $first token shard(s)" "$dir/own.log" ||
  fail "the second run did not leave out the hidden file and the $first shards"
# It overwrote data_train_000001.bin and removed the rest.
grep -q "removed $((first - 1)) shard(s) of an earlier run" "$dir/own.log" ||
  fail "no removal of the $((first - 1)) shards not overwritten reported"
[ "$(find "$dir/own" -name '*.bin' | wc -l)" = 1 ] || fail "stale shards left: $(ls "$dir/own")"
"$tokenize" --decode "$dir/own/data_train_000001.bin" >"$dir/own.back" 2>>"$dir/own.log" ||
  fail "tokenize --decode exited $?"
cmp -s <(printf '<|endoftext|>'; cat "$dir/mine.txt") "$dir/own.back" ||
  fail "the folder's shards are not its one document: $(head -c 200 "$dir/own.back")"
# A run that fails between its shards (DDP_TEST_TOKENIZE_FAIL_AFTER=1) leaves the
# earlier run's as they were: its own are .bin.partial until all are written (it
# overwrote data_train_000001.bin in place, beside its predecessor's others); the
# next run clears the partial file.
cp "$dir/own/data_train_000001.bin" "$dir/own.kept"
DDP_TEST_TOKENIZE_FAIL_AFTER=1 "$tokenize" --out "$dir/own" --val-every 0 --shard-tokens 5 \
  "$dir/own" >>"$dir/own.log" 2>&1 && fail "the run with DDP_TEST_TOKENIZE_FAIL_AFTER=1 exited 0"
cmp -s "$dir/own/data_train_000001.bin" "$dir/own.kept" ||
  fail "a failed run changed the earlier run's shard"
[ "$(find "$dir/own" -name '*.bin' | wc -l)" = 1 ] || fail "a failed run left shards: $(ls "$dir/own")"
"$tokenize" --out "$dir/own" --val-every 0 "$dir/own" >>"$dir/own.log" 2>&1 ||
  fail "tokenize after a failed run exited $?"
[ -z "$(find "$dir/own" -name '*.partial')" ] || fail "the failed run's partial shard stayed: $(ls "$dir/own")"

# 2. A shard as llm.c writes it, of tokens past the byte range.
"$python" - "$dir" <<'PY' || fail "numpy could not write the shard"
import sys
import numpy as np
rng = np.random.default_rng(5)
# 256 + (3 * t + 1) % 256 follows t: a rule over tokens 256..511, after a random start per run.
tokens = []
while len(tokens) < 60000:
    t = int(rng.integers(256))
    for _ in range(int(rng.integers(20, 60))):
        tokens.append(256 + t)
        t = (3 * t + 1) % 256
header = np.zeros(256, dtype=np.int32)
header[0], header[1], header[2] = 20240520, 1, len(tokens)
with open(f"{sys.argv[1]}/rule.bin", "wb") as f:
    f.write(header.tobytes())
    f.write(np.array(tokens, dtype=np.uint16).tobytes())
PY
model=gpt:layers=1,d=32,heads=2,ctx=32,vocab=512
common=(--model "$model" --data "$dir/rule.bin" --batch-size 8 --lr 0.01 --eval-batches 4 --seed 1 --device cpu)
"$train" "${common[@]}" --max-steps 150 --metrics "$dir/rule.jsonl" >"$dir/rule.log" 2>&1 || fail "train exited $?"
grep -q "token shards $dir/rule.bin (.* train / .* validation tokens, the last tenth held out" "$dir/rule.log" ||
  fail "the header does not describe the shard"
grep -q "val_bits_per_token" "$dir/rule.log" || fail "the report does not say bits per token"
runs=("$dir/rule.jsonl")
if [ -z "$quick" ]; then
  "$ddprun" --standalone -n 2 "$train" "${common[@]}" --max-steps 60 --backend shm \
    --metrics "$dir/rule2.jsonl" >"$dir/rule2.log" 2>&1 || fail "ddprun -n 2 train exited $?"
  runs+=("$dir/rule2.jsonl")
fi
"$python" - "${runs[@]}" <<'PY' || fail "the rule was not learnt"
import json, math, sys
for path, bound in zip(sys.argv[1:], (1.0, 2.5)):
    rows = [json.loads(l) for l in open(path)]
    last = rows[-1]
    assert "val_bpb" not in last and "val_bits_per_token" in last, last
    assert abs(last["val_bits_per_token"] - last["val_loss"] / math.log(2)) < 1e-5, last
    assert 6 < last["unigram_bits"] <= 8.0 + 1e-9, last  # at most 256 tokens, spread
    assert last["val_loss"] < bound, f"{path}: val_loss {last['val_loss']} (ln 256 = 5.55)"
    print(f"{path}: val_loss {last['val_loss']:.3f}")
PY

# Steps 3 and the sample (left out with quick).
if [ -z "$quick" ]; then
# 3. GPT-2's vocabulary on the Brown tokens.
"$train" --model gpt:layers=1,d=32,heads=2,ctx=64,vocab=50257 --data "$dir/brown" --batch-size 4 \
  --lr 0.003 --max-steps 40 --eval-batches 2 --loss-log "$dir/brown_loss.txt" --device cpu \
  --save "$dir/brown.st" >"$dir/brown.log" 2>&1 || fail "train on the Brown shards exited $?"
"$python" - "$dir/brown_loss.txt" <<'PY' || fail "the Brown token losses are wrong"
import math, sys
losses = [float(l.split()[2]) for l in open(sys.argv[1])]
assert abs(losses[0] - math.log(50257)) < 0.5, f"first loss {losses[0]}, ln 50257 = {math.log(50257):.3f}"
assert sum(losses[-5:]) / 5 < losses[0] - 1.0, losses
print(f"Brown tokens: loss {losses[0]:.3f} -> {sum(losses[-5:]) / 5:.3f}")
PY

# sample decodes GPT-2 tokens for a checkpoint trained on shards (its text_unit).
"$sample" --checkpoint "$dir/brown.st" --prompt "The jury said" --tokens 12 --top-k 5 >"$dir/sample.txt" \
  2>"$dir/sample.log" || fail "sample exited $?"
"$python" - "$dir/sample.txt" <<'PY' || fail "sample's text is not decoded GPT-2 tokens"
import sys
text = open(sys.argv[1], "rb").read().decode("utf-8")
assert text.startswith("The jury said") and len(text) > len("The jury said") + 12, repr(text)
# 12 GPT-2 tokens of English after 40 steps: mostly words and spaces, never byte values.
assert text.count(" ") >= 3 and all(c.isprintable() or c.isspace() for c in text), repr(text)
print("sample:", repr(text))
PY
out=$("$sample" --checkpoint "$dir/brown.st" --tokenizer bytes --prompt "The" --tokens 2 2>&1) &&
  fail "sample fed bytes to a model of GPT-2 tokens"
grep -q "trained on GPT-2 tokens.*--tokenizer bytes would feed the prompt's bytes" <<<"$out" ||
  fail "the tokenizer mix-up is not named: $out"
fi

# 4. Errors.
out=$("$train" --model gpt-tiny --data "$dir/brown" --max-steps 1 2>&1) && fail "gpt-tiny trained on GPT-2 tokens"
grep -q "vocabulary 256 is smaller than the data's 50257 (its largest token + 1); use a model with vocab=50257" <<<"$out" ||
  fail "the vocabulary error does not say what to do: $out"
out=$("$train" --model mlp --data "$dir/brown" --max-steps 1 2>&1) && fail "the mlp trained on token shards"
grep -q "holds token shards (.bin), which the gpt models train on" <<<"$out" || fail "mlp on shards: $out"
head -c 1500 "$dir/rule.bin" >"$dir/cut.bin"
out=$("$train" --model "$model" --data "$dir/cut.bin" --max-steps 1 2>&1) && fail "a truncated shard trained"
grep -q "cut.bin: the header (offset 8) counts 60.* tokens of 2 bytes, which need .* bytes after the 1024-byte header, but the file has 476" <<<"$out" ||
  fail "the truncated shard's error: $out"
echo "token_shards.sh: PASS"
