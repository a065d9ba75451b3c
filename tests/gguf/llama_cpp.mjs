// llama.cpp (npm node-llama-cpp 3.21.1, its prebuilt CPU binary) as the reference for Kiln's GGUF
// export (tests/gguf_llama_cpp.sh). Reads one JSON request on stdin, writes one JSON answer:
//   {"model": FILE.gguf, "texts": [...],                 -> "tokens": [[ids of each text]]
//    "greedy": [[prompt ids], ...], "steps": 32,          -> "greedy": [[32 ids after each]]
//    "greedy_texts": [text, ...],                         -> "greedy_texts": the same, from text
//    "dists": [[prompt ids], ...],                        -> "dists": per prompt, [[p over the
//                                                            vocabulary] after each position]
//    "kv_f32": false}                                        (see below)
// plus "vocab" (n_vocab) and "meta" (a few GGUF keys as llama.cpp read them). Tokenizing is
// llama.cpp's own (special tokens not parsed, nothing added: add_bos_token false); greedy is
// temperature 0 (llama.cpp's greedy sampler: argmax); the distributions are softmax of the raw
// logits (no sampler touches them at temperature 0).
//   node llama_cpp.mjs --check   exits 0 when the prebuilt binary loads (tools/llama_cpp/install)
// Nothing is built or downloaded: build "never" (a missing binary is an error, not a compile).
import {readFileSync} from "node:fs";
import {fileURLToPath} from "node:url";
import path from "node:path";

const here = path.dirname(fileURLToPath(import.meta.url));
const pkg = process.env.KILN_LLAMA_CPP_DIR ??
    path.join(here, "..", "..", "tools", "llama_cpp", "node_modules", "node-llama-cpp", "dist", "index.js");
process.env.NODE_LLAMA_CPP_SKIP_DOWNLOAD = "true";
const {getLlama, LlamaLogLevel} = await import(pkg);
const llama = await getLlama({build: "never", gpu: false, progressLogs: false,
                              logLevel: LlamaLogLevel.error, usePrebuiltBinaries: true});
if (process.argv.includes("--check")) {
  console.log("node-llama-cpp loads: " + llama.buildType + ", gpu " + llama.gpu);
  process.exit(0);
}
const req = JSON.parse(readFileSync(0, "utf8"));
const model = await llama.loadModel({modelPath: req.model, gpuLayers: 0, useMmap: false});
const out = {meta: {}};
const md = model.fileInfo.metadata;
out.meta.architecture = md.general.architecture;
out.meta.pre = md.tokenizer?.ggml?.pre;
out.meta.context = md[md.general.architecture].context_length;
out.meta.chat_template = md.tokenizer?.chat_template ?? null;
out.meta.bos = model.tokens.bos;
out.meta.eos = model.tokens.eos;
out.tokens = (req.texts ?? []).map((t) => Array.from(model.tokenize(t, false)));

// kv_f32: keys and values cached in f32 (llama.cpp's default is f16) and no flash attention, so
// only the weights' type and llama.cpp's own kernels differ from Kiln's fp32 forward.
const kv = req.kv_f32 ? {experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
                         flashAttention: false} : {};
const ctx = await model.createContext({contextSize: out.meta.context, batchSize: out.meta.context,
                                      sequences: 1, threads: 1, ...kv});
const seq = ctx.getSequence();
async function fresh() {  // one sequence, its KV cache emptied
  await seq.clearHistory();
  return seq;
}
const greedyOpts = {generateNext: {token: true, options: {temperature: 0}}};
// req.steps greedy tokens after a prompt of ids, from a fresh sequence.
async function greedy(prompt) {
  await fresh();
  const steps = req.steps ?? 32;
  const got = [];
  let res = await seq.controlledEvaluate(prompt.map((t, i) => i === prompt.length - 1 ? [t, greedyOpts] : t));
  let next = res[prompt.length - 1].next.token;
  while (got.length < steps) {
    got.push(next);
    if (got.length === steps) break;
    res = await seq.controlledEvaluate([[next, greedyOpts]]);
    next = res[0].next.token;
  }
  return got;
}
out.greedy = [];
for (const prompt of req.greedy ?? []) out.greedy.push(await greedy(prompt));
// greedy_texts: the same from typed text, tokenized by llama.cpp itself.
out.greedy_texts = [];
for (const text of req.greedy_texts ?? []) {
  out.greedy_texts.push(await greedy(Array.from(model.tokenize(text, false))));
}
out.dists = [];
for (const prompt of req.dists ?? []) {
  await fresh();
  const res = await seq.controlledEvaluate(prompt.map((t) =>
      [t, {generateNext: {probabilities: true, options: {temperature: 0}}}]));
  out.dists.push(res.map((r) => {
    const row = new Array(r.next.probabilities.size).fill(null);
    for (const [tok, prob] of r.next.probabilities) row[tok] = prob;
    return row;
  }));
}
process.stdout.write(JSON.stringify(out));
await ctx.dispose();
await model.dispose();
