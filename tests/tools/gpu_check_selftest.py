#!/usr/bin/env python3
"""tools/gpu_check's self-test, without a GPU (ctest gpu_check_selftest).

Runs the real script (not a copy of its logic) with --bin pointing at stand-in programs
(tests/tools/gpu_check_fakes/: a GoogleTest program that passes, fails, skips, crashes or hangs;
a `kiln train` that writes losses; nvidia-smi; mpirun) and checks, for every outcome, the exit
code, summary.json (valid JSON, each row's status and detail, the preflight's items), the logs of
the rows that did not pass in failed-logs.tar.gz, that the report fits what a lent machine can
send back (at most 8 files, no subfolders here, each under 16 MiB), and that a hang is killed at
its row's limit with nothing left running.

    gpu_check_selftest.py PATH/TO/tools/gpu_check [CASE...]
"""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time

GPU_CHECK = os.path.abspath(sys.argv[1])
ONLY = set(sys.argv[2:])
FAKES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_check_fakes")
TMP = tempfile.mkdtemp(prefix="gpu-check-selftest.")
failures = []


def setup():
    """The fake programs, a PATH without the machine's own mpirun and nvidia-smi, fake CUDA
    libraries (KILN_CUDA_LIBS: only those folders are searched when it is set)."""
    bin_dir = os.path.join(TMP, "bin")
    os.makedirs(bin_dir)
    for prog, fake in [("kernels_cuda_gpu", "gtest"), ("engine_device_test", "gtest"), ("kiln", "kiln")]:
        shutil.copy(os.path.join(FAKES, fake), os.path.join(bin_dir, prog))
    sys_dir = os.path.join(TMP, "sys")  # every system command but mpirun and nvidia-smi
    os.makedirs(sys_dir)
    hidden = {"mpirun", "mpiexec", "orterun", "nvidia-smi"}
    for d in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"]:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            dst = os.path.join(sys_dir, name)
            if name not in hidden and not os.path.lexists(dst):
                os.symlink(os.path.join(d, name), dst)
    for tool in ["nvidia-smi", "mpirun"]:
        tool_dir = os.path.join(TMP, tool + "-dir")
        os.makedirs(tool_dir)
        shutil.copy(os.path.join(FAKES, tool), tool_dir)
    libs = os.path.join(TMP, "cudalibs")
    os.makedirs(libs)
    for lib in ["libcuda.so.1", "libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2"]:
        open(os.path.join(libs, lib), "w").close()
    nolibs = os.path.join(TMP, "cudalibs-without-cublas")
    os.makedirs(nolibs)
    open(os.path.join(nolibs, "libcuda.so.1"), "w").close()
    return bin_dir, sys_dir, libs, nolibs


BIN, SYS, LIBS, NOLIBS = setup()


class Run:
    def __init__(self, name, rc, out, seconds, calls, pids):
        self.name, self.rc, self.out, self.seconds = name, rc, out, seconds
        self.calls, self.pids = calls, pids
        path = os.path.join(out, "summary.json")
        self.summary = json.load(open(path)) if os.path.exists(path) else None
        self.rows = {r["name"]: r for r in (self.summary or {}).get("rows", [])}
        self.pre = {p["item"]: p for p in (self.summary or {}).get("preflight", [])}


def run(name, args, env=None, smi=True, mpirun=False, libs=None, bin_dir=None, script=None,
        start_only=False):
    """gpu_check with the fakes: returns a Run (or the Popen when start_only)."""
    out = os.path.join(TMP, name, "out")
    work = os.path.join(TMP, name, "work")
    os.makedirs(out)
    path = [SYS]
    if smi:
        path.insert(0, os.path.join(TMP, "nvidia-smi-dir"))
    if mpirun:
        path.insert(0, os.path.join(TMP, "mpirun-dir"))
    calls = os.path.join(TMP, name, "calls")
    pids = os.path.join(TMP, name, "pids")
    e = {"PATH": ":".join(path), "HOME": TMP, "TMPDIR": TMP, "LANG": "C.UTF-8",
         "KILN_CUDA_LIBS": LIBS if libs is None else libs, "FAKE_CALLS": calls, "FAKE_PIDS": pids}
    e.update(env or {})
    cmd = [script or GPU_CHECK, "--bin", bin_dir or BIN, "--out", out, "--work", work] + args
    t0 = time.time()
    p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    if start_only:
        return p, out, pids
    try:
        stdout, _ = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:  # gpu_check itself hung: a failure, and everything it started goes
        os.killpg(p.pid, signal.SIGKILL)
        stdout, _ = p.communicate()
        failures.append(f"{name}: gpu_check ran past 240 s")
    seconds = time.time() - t0
    with open(os.path.join(TMP, name, "stdout"), "wb") as f:
        f.write(stdout)
    read = lambda f: open(f).read().split("\n") if os.path.exists(f) else []
    r = Run(name, p.returncode, out, seconds, read(calls), read(pids))
    r.leftover = reap(r.pids)
    return r


def check(r, what, ok, info=""):
    if not ok:
        failures.append(f"{r.name}: {what}{': ' + str(info) if info else ''}")
        print(f"  FAIL {what} {info}")


def common(r, want_rc, want_result):
    """What every finished run must show: its exit code, a complete valid summary, a report
    that can come back from a lent machine."""
    check(r, f"exit code {want_rc}", r.rc == want_rc, f"got {r.rc}; see {TMP}/{r.name}/stdout")
    check(r, "summary.json written and valid", r.summary is not None)
    if r.summary is None:
        return
    check(r, "state done", r.summary["state"] == "done", r.summary["state"])
    check(r, f"result {want_result}", r.summary["result"] == want_result, r.summary["result"])
    check(r, "exit_code in the summary", r.summary["exit_code"] == r.rc, r.summary["exit_code"])
    entries = os.listdir(r.out)
    check(r, "report: at most 8 plain files, no folders", len(entries) <= 8 and all(
        os.path.isfile(os.path.join(r.out, e)) for e in entries), entries)
    check(r, "report files under 16 MiB", all(
        os.path.getsize(os.path.join(r.out, e)) < 16 << 20 for e in entries))
    for f in ["summary.txt", "console.log"]:
        check(r, f"{f} written", f in entries, entries)
    bad = [n for n, row in r.rows.items() if row["status"] not in ("PASS", "SKIP")]
    check(r, "failed-logs.tar.gz exactly when a row did not pass (NOTRUN rows have none)",
          ("failed-logs.tar.gz" in entries) == any(r.rows[n]["status"] != "NOTRUN" for n in bad),
          (entries, bad))
    check(r, "rerun names the rows that did not pass",
          r.summary["rerun"] == (("--only " + ",".join(bad)) if bad else None), r.summary["rerun"])


def row(r, name, status, *details):
    got = r.rows.get(name)
    check(r, f"row {name} present", got is not None, list(r.rows))
    if got is None:
        return
    check(r, f"row {name} is {status}", got["status"] == status, f"{got['status']}: {got['detail']}")
    for d in details:
        check(r, f"row {name}'s detail has '{d}'", d in got["detail"], got["detail"])


def excerpt(r, name, *texts):
    lines = "\n".join(r.rows.get(name, {}).get("excerpt", []))
    for t in texts:
        check(r, f"row {name}'s excerpt has '{t}'", t in lines, lines[-400:])


def logs(r, member, *texts):
    path = os.path.join(r.out, "failed-logs.tar.gz")
    try:
        with tarfile.open(path) as t:
            data = t.extractfile(member).read().decode(errors="replace")  # logs keep their raw bytes
    except Exception as e:  # noqa: BLE001 - any reason it cannot be read is the failure
        check(r, f"failed-logs.tar.gz has {member}", False, e)
        return
    for text in texts:
        check(r, f"{member} has '{text}'", text in data, data[-400:])


def alive(pids):
    """Those of pids still running (a zombie, killed but not yet reaped, is not)."""
    out = []
    for pid in filter(None, pids):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(pid)
        except OSError:
            pass
    return out


def reap(pids):
    """Those of pids still running 2 s after gpu_check ended (then killed, with their process
    groups, so that no case leaves anything behind)."""
    for _ in range(20):
        if not alive(pids):
            break
        time.sleep(0.1)
    left = alive(pids)
    for pid in left:
        try:
            os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def gone(r):
    """gpu_check ended every program it started."""
    check(r, "nothing left running", not r.leftover, r.leftover)


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def all_pass():
    # The engine test's documented skip (what it does on every GPU machine) passes the row.
    r = run("all_pass", ["--only", "ops,engine,fp32,bf16,bf16-mma,unfused,prefetch,resume,124m,1.5b"],
            {"FAKE_ENGINE_DEVICE_TEST": "skip-documented"})
    common(r, 0, "pass")
    r2 = run("unfused_alone", ["--only", "unfused"])  # its own bf16 references
    common(r2, 0, "pass")
    row(r2, "unfused", "PASS", "vs CPU: 50 steps", "vs fused: 50 steps")
    for name in ["ops", "fp32", "bf16", "bf16-mma", "unfused", "prefetch", "resume", "124m", "1.5b"]:
        row(r, name, "PASS")
    row(r, "engine", "PASS", "skipped as documented: Device.CudaUnavailableNamesDeviceAndReason")
    row(r, "124m", "PASS", "400,000 tokens/s", "MFU 41.0%")
    check(r, "only the rows asked for", set(r.rows) == {"ops", "engine", "fp32", "bf16", "bf16-mma",
          "unfused", "prefetch", "resume", "124m", "1.5b"}, list(r.rows))
    check(r, "preflight all ok", all(p["status"] == "ok" for p in r.pre.values()), r.pre)
    check(r, "machine named", r.summary["machine"]["gpu"] == "NVIDIA H200" and
          r.summary["machine"]["cuda"] == "13.0", r.summary["machine"])


@case
def gtest_fails():
    # A failing test: FAIL with its got/want lines in the summary and the full log, the failed
    # test rerun alone with blocking launches, the exit code 1 (the old script's `local failed`
    # left it 0), and the next row still runs.
    r = run("gtest_fails", ["--only", "ops,engine"], {"FAKE_KERNELS_CUDA_GPU": "fail"})
    common(r, 1, "fail")
    row(r, "ops", "FAIL", "1 of 2 failed: KernelsCuda.Matmul")
    row(r, "engine", "PASS")
    excerpt(r, "ops", "got[17] evaluates to 0.5,", "want[17] evaluates to 0.25, and")
    # Bytes that are not UTF-8 and control characters in a log still give valid JSON (loaded
    # above), keeping the text around them.
    excerpt(r, "ops", "a kernel printf: ", "[31mred", "\u00e9 \"quoted\" back\\slash\ttab")
    logs(r, "ops/ops.log", "want[17] evaluates to 0.25", "[  FAILED  ] KernelsCuda.Matmul")
    logs(r, "ops/ops.blocking.log", "[  FAILED  ] KernelsCuda.Matmul")
    check(r, "rerun with blocking launches, only the failed test",
          any("--gtest_filter=KernelsCuda.Matmul" in c and "CUDA_LAUNCH_BLOCKING=1" in c for c in r.calls),
          r.calls)
    check(r, "summary.txt shows the FAIL", "FAIL" in open(os.path.join(r.out, "summary.txt")).read())


@case
def gtest_skips():
    # On a GPU machine a GPU test that skips fails its row, unless it is a documented skip with
    # its documented reason: the same test skipping for another reason fails too.
    r = run("gtest_skips", ["--only", "ops,engine"],
            {"FAKE_KERNELS_CUDA_GPU": "skip", "FAKE_ENGINE_DEVICE_TEST": "skip-documented-wrong-reason"})
    common(r, 1, "fail")
    row(r, "ops", "FAIL", "1 tests skipped on a GPU machine: KernelsCuda.Attention; their reasons: [no CUDA device]")
    row(r, "engine", "FAIL", "Device.CudaUnavailableNamesDeviceAndReason; their reasons: [no GPU:")
    excerpt(r, "ops", "[  SKIPPED ] KernelsCuda.Attention")


@case
def gtest_crashes():
    r = run("gtest_crashes", ["--only", "ops,engine"], {"FAKE_KERNELS_CUDA_GPU": "crash"})
    common(r, 1, "fail")
    row(r, "ops", "CRASH", "killed by SIGSEGV", "in KernelsCuda.Attention")
    row(r, "engine", "PASS")
    logs(r, "ops/ops.log", "[ RUN      ] KernelsCuda.Attention")
    check(r, "the crashed test rerun alone with blocking launches",
          any("--gtest_filter=KernelsCuda.Attention" in c and "CUDA_LAUNCH_BLOCKING=1" in c for c in r.calls),
          r.calls)


@case
def gtest_hangs():
    # A hang is killed at its row's limit (3 s here), not rerun, and the next row runs.
    r = run("gtest_hangs", ["--only", "ops,engine", "--row-timeout", "3"], {"FAKE_KERNELS_CUDA_GPU": "hang"})
    common(r, 1, "fail")
    row(r, "ops", "TIMEOUT", "killed at the row's limit of 3 s", "hung in KernelsCuda.Attention")
    row(r, "engine", "PASS")
    check(r, "killed at its limit", r.rows.get("ops", {}).get("seconds", 99) <= 10, r.rows.get("ops"))
    check(r, "a hang is not rerun", len([c for c in r.calls if c.startswith("kernels_cuda_gpu")]) == 1, r.calls)
    gone(r)


@case
def gtest_hangs_ignoring_term():
    r = run("gtest_hangs_ignoring_term", ["--only", "engine", "--row-timeout", "3"],
            {"FAKE_ENGINE_DEVICE_TEST": "hang-hard"})
    common(r, 1, "fail")
    row(r, "engine", "TIMEOUT", "killed at the row's limit of 3 s")
    check(r, "killed (SIGKILL 5 s after SIGTERM)", r.rows.get("engine", {}).get("seconds", 99) <= 15,
          r.rows.get("engine"))
    gone(r)


@case
def gtest_runs_nothing():
    r = run("gtest_runs_nothing", ["--only", "ops"], {"FAKE_KERNELS_CUDA_GPU": "empty"})
    common(r, 1, "fail")
    row(r, "ops", "FAIL", "no test ran")


@case
def deadline():
    # --deadline 20: the hanging row's limit (240 s) is cut to what is left of the 20 s (less 5 s
    # in reserve and the preflight's time), the rows after it are NOTRUN, a failure; the whole
    # run ends within the deadline (and the 5 s between SIGTERM and SIGKILL).
    r = run("deadline", ["--only", "ops,engine,fp32", "--deadline", "20"], {"FAKE_KERNELS_CUDA_GPU": "hang"})
    common(r, 1, "fail")
    row(r, "ops", "TIMEOUT")
    limit = r.rows.get("ops", {}).get("timeout_s", 0)
    check(r, "ops cut to the deadline", 10 <= limit <= 15, limit)
    row(r, "engine", "NOTRUN", "--deadline 20 s")
    row(r, "fp32", "NOTRUN")
    check(r, "counts", r.summary["counts"] == {"TIMEOUT": 1, "NOTRUN": 2}, r.summary["counts"])
    check(r, "ended within the deadline", r.seconds < 20 + 5, f"{r.seconds:.0f} s")
    gone(r)


@case
def training_tolerances():
    # Losses 0.01 apart: over fp32's 1e-3, under bf16's 5e-2.
    r = run("training_tolerances", ["--only", "fp32,bf16"], {"FAKE_KILN": "drift"})
    common(r, 1, "fail")
    row(r, "fp32", "FAIL", "max |dloss| 0.01", "tol 0.001")
    row(r, "bf16", "PASS", "50 steps, max |dloss| 0.01")
    logs(r, "fp32/gpu/metrics.jsonl", '"step": 50')


@case
def training_crashes_and_fails():
    r = run("training_crashes", ["--only", "fp32,resume"], {"FAKE_KILN": "crash-gpu"})
    common(r, 1, "fail")
    row(r, "fp32", "CRASH", "kiln killed by SIGSEGV")
    row(r, "resume", "CRASH", "kiln killed by SIGSEGV")
    r = run("training_fails", ["--only", "bf16,unfused"], {"FAKE_KILN": "fail-gpu"})
    common(r, 1, "fail")
    row(r, "bf16", "FAIL", "training failed")
    row(r, "unfused", "FAIL", "the bf16 row's training failed")  # and is not trained again
    excerpt(r, "bf16", "an illegal memory access")
    logs(r, "bf16/gpu.log", "an illegal memory access")


@case
def speed_unreadable():
    # A speed run whose metrics cannot be read is a failure, not a PASS.
    r = run("speed_unreadable", ["--only", "124m,1.5b"], {"FAKE_KILN_SPEED": "garbage"})
    common(r, 1, "fail")
    row(r, "124m", "FAIL", "its metrics could not be read")
    row(r, "1.5b", "FAIL", "its metrics could not be read")


@case
def dist_rows():
    r = run("dist_no_mpirun", ["--only", "dist-no,nccl"])
    common(r, 0, "pass")
    row(r, "dist-no", "SKIP", "no mpirun")
    row(r, "nccl", "SKIP", "no mpirun")
    check(r, "preflight warns", r.pre.get("mpirun", {}).get("status") == "warn", r.pre.get("mpirun"))
    # A host's own mpirun that cannot start the bundle's libmpi: SKIP with the reason, not FAIL.
    r = run("dist_foreign_mpirun", ["--only", "dist-no,nccl"], {"FAKE_MPIRUN": "broken"}, mpirun=True)
    common(r, 0, "pass")
    row(r, "dist-no", "SKIP", "cannot run 2 CPU ranks of this kiln", "mca_pml_ob1")
    row(r, "nccl", "SKIP", "cannot run 2 CPU ranks of this kiln")
    # An mpirun that works, and a kiln that trains where it must refuse: FAIL. With one GPU
    # the nccl row skips (tests/train_gpu_dist.sh's own reason).
    r = run("dist_no_refusal", ["--only", "dist-no,nccl"], {"FAKE_KILN": "no-refusal"}, mpirun=True)
    common(r, 1, "fail")
    row(r, "dist-no", "FAIL", "exit 1")
    row(r, "nccl", "SKIP", "needs 2 GPUs")
    logs(r, "dist-no/dist-no.log", "expected 2 with key 'device'")


@case
def preflight():
    # Whatever is missing is named before any row runs; the exit code is 1.
    for name, env, smi, libs, item, text in [
        ("preflight_no_driver", {"FAKE_SMI": "broken"}, True, None, "driver", "nvidia-smi failed"),
        ("preflight_no_smi", {}, False, None, "driver", "nvidia-smi failed or is not installed"),
        ("preflight_old_driver", {"FAKE_SMI": "old"}, True, None, "driver", "CUDA 12.4"),
        ("preflight_gpu_memory", {"FAKE_SMI": "lowmem"}, True, None, "gpu-memory", "1000 MiB free"),
        ("preflight_no_cublas", {}, True, NOLIBS, "libcublas", "libcublas.so.13 not found in KILN_CUDA_LIBS"),
    ]:
        r = run(name, ["--only", "ops"], env, smi=smi, libs=libs)
        common(r, 1, "preflight-failed")
        check(r, f"preflight {item} missing", r.pre.get(item, {}).get("status") == "missing", r.pre.get(item))
        check(r, f"preflight {item} says '{text}'", text in r.pre.get(item, {}).get("detail", ""), r.pre.get(item))
        check(r, "no row run", r.rows == {} and not any(r.calls), (r.rows, r.calls))
    r = run("preflight_found_where", ["--only", "ops"])
    check(r, "libcublas found in KILN_CUDA_LIBS", r.pre["libcublas"]["detail"] == LIBS + "/libcublas.so.13",
          r.pre["libcublas"])
    # Without KILN_CUDA_LIBS: CUDA 13's pip wheels (site-packages/nvidia/cu13/lib), found through
    # python3's path, before any toolkit.
    site = os.path.join(TMP, "site")
    wheel = os.path.join(site, "nvidia", "cu13", "lib")
    os.makedirs(wheel)
    for lib in ["libcublas.so.13", "libcublasLt.so.13", "libcuda.so.1"]:
        open(os.path.join(wheel, lib), "w").close()
    r = run("preflight_cuda13_wheels", ["--only", "ops"], {"PYTHONPATH": site}, libs="")
    common(r, 0, "pass")
    for lib in ["libcublas", "libcublasLt"]:
        check(r, f"{lib} found in the CUDA 13 wheel", r.pre[lib]["detail"].startswith(wheel + "/"), r.pre[lib])


@case
def bundle_layout():
    # An unpacked bundle (its own copy of the script, as --bundle makes it): programs from its
    # bin/; its GLIBC_NEEDS against the host's glibc.
    for name, need, rc, result in [("bundle_ok", "2.17", 0, "pass"), ("bundle_glibc", "99.1", 1, "preflight-failed")]:
        b = os.path.join(TMP, name, "kiln-gpu-bundle")
        os.makedirs(os.path.join(b, "configs", "train"))
        shutil.copytree(BIN, os.path.join(b, "bin"))
        shutil.copy(GPU_CHECK, os.path.join(b, "gpu_check"))
        with open(os.path.join(b, "BUNDLE"), "w") as f:
            f.write(f"kiln GPU bundle\ncommit: abc1234\nglibc: {need} or newer\n")
        with open(os.path.join(b, "GLIBC_NEEDS"), "w") as f:
            f.write(f"{need} libstdc++.so.6\n2.14 libfmt.so.9\n")
        open(os.path.join(b, "configs", "train", "tiny.yaml"), "w").close()
        r = run(name, ["--only", "ops,fp32"], script=os.path.join(b, "gpu_check"), bin_dir=os.path.join(b, "bin"))
        common(r, rc, result)
        check(r, "bundle commit in the summary", r.summary["machine"]["bundle"] == "abc1234", r.summary["machine"])
        if rc == 0:
            row(r, "ops", "PASS")
            row(r, "fp32", "PASS")
            check(r, "glibc ok", r.pre["glibc"]["status"] == "ok", r.pre["glibc"])
        else:
            check(r, "glibc missing, naming the file", r.pre["glibc"]["status"] == "missing" and
                  "libstdc++.so.6 (99.1)" in r.pre["glibc"]["detail"] and
                  "libfmt" not in r.pre["glibc"]["detail"], r.pre["glibc"])


@case
def killed_from_outside():
    # The caller's own limit: killed with SIGKILL (the whole process group) mid-row, the report
    # already says which row was running; with SIGTERM, the row is not a PASS and the exit is 1.
    for sig in [signal.SIGKILL, signal.SIGTERM]:
        name = f"killed_{sig.name}"
        p, out, pids = run(name, ["--only", "ops,engine", "--row-timeout", "60"],
                           {"FAKE_KERNELS_CUDA_GPU": "hang"}, start_only=True)
        summary = None
        for _ in range(200):
            time.sleep(0.1)
            try:
                summary = json.load(open(os.path.join(out, "summary.json")))
                if any(r["status"] == "RUNNING" for r in summary["rows"]):
                    break
            except (OSError, ValueError):
                pass
        time.sleep(0.5)
        t0 = time.time()
        os.killpg(p.pid, sig)
        p.communicate(timeout=30)
        r = Run(name, p.returncode, out, time.time() - t0, [],
                open(pids).read().split("\n") if os.path.exists(pids) else [])
        r.leftover = reap(r.pids) if sig != signal.SIGKILL else []  # SIGKILL: its row's group runs on
        if sig == signal.SIGKILL:
            check(r, "summary left, state running", r.summary and r.summary["state"] == "running", r.summary)
            if r.summary:
                row(r, "ops", "RUNNING")
                check(r, "result running", r.summary["result"] == "running")
        else:
            check(r, "exit code 1", r.rc == 1, r.rc)
            check(r, "stopped at once, not at the row's limit", r.seconds < 15, f"{r.seconds:.0f} s")
            gone(r)
            check(r, "summary done, result killed", r.summary and r.summary["state"] == "done" and
                  r.summary["result"] == "killed", r.summary and r.summary["result"])
            if r.summary:
                row(r, "ops", "TIMEOUT", "SIGTERM")
                check(r, "engine not run", "engine" not in r.rows, list(r.rows))
        reap(r.pids)


@case
def usage_errors():
    for name, args in [("usage_row", ["--only", "nosuchrow"]), ("usage_number", ["--deadline", "soon"]),
                       ("usage_cpu_rows", ["--cpu-rows", "--only", "ops"])]:
        out = os.path.join(TMP, name)
        p = subprocess.run([GPU_CHECK] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env={"PATH": SYS})
        if p.returncode != 2:
            failures.append(f"{name}: exit {p.returncode}, want 2: {p.stdout.decode()[-300:]}")
    p = subprocess.run([GPU_CHECK, "--list"], stdout=subprocess.PIPE, env={"PATH": SYS})
    listed = [l.split()[0] for l in p.stdout.decode().splitlines()]
    if p.returncode != 0 or "ops" not in listed or "dist-no" not in listed:
        failures.append(f"--list: exit {p.returncode}: {listed}")


def main():
    names = [n for n in CASES if not ONLY or n in ONLY]
    for name in names:
        print(f"case {name}")
        before = len(failures)
        CASES[name]()
        print(f"  {'ok' if len(failures) == before else 'FAILED'}")
    if failures:
        print(f"\n{len(failures)} checks failed (runs kept in {TMP}):")
        for f in failures:
            print("  " + f)
        sys.exit(1)
    print(f"all {len(names)} cases passed")
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
