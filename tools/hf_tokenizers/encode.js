// Hugging Face tokenizers (the npm package `tokenizers`: the Rust library, natively built) as the
// reference for Kiln's tokenizers.
//
//   node encode.js ids TOKENIZER_JSON DOCS_JSONL OUT_JSONL
//       one line per input line {"text"}: {"ids": [...], "decoded": "..."} (no special tokens
//       added; decoded = decode(ids) without skipping special tokens)
//   node encode.js bench TOKENIZER_JSON DOCS_JSONL IDS_OUT
//       encodes the documents 3 times (encodeBatch, one thread), writes all ids space-separated
//       (documents in order) and prints "encode_seconds WALL CPU" for the fastest run (CPU time)
"use strict";
process.env.TOKENIZERS_PARALLELISM = "false";
process.env.RAYON_NUM_THREADS = "1";
const fs = require("fs");
const path = require("path");
const { Tokenizer } = require(path.join(__dirname, "node_modules", "tokenizers"));

async function main() {
  const [mode, tokPath, input, output] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(tokPath);
  const opts = { addSpecialTokens: false };
  if (mode === "ids") {
    const lines = fs.readFileSync(input, "utf8").split("\n").filter((l) => l.length > 0);
    const out = [];
    for (const line of lines) {
      const text = JSON.parse(line).text;
      const ids = (await tok.encode(text, null, opts)).getIds();
      const decoded = await tok.decode(Array.from(ids), false);
      out.push(JSON.stringify({ ids: Array.from(ids), decoded }));
    }
    fs.writeFileSync(output, out.join("\n") + "\n");
  } else if (mode === "bench") {
    // The documents of a JSONL file, encoded in one batch call (one thread: Rayon is held to 1
    // and TOKENIZERS_PARALLELISM is off); 3 runs.
    const texts = fs.readFileSync(input, "utf8").split("\n").filter((l) => l.length > 0)
      .map((l) => JSON.parse(l).text);
    let best = null;
    let encs = null;
    for (let rep = 0; rep < 3; rep++) {
      const c0 = process.cpuUsage();
      const t0 = process.hrtime.bigint();
      encs = await tok.encodeBatch(texts, opts);
      const wall = Number(process.hrtime.bigint() - t0) / 1e9;
      const c = process.cpuUsage(c0);
      const cpu = (c.user + c.system) / 1e6;
      if (best === null || cpu < best[1]) best = [wall, cpu];
    }
    fs.writeFileSync(output, encs.map((e) => Array.from(e.getIds()).join(" ")).join(" "));
    console.log(`encode_seconds ${best[0].toFixed(4)} ${best[1].toFixed(4)}`);
  } else {
    console.error("usage: node encode.js ids|bench TOKENIZER_JSON INPUT OUTPUT");
    process.exit(2);
  }
}
main().catch((e) => {
  console.error(String(e && e.message ? e.message : e));
  process.exit(1);
});
