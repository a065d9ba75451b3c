// tiktoken (the npm package: OpenAI's Rust core compiled to WebAssembly) encoding a file with
// GPT-2's encoding: the compiled peer of Kiln's GPT-2 encoding in tools/bench/tokenizer.
//
// usage: node tiktoken_encode.js TIKTOKEN_DIR INPUT.txt IDS_OUT
// TIKTOKEN_DIR is the installed package (node_modules/tiktoken). Writes the ids, space-separated,
// to IDS_OUT and prints "encode_seconds WALL CPU": the best of 3 encodes of the whole text
// (encode_ordinary: special-token text is plain text, as in Kiln), after loading.
"use strict";
const fs = require("fs");
const path = require("path");

const [dir, input, idsOut] = process.argv.slice(2);
const tiktoken = require(path.resolve(dir));
const enc = tiktoken.get_encoding("gpt2");
const text = fs.readFileSync(input).toString("utf8");
let best = null;
let ids = null;
for (let rep = 0; rep < 3; rep++) {
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  ids = enc.encode_ordinary(text);
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  const c = process.cpuUsage(c0);
  const cpu = (c.user + c.system) / 1e6;
  if (best === null || cpu < best[1]) best = [wall, cpu];
}
fs.writeFileSync(idsOut, Array.from(ids).join(" "));
enc.free();
console.log(`encode_seconds ${best[0].toFixed(4)} ${best[1].toFixed(4)}`);
