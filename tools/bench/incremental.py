#!/usr/bin/python3
"""Incremental prep benchmark: add 10% new data to a prepared dataset (kiln prep --append) vs a
full re-run of kiln prep over the union, in the same run, with the same removals checked.

  tools/bench/incremental [--bytes N] [--dir DIR] [--kiln PATH] [--threads N] [--memory SIZE]

1. Corpus (made once in DIR/corpus-N from text files already on the machine, as
   tools/bench/prep does: /usr/include, /usr/share/doc, licences, Chinese man pages; nothing is
   downloaded): JSONL documents that are random windows of 20-400 lines of those files, so
   windows of the same file overlap partly (near duplicates), and 5% copied exactly.
   `old/` holds N bytes in 10 files, `new/` N/10 bytes in 1 file, drawn from the same pool, so
   the new part duplicates the old one as a fresh crawl would.
2. kiln prep --input old --output base         (the existing dataset; timed for reference)
3. kiln prep --input new --append copy-of-base  (what incremental prep costs)
4. kiln prep --input old new --output union --tokenizer base/tokenizer.json
                                                (the full re-run with the same tokenizer)
Each run's wall time, CPU time and peak RSS (getrusage of the child). Removals: the ids of new/
documents that the union run removes must equal those that the append removes (and their kept
documents); the script prints both counts and any difference.
"""
import argparse
import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time


def run(cmd, log):
    t0 = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic() - t0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if rc != 0:
        sys.exit("failed (%d): %s\n%s" % (rc, " ".join(cmd), open(log).read()[-3000:]))
    return wall, cpu


def peak_rss_mib(cmd, log):
    """Runs cmd under /usr/bin/time -v: (wall, cpu, peak RSS MiB)."""
    tv = log + ".time"
    wall, cpu = run(["/usr/bin/time", "-v", "-o", tv] + cmd, log)
    rss = 0
    for line in open(tv):
        if "Maximum resident set size" in line:
            rss = int(line.split(":")[1]) / 1024
    return wall, cpu, rss


def looks_like_text(b):
    if len(b) < 64 or b"\0" in b[:8192]:
        return False
    head = b[:8192]
    bad = sum(1 for c in head if c < 9 or 13 < c < 32)
    return bad * 100 <= len(head)


def load_sources(roots, max_total):
    """Text files already on the machine (as tools/bench/prep does): lists of lines."""
    paths = []
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < (8 << 20):
                    paths.append(p)
    paths.sort()
    out, total = [], 0
    for p in paths:
        try:
            raw = open(p, "rb").read()
            if p.endswith(".gz"):
                raw = gzip.decompress(raw)
        except Exception:
            continue
        if not looks_like_text(raw):
            continue
        lines = raw.decode("utf-8", errors="replace").splitlines(True)
        if len(lines) >= 20:
            out.append(lines)
            total += len(raw)
        if total > max_total:
            break
    return out


def make_corpus(out, total, seed=12345):
    rng = random.Random(seed)
    lines = load_sources(["/usr/include", "/usr/share/doc", "/usr/share/common-licenses",
                          "/usr/share/man/zh_CN"], 2 << 30)
    if not lines:
        sys.exit("no source text found")
    docs, size, n = [], 0, 0
    while size < total * 1.1:
        doc = lines[rng.randrange(len(lines))]
        start = rng.randrange(max(1, len(doc) - 20))
        text = "".join(doc[start:start + rng.randint(20, 400)])
        if not text.strip():
            continue
        docs.append(text)
        size += len(text)
        if rng.random() < 0.05:  # an exact copy somewhere else
            docs.append(text)
            size += len(text)
    rng.shuffle(docs)
    cut = 0
    acc = 0
    for i, d in enumerate(docs):
        acc += len(d)
        if acc >= total:
            cut = i + 1
            break
    # Named so that the old part sorts first: prep takes files in path order, and the re-run over
    # the union must see the old documents first, as the append does.
    parts = {"1-old": docs[:cut], "2-new": docs[cut:]}
    for name, part in parts.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        nfiles = 10 if name == "1-old" else 1
        for k in range(nfiles):
            with open(os.path.join(out, name, "part-%02d.jsonl" % k), "w") as f:
                for i in range(len(part) * k // nfiles, len(part) * (k + 1) // nfiles):
                    f.write(json.dumps({"id": "%s%d" % (name[2], i), "text": part[i]}) + "\n")
    return {k: sum(len(d) for d in v) for k, v in parts.items()}


def removed(path, prefix):
    out = {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if str(j["id"]).startswith(prefix):
                out[j["id"]] = j["kept"]
    return out


def index_format(ds):
    try:
        with open(os.path.join(ds, "dedup", "index", "index.json")) as f:
            return json.load(f).get("format", "?")
    except (OSError, ValueError):
        return "missing"


def index_summary(ds):
    """(entries, kept documents, bytes) of a dataset's dedup index."""
    idx = os.path.join(ds, "dedup", "index")
    with open(os.path.join(idx, "index.json")) as f:
        meta = json.load(f)
    entries = kept = 0
    for seg in meta["segments"]:
        for run in seg["runs"]:
            entries += run["docs"]
            kept += run.get("kept", run["docs"])
    size = 0
    for root, _, files in os.walk(idx):
        size += sum(os.path.getsize(os.path.join(root, n)) for n in files)
    return entries, kept, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--dir", default="/tmp/kiln-bench-incremental")
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--threads", default="0")
    ap.add_argument("--memory", default="2G")
    ap.add_argument("--reuse-base", action="store_true",
                    help="keep DIR/base from an earlier run (same corpus) instead of preparing it")
    a = ap.parse_args()
    corpus = os.path.join(a.dir, "corpus-%d" % a.bytes)
    if not os.path.exists(os.path.join(corpus, "2-new")):
        sizes = make_corpus(corpus, a.bytes)
        print("corpus: old %.0f MB, new %.0f MB of text" % (sizes["1-old"] / 1e6, sizes["2-new"] / 1e6))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print("machine: %d cores, load average %s (shared machine: other jobs run beside it)" %
          (os.cpu_count(), load))
    common = ["--threads", a.threads, "--memory", a.memory]
    base, app, uni = (os.path.join(a.dir, n) for n in ("base", "append", "union"))
    reuse = a.reuse_base and os.path.exists(os.path.join(base, "manifest.json"))
    if reuse and index_format(base) != "kiln-dedup-index/2":
        print("--reuse-base: %s has a %s index (no removed entries): preparing it again" %
              (base, index_format(base)))
        reuse = False
    for d in ((app, uni) if reuse else (base, app, uni)):
        shutil.rmtree(d, ignore_errors=True)
    k = os.path.abspath(a.kiln)
    if not reuse:
        w0, c0, r0 = peak_rss_mib([k, "prep", "--input", corpus + "/1-old", "--output", base] +
                                  common, base + ".log")
        print("existing dataset (old, prep with tokenizer training): %.1f s wall, %.1f s CPU, "
              "peak RSS %.0f MiB" % (w0, c0, r0))
    shutil.copytree(base, app)
    w1, c1, r1 = peak_rss_mib([k, "prep", "--input", corpus + "/2-new", "--append", app] + common,
                              app + ".log")
    w2, c2, r2 = peak_rss_mib([k, "prep", "--input", corpus + "/1-old", corpus + "/2-new", "--output",
                               uni, "--tokenizer", base + "/tokenizer.json"] + common, uni + ".log")
    print("append 10%% new (--append):       %7.1f s wall, %7.1f s CPU, peak RSS %6.0f MiB" % (w1, c1, r1))
    print("full re-run over the union:      %7.1f s wall, %7.1f s CPU, peak RSS %6.0f MiB" % (w2, c2, r2))
    print("append / re-run: %.1f%% of the wall time, %.1f%% of the CPU time" %
          (100 * w1 / w2, 100 * c1 / c2))
    ra = removed(app + "/dedup/removed.jsonl", "n")
    ru = removed(uni + "/dedup/removed.jsonl", "n")
    same = sum(1 for i in ra if i in ru and ru[i] == ra[i])
    print("removed from new/: append %d, union %d, same id and kept %d, only append %d, only union %d"
          % (len(ra), len(ru), same, len(set(ra) - set(ru)), len(set(ru) - set(ra))))
    print("removals equal to the union run's (same ids, same kept documents): %s" %
          ("yes" if ra == ru else "NO"))
    e, kd, size = index_summary(base)
    print("index of the existing dataset: %d entries (%d kept, %d removed near duplicates), "
          "%.1f MB (%.0f bytes per entry)" % (e, kd, e - kd, size / 1e6, size / max(1, e)))
    rc = subprocess.call([k, "inspect", app, "--verify"], stdout=subprocess.DEVNULL)
    print("kiln inspect --verify of the appended dataset: %s" % ("ok" if rc == 0 else "FAILED"))


if __name__ == "__main__":
    main()
