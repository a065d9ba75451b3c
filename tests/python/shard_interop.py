#!/usr/bin/python3
"""Kiln shards seen by other tools, and other tools' shards seen by Kiln.

usage: shard_interop.py FIXTURE_BINARY WORK_DIR

1. shard_interop_fixture (tests/python/shard_interop_fixture.cc) writes kiln.tar.zst and kiln.tar.
2. GNU tar lists them cleanly (after `zstd -d` for .tar.zst), in WebDataset order.
3. Python's tarfile sees the same members, in WebDataset order (samples = consecutive members
   sharing the key before the first dot), with normalised headers; numpy.load reads every
   tokens.npy and gets the ids and dtype the sample's json lists.
4. Python's tarfile (pax and GNU formats) and GNU tar write "foreign" shards with np.save token
   arrays; the fixture binary reads them back with ShardReader and checks the token ids.
Exits non-zero with a message on the first mismatch.
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run_fixture(binary, command, work):
    p = subprocess.run([binary, command, work], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"{binary} {command} failed (rc {p.returncode}):\n{p.stdout}\n{p.stderr}")


def split_key(name):
    # WebDataset: the key is the name up to the first dot of the basename.
    base = os.path.basename(name)
    dot = base.index(".")
    return os.path.dirname(name) + ("/" if "/" in name else "") + base[:dot], base[dot + 1:]


def tar_bytes(path):
    if path.endswith(".zst"):
        p = subprocess.run(["zstd", "-d", "-q", "-c", path], capture_output=True)
        if p.returncode != 0:
            fail(f"zstd -d {path}: {p.stderr.decode()}")
        return p.stdout
    with open(path, "rb") as f:
        return f.read()


def check_kiln_shard(path):
    raw = tar_bytes(path)
    # GNU tar: lists cleanly, nothing on stderr.
    p = subprocess.run(["tar", "-t", "-v", "-f", "-"], input=raw, capture_output=True)
    if p.returncode != 0 or p.stderr:
        fail(f"GNU tar -t {path}: rc {p.returncode}: {p.stderr.decode()}")
    p = subprocess.run(["tar", "-t", "-f", "-"], input=raw, capture_output=True)
    gnu_names = p.stdout.decode().splitlines()

    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        members = tf.getmembers()
        names = [m.name for m in members]
        if names != gnu_names:
            fail(f"{path}: tarfile and GNU tar disagree:\n{names}\n{gnu_names}")
        for m in members:
            if not m.isreg() or m.mtime != 0 or m.uid != 0 or m.gid != 0 or m.mode != 0o644 \
                    or m.uname != "" or m.gname != "":
                fail(f"{path}: member {m.name} header not normalised: "
                     f"type {m.type} mtime {m.mtime} uid {m.uid} gid {m.gid} mode {oct(m.mode)} "
                     f"uname {m.uname!r} gname {m.gname!r}")
        # Group into samples the WebDataset way.
        samples = []
        for m in members:
            key, ext = split_key(m.name)
            if not samples or samples[-1][0] != key:
                samples.append((key, []))
            samples[-1][1].append((ext, tf.extractfile(m).read()))
    if len(samples) != 6:
        fail(f"{path}: expected 6 samples, got {len(samples)}: {[k for k, _ in samples]}")
    for key, members in samples:
        data = dict(members)
        if len(data) != len(members):
            fail(f"{path}: sample {key} repeats an ext")
        meta = json.loads(data["json"])
        if meta["key"] != key:
            fail(f"{path}: sample key {key} != json key {meta['key']}")
        exts = [e for e, _ in members]
        if exts != meta["exts"]:
            fail(f"{path}: sample {key} members in order {exts}, expected {meta['exts']}")
        arr = np.load(io.BytesIO(data["tokens.npy"]), allow_pickle=False)
        if arr.dtype != np.dtype(meta["dtype"]) or arr.ndim != 1 or arr.dtype.byteorder not in "<=|":
            fail(f"{path}: {key}.tokens.npy has dtype {arr.dtype} shape {arr.shape}, "
                 f"expected 1-D {meta['dtype']}")
        if arr.tolist() != meta["tokens"]:
            fail(f"{path}: {key}.tokens.npy ids differ from the json")
        # Same bytes as numpy.save would write (informational: layouts differ across numpy).
        buf = io.BytesIO()
        np.save(buf, arr)
        if buf.getvalue() != data["tokens.npy"]:
            print(f"note: {key}.tokens.npy differs from this numpy's np.save bytes "
                  f"(numpy {np.__version__}); it loads the same")
    print(f"ok: {path}: {len(samples)} samples; GNU tar and tarfile agree, numpy reads tokens")


def write_foreign(work):
    """Shards written by Python tarfile (pax, GNU) and GNU tar, with np.save token arrays."""
    src = os.path.join(work, "src")
    os.makedirs(src, exist_ok=True)
    files = []
    for i in range(4):
        key = f"py{i}"
        ids = list(range(i, i + 5 * i + 1))
        dtype = np.uint32 if i % 2 else np.uint16
        buf = io.BytesIO()
        np.save(buf, np.array(ids, dtype=dtype))
        for ext, data in (("txt", f"text {i}".encode()),
                          ("json", json.dumps({"tokens": ids}, separators=(",", ": ")).encode()),
                          ("tokens.npy", buf.getvalue())):
            name = f"{key}.{ext}"
            with open(os.path.join(src, name), "wb") as f:
                f.write(data)
            files.append(name)
    for fmt, label in ((tarfile.PAX_FORMAT, "pax"), (tarfile.GNU_FORMAT, "gnu")):
        out = os.path.join(work, f"foreign-py-{label}.tar")
        with tarfile.open(out, "w", format=fmt) as tf:
            for name in files:
                tf.add(os.path.join(src, name), arcname=name)
    gnu = os.path.join(work, "foreign-gnutar.tar")
    subprocess.run(["tar", "--format=gnu", "-cf", gnu, "-C", src] + files, check=True)
    subprocess.run(["zstd", "-q", "-f", "-3", gnu, "-o", gnu + ".zst"], check=True)
    shutil.rmtree(src)


def main():
    if len(sys.argv) != 3:
        fail(__doc__)
    binary, work = sys.argv[1], os.path.abspath(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run_fixture(binary, "write", work)
    for name in ("kiln.tar.zst", "kiln.tar"):
        check_kiln_shard(os.path.join(work, name))
    write_foreign(work)
    run_fixture(binary, "read", work)
    print("ok: kiln reads shards from Python tarfile (pax, GNU) and GNU tar (+ zstd CLI)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
