#!/usr/bin/env bash
# Quality filters under mpirun and in incremental prep: `kiln prep` with a filter chain on 1
# process, under `mpirun -np 2` and `-np 3`, and as a prep of half the input followed by
# `--append` of the other half, must keep the same documents with the same text, and drop the
# same documents for the same reasons (rejects/ lines and stats.json "filtered"/"filters").
# usage: prep_filters_mpi.sh KILN SOURCE_DIR [MPIEXEC]
set -euo pipefail
KILN=$1
SRC=$2
MPIEXEC=${3:-}
TMP=$(mktemp -d /tmp/kiln_filters_mpi.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/in" "$TMP/half1" "$TMP/half2"
/usr/bin/python3 "$SRC/tools/bench/prep_filters_corpus.py" "$TMP/all.jsonl" 2
split -n l/4 -d --additional-suffix=.jsonl "$TMP/all.jsonl" "$TMP/in/part"
cp "$TMP/in/part00.jsonl" "$TMP/in/part01.jsonl" "$TMP/half1/"
cp "$TMP/in/part02.jsonl" "$TMP/in/part03.jsonl" "$TMP/half2/"
cat > "$TMP/cfg.yaml" <<'YAML'
filters:
  - {name: url, domains: [spam.example]}
  - {name: c4}
  - {name: pii}
  - {name: gopher_repetition}
  - {name: gopher_quality}
  - {name: fineweb, char_duplicates_ratio: 0.1}
YAML
common=(--config "$TMP/cfg.yaml" --tokenizer none --threads 1)

# What a dataset kept and dropped: sorted "id<TAB>text" of every sample, sorted filtered rejects
# (id, filter, rule, value), and the filter counters of stats.json.
summary() {
  local out=$1
  /usr/bin/python3 - "$out" <<'PY'
import glob, io, json, subprocess, sys, tarfile
out = sys.argv[1]
kept = []
for shard in sorted(glob.glob(out + "/shards/*/*.tar.zst")):
    data = subprocess.run(["zstd", "-dc", shard], check=True, capture_output=True).stdout
    members = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for m in t.getmembers():
            members[m.name] = t.extractfile(m).read()
    for name, body in members.items():
        if name.endswith(".json"):
            meta = json.loads(body)
            kept.append("%s\t%s" % (meta["id"], members[name[:-5] + ".txt"].decode()))
drops = []
for f in glob.glob(out + "/rejects/*.jsonl"):
    for line in open(f):
        j = json.loads(line)
        if j["reason"] == "filtered":
            drops.append("%s %s %s %r" % (j["id"], j["filter"], j["rule"], j["value"]))
s = json.load(open(out + "/stats.json"))
print(json.dumps({"kept": sorted(kept), "drops": sorted(drops), "filtered": s["filtered"],
                  "filters": [[f["filter"], f["docs"], f["bytes"], f["rules"], f["edited"]]
                              for f in s["filters"]],
                  "docs_out": s["docs_out"]}, sort_keys=True))
PY
}

"$KILN" prep --input "$TMP/in" --output "$TMP/one" "${common[@]}" > /dev/null
summary "$TMP/one" > "$TMP/one.json"
n_drops=$(/usr/bin/python3 -c "import json; print(len(json.load(open('$TMP/one.json'))['drops']))")
[ "$n_drops" -gt 10 ] || { echo "FAIL: only $n_drops filtered documents: not a test"; exit 1; }

status=0
if [ -n "$MPIEXEC" ]; then
  for np in 2 3; do
    "$MPIEXEC" -np $np --oversubscribe "$KILN" prep --input "$TMP/in" --output "$TMP/np$np" \
      "${common[@]}" > /dev/null
    summary "$TMP/np$np" > "$TMP/np$np.json"
    if cmp -s "$TMP/one.json" "$TMP/np$np.json"; then echo "mpirun -np $np: same decisions and kept texts"
    else echo "FAIL: mpirun -np $np differs from one process"; status=1; fi
  done
fi

# Incremental: half the input, then --append the other half.
"$KILN" prep --input "$TMP/half1" --output "$TMP/inc" "${common[@]}" > /dev/null
"$KILN" prep --input "$TMP/half2" --append "$TMP/inc" --config "$TMP/cfg.yaml" --threads 1 > /dev/null
summary "$TMP/inc" > "$TMP/inc.json"
/usr/bin/python3 - "$TMP/one.json" "$TMP/inc.json" <<'PY' || status=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
ok = True
for k in ("drops", "filtered", "filters"):
    if a[k] != b[k]:
        print("FAIL: --append: %s differs" % k); ok = False
# Keys (sample ids) of kept texts: the same documents with the same text.
if sorted(a["kept"]) != sorted(b["kept"]):
    print("FAIL: --append keeps other documents or texts"); ok = False
if ok: print("--append: same decisions and kept texts as one prep of all the input")
sys.exit(0 if ok else 1)
PY
exit $status
