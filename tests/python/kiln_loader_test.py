#!/usr/bin/python3
"""The Python module `kiln` (python/): kiln.Loader against `kiln stream` and the ground truth.

- batches equal `kiln stream`'s for the same settings (same sample ids, same domains, same order),
  for one rank and for rank 1 of 3, with given and with default weights, and with rank/world from
  RANK / WORLD_SIZE;
- every token of a batch is the truth's (the fixture writes each document's tokens), the NumPy
  views share the batch's memory, doc_starts / position_ids / segment_ids agree with the pieces;
- resume from state_dict() mid-epoch (through JSON, across a weight change) gives exactly the
  batches of an uninterrupted run; the states of 2 ranks continued on 3 ranks hold every token of
  every document of epoch 0 exactly once, each document on one rank;
- set_weights takes effect at the next batch; invalid weights raise ValueError and change nothing;
- errors: FileNotFoundError, ValueError (options, states), kiln.DataError for a damaged shard,
  each with the C++ message; a closed loader, and a loader used after fork(), raise;
- two Python threads reading one loader get every step exactly once.

usage: kiln_loader_test.py KILN_BINARY FIXTURE_BINARY WORK_DIR   (PYTHONPATH=build/python)
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import unittest

import numpy as np

import kiln

KILN, FIXTURE, WORK = sys.argv[1:4]
DATA = os.path.join(WORK, "data")
EOS = 0
TRUTH = {}


def setUpModule():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    subprocess.run([FIXTURE, DATA], check=True)
    with open(os.path.join(DATA, "truth.json")) as f:
        TRUTH.update(json.load(f))


def stream(*args):
    """`kiln stream DATA ...` lines as (step, domain, [ids])."""
    p = subprocess.run([KILN, "stream", DATA] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, check=True, text=True)
    return [(j["step"], j["domain"], j["samples"]) for j in map(json.loads, p.stdout.splitlines())]


def rows(loader, steps):
    """The same (step, domain, [ids]) from a kiln.Loader opened with sample_ids=True."""
    out = []
    for _ in range(steps):
        b = next(loader)
        for d, ids in zip(b.domain, b.samples):
            out.append((b.step, loader.domains[d], ids))
    return out


def tokens_of(loader, steps):
    return [next(loader).tokens.copy() for _ in range(steps)]


class MatchesKilnStream(unittest.TestCase):
    def test_one_rank_with_weights(self):
        got = rows(kiln.Loader(DATA, seq_len=16, micro_batch=4, seed=5,
                               weights={"web": 0.7, "code": 0.3}, sample_ids=True), 40)
        want = stream("--steps", "40", "--seq-len", "16", "--micro-batch", "4", "--seed", "5",
                      "--weights", "web=0.7,code=0.3")
        self.assertEqual(len(want), 160)
        self.assertEqual(got, want)

    def test_rank_1_of_3_default_weights(self):
        got = rows(kiln.Loader(DATA, seq_len=32, micro_batch=3, seed=11, rank=1, world=3,
                               workers=1, prefetch=1, sample_ids=True), 30)
        want = stream("--steps", "30", "--seq-len", "32", "--micro-batch", "3", "--seed", "11",
                      "--world", "3", "--rank", "1")
        self.assertEqual(got, want)
        other = stream("--steps", "30", "--seq-len", "32", "--micro-batch", "3", "--seed", "11",
                       "--world", "3", "--rank", "0")
        self.assertNotEqual(got, other)  # the comparison can tell ranks apart

    def test_rank_world_from_environment(self):
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
        os.environ.update(RANK="1", WORLD_SIZE="2")
        try:
            loader = kiln.Loader(DATA, seq_len=16, micro_batch=2, sample_ids=True)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.assertEqual((loader.rank, loader.world), (1, 2))
        self.assertEqual(rows(loader, 10),
                         stream("--steps", "10", "--seq-len", "16", "--micro-batch", "2",
                                "--world", "2", "--rank", "1"))


class BatchContents(unittest.TestCase):
    def test_tokens_are_the_documents(self):
        loader = kiln.Loader(DATA, seq_len=24, micro_batch=4, seed=3, sample_ids=True)
        self.assertEqual(loader.domains, ["code", "web"])
        starts_seen = 0
        for _ in range(25):
            b = next(loader)
            tokens = b.tokens
            self.assertEqual(tokens.dtype, np.uint32)
            self.assertEqual(tokens.shape, (4, 25))
            self.assertEqual(b.domain.dtype, np.int32)
            self.assertEqual(b.domain.shape, (4,))
            # Views of the batch's own buffer: the same address every time, not a copy.
            self.assertFalse(tokens.flags.owndata)
            self.assertEqual(tokens.ctypes.data, b.tokens.ctypes.data)
            pos, seg = b.position_ids, b.segment_ids
            for r in range(4):
                row = tokens[r]
                pieces, ids = b.pieces[r], b.samples[r]
                self.assertEqual(len(pieces), len(ids))
                at = 0
                starts = []
                for k, ((_, _, epoch, doc_offset, length, seq_offset), doc_id) in enumerate(
                        zip(pieces, ids)):
                    self.assertEqual(seq_offset, at)
                    full = TRUTH[doc_id] + [EOS]
                    self.assertTrue(doc_id.startswith(loader.domains[b.domain[r]] + "-"))
                    self.assertEqual(row[at:at + length].tolist(),
                                     full[doc_offset:doc_offset + length])
                    self.assertEqual(pos[r, at:at + length].tolist(), list(range(length)))
                    self.assertEqual(seg[r, at:at + length].tolist(), [k] * length)
                    if doc_offset == 0:
                        starts.append(at)
                    at += length
                self.assertEqual(at, 25)
                self.assertEqual(b.doc_starts[r].tolist(), starts)
                starts_seen += len(starts)
                for s in starts:  # a document starts right after another's eos
                    if s > 0:
                        self.assertEqual(row[s - 1], EOS)
        self.assertGreater(starts_seen, 50)

    def test_batch_outlives_loader(self):
        loader = kiln.Loader(DATA, seq_len=8, micro_batch=2)
        b = next(loader)
        tokens = b.tokens
        want = tokens.copy()
        loader.close()
        del loader, b
        self.assertEqual(tokens.tolist(), want.tolist())

    def test_samples_need_sample_ids(self):
        b = next(kiln.Loader(DATA, seq_len=8, micro_batch=2))
        with self.assertRaisesRegex(ValueError, "sample_ids=True"):
            b.samples


class Resume(unittest.TestCase):
    ARGS = dict(seq_len=20, micro_batch=3, seed=9, weights={"web": 0.5, "code": 0.5})

    def run_with_change(self, loader, first, steps):
        """Steps first .. first+steps-1, switching weights before step 12 and step 30."""
        out = []
        for step in range(first, first + steps):
            if step == 12:
                loader.set_weights({"web": 0.1, "code": 0.9})
            if step == 30:
                loader.set_weights({"web": 1})
            b = next(loader)
            self.assertEqual(b.step, step)
            out.append((b.tokens.copy(), b.domain.copy()))
        return out

    def test_resume_mid_epoch_is_exact(self):
        whole = self.run_with_change(kiln.Loader(DATA, **self.ARGS), 0, 45)
        for stop in (5, 12, 17, 31):
            first = kiln.Loader(DATA, **self.ARGS)
            head = self.run_with_change(first, 0, stop)
            state = json.loads(json.dumps(first.state_dict()))  # plain JSON-able data
            first.close()
            # Other weights, workers and prefetch: the state's weights and position win.
            fresh = kiln.Loader(DATA, seq_len=20, micro_batch=3, seed=123, workers=1,
                                prefetch=1, weights={"code": 1})
            fresh.load_state_dict(state)
            tail = self.run_with_change(fresh, stop, 45 - stop)
            for k, ((t1, d1), (t2, d2)) in enumerate(zip(whole, head + tail)):
                self.assertTrue(np.array_equal(t1, t2), "stop %d step %d tokens" % (stop, k))
                self.assertTrue(np.array_equal(d1, d2), "stop %d step %d domains" % (stop, k))

    def test_state_text_and_weights_round_trip(self):
        a = kiln.Loader(DATA, **self.ARGS)
        tokens_of(a, 7)
        a.set_weights({"web": 3, "code": 1})
        state = a.state_dict()
        self.assertEqual(state["step"], 7)
        b = kiln.Loader(DATA, **self.ARGS)
        b.load_state_dict(json.dumps(state))  # JSON text, as in a kiln train checkpoint
        self.assertEqual(b.weights, {"web": 0.75, "code": 0.25})
        self.assertEqual(b.state_dict(), state)
        for x, y in zip(tokens_of(a, 5), tokens_of(b, 5)):
            self.assertTrue(np.array_equal(x, y))

    def test_world_2_to_3_every_token_once(self):
        args = dict(seq_len=16, micro_batch=4, seed=4, weights={"web": 0.6, "code": 0.4},
                    sample_ids=True)
        pieces = {}  # (domain, id) -> [(doc_offset, length, rank)] for epoch 0

        def take(loader, steps, tag):
            for _ in range(steps):
                b = next(loader)
                for r in range(b.micro_batch):
                    for (_, _, epoch, off, length, _), doc_id in zip(b.pieces[r], b.samples[r]):
                        if epoch == 0:
                            pieces.setdefault(doc_id, []).append((off, length, tag))

        old = [kiln.Loader(DATA, rank=r, world=2, **args) for r in range(2)]
        for r, loader in enumerate(old):
            take(loader, 9, "old%d" % r)
        states = [loader.state_dict() for loader in old]
        merged = kiln.merge_states(states)
        self.assertEqual(merged["world"], 2)
        self.assertEqual(len(merged["cursors"]), 8)  # partitions: the global batch 2 x 4
        new = []
        for r in range(3):
            # Global batch 12, not 8: the same order cannot continue, so this is the fallback.
            with self.assertRaisesRegex(ValueError, "repartition"):
                kiln.Loader(DATA, rank=r, world=3, **args).load_state_dict(merged)
            loader = kiln.Loader(DATA, rank=r, world=3, repartition=True, **args)
            # Rank 0 gets the list of states, the others the merged state: the same thing.
            loader.load_state_dict(states if r == 0 else merged)
            new.append(loader)
        for r, loader in enumerate(new):
            take(loader, 40, "new%d" % r)
        for doc_id, tokens in TRUTH.items():
            got = sorted(pieces.get(doc_id, []))
            at = 0
            for off, length, _ in got:
                self.assertEqual(off, at, "%s: tokens repeated or skipped: %s" % (doc_id, got))
                at += length
            self.assertEqual(at, len(tokens) + 1, "%s incomplete: %s" % (doc_id, got))
            new_ranks = {tag for _, _, tag in got if tag.startswith("new")}
            self.assertLessEqual(len(new_ranks), 1, "%s read by several new ranks" % doc_id)

    def test_single_rank_state_at_other_world_is_refused(self):
        a = kiln.Loader(DATA, seq_len=16, micro_batch=2, rank=0, world=2)
        next(a)
        # The same global batch (4) on 4 ranks: rank 3 continues partition 3, which rank 0's
        # state does not hold; rank 0 continues partition 0, which it does.
        b = kiln.Loader(DATA, seq_len=16, micro_batch=1, rank=3, world=4, global_batch=4)
        with self.assertRaisesRegex(ValueError, "merged states of all ranks"):
            b.load_state_dict(a.state_dict())
        kiln.Loader(DATA, seq_len=16, micro_batch=1, rank=0, world=4,
                    global_batch=4).load_state_dict(a.state_dict())

    def test_the_same_global_batches_at_every_world_size(self):
        def rows(world, micro_batch, calls):
            out = {}
            for r in range(world):
                loader = kiln.Loader(DATA, seq_len=16, micro_batch=micro_batch, seed=3, rank=r,
                                     world=world, global_batch=8, weights={"web": 1, "code": 1})
                for _ in range(calls):
                    b = next(loader)
                    for i, j in enumerate(b.global_rows):
                        out[(b.step, j)] = (b.tokens[i].tolist(), int(b.domain[i]))
            return out
        ref = rows(1, 8, 12)
        self.assertEqual(len(ref), 96)
        self.assertEqual(rows(2, 4, 12), ref)
        self.assertEqual(rows(4, 2, 12), ref)
        self.assertEqual(rows(2, 2, 24), ref)  # gradient accumulation 2


class KilnTrainCheckpoint(unittest.TestCase):
    def test_data_state_of_a_kiln_train_checkpoint(self):
        """The state_dict format is the one `kiln train` checkpoints: its data_state loads into
        kiln.Loader and continues exactly as `kiln stream --state-in` does from it."""
        run = os.path.join(WORK, "train-run")
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        subprocess.run([KILN, "train", "--config", os.path.join(src, "configs/train/tiny.yaml"),
                        "--set", "data.manifest=" + DATA, "--set", "run.dir=" + run,
                        "--set", "model.vocab_size=512", "--set", "model.d_model=16",
                        "--set", "model.n_layers=1", "--set", "model.n_heads=2",
                        "--set", "model.seq_len=16", "--set", "data.micro_batch=3",
                        "--set", "data.mixture={web: 0.6, code: 0.4}",
                        "--set", "run.steps=6", "--set", "run.seed=13", "--set", "run.threads=1",
                        "--set", "checkpoint.every_steps=6", "--quiet"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(run, "checkpoints", "step-00000006", "state.json")) as f:
            data_state = json.load(f)["data_state"]
        self.assertEqual(json.loads(data_state)["step"], 6)
        state_file = os.path.join(WORK, "train-data-state.json")
        with open(state_file, "w") as f:
            f.write(data_state)
        loader = kiln.Loader(DATA, seq_len=16, micro_batch=3, sample_ids=True)
        loader.load_state_dict(data_state)  # JSON text, as stored in state.json
        self.assertEqual(loader.weights, {"web": 0.6, "code": 0.4})
        self.assertEqual(rows(loader, 12),
                         stream("--steps", "12", "--seq-len", "16", "--micro-batch", "3",
                                "--state-in", state_file))


class Weights(unittest.TestCase):
    def test_set_weights_next_batch(self):
        loader = kiln.Loader(DATA, seq_len=16, micro_batch=8, weights={"web": 1, "code": 1})
        self.assertEqual(loader.weights, {"web": 0.5, "code": 0.5})
        b = next(loader)
        self.assertEqual(set(b.domain.tolist()), {0, 1})
        loader.set_weights({"code": 2})
        self.assertEqual(loader.weights, {"code": 1.0, "web": 0.0})
        for _ in range(5):
            b = next(loader)
            self.assertEqual(b.domain.tolist(), [0] * 8)
        loader.set_weights({"web": np.float32(1), "code": np.int64(0)})  # NumPy numbers work
        self.assertEqual(next(loader).domain.tolist(), [1] * 8)

    def test_invalid_weights_change_nothing(self):
        args = dict(seq_len=16, micro_batch=4, seed=2, weights={"web": 0.7, "code": 0.3})
        ref, loader = kiln.Loader(DATA, **args), kiln.Loader(DATA, **args)
        tokens_of(ref, 3)
        tokens_of(loader, 3)
        bad = [({"webb": 1}, "unknown domain 'webb'.*did you mean 'web'"),
               ({"web": -1}, "finite number >= 0"),
               ({"web": float("nan")}, "finite number >= 0"),
               ({"web": float("inf")}, "finite number >= 0"),
               ({"web": 0, "code": 0}, "sum to more than 0"),
               ({}, "")]
        for weights, message in bad:
            with self.assertRaisesRegex(ValueError, message):
                loader.set_weights(weights)
            self.assertEqual(loader.weights, {"web": 0.7, "code": 0.3})
        with self.assertRaises(TypeError):
            loader.set_weights({1: 0.5})
        with self.assertRaisesRegex(TypeError, "weight of 'web' must be a number, got 'x'"):
            loader.set_weights({"web": "x"})
        self.assertEqual(ref.state_dict(), loader.state_dict())
        for x, y in zip(tokens_of(ref, 6), tokens_of(loader, 6)):
            self.assertTrue(np.array_equal(x, y))


class Errors(unittest.TestCase):
    def test_missing_dataset(self):
        with self.assertRaisesRegex(FileNotFoundError, "no-such-dir"):
            kiln.Loader(os.path.join(WORK, "no-such-dir"), seq_len=8, micro_batch=1)

    def test_bad_options(self):
        for args, message in [(dict(seq_len=0, micro_batch=1), "seq_len"),
                              (dict(seq_len=8, micro_batch=0), "micro_batch"),
                              (dict(seq_len=8, micro_batch=1, rank=2, world=2), "rank"),
                              (dict(seq_len=8, micro_batch=1, workers=0), "workers"),
                              (dict(seq_len=8, micro_batch=1, workers=10**6), "workers"),
                              (dict(seq_len=8, micro_batch=1, prefetch=0), "prefetch"),
                              (dict(seq_len=2**40, micro_batch=1), "seq_len"),
                              (dict(seq_len=8, micro_batch=1, split="test"), "split"),
                              (dict(seq_len=8, micro_batch=1, weights={"x": 1}), "unknown domain"),
                              (dict(seq_len=8, micro_batch=1, weights={}), "no domain")]:
            with self.assertRaisesRegex(ValueError, message):
                kiln.Loader(DATA, **args)

    def test_bad_states(self):
        loader = kiln.Loader(DATA, seq_len=8, micro_batch=1)
        for state, exc, message in [("{not json", ValueError, "not JSON"),
                                    ({"format": "x"}, ValueError, "state_dict"),
                                    ([], ValueError, "empty"),
                                    (3, TypeError, "expected a state_dict")]:
            with self.assertRaisesRegex(exc, message):
                loader.load_state_dict(state)
        other = os.path.join(WORK, "other")  # another dataset: refused by its fingerprint
        subprocess.run([FIXTURE, other, "8"], check=True)
        state = kiln.Loader(other, seq_len=8, micro_batch=1).state_dict()
        with self.assertRaisesRegex(ValueError, "different dataset"):
            loader.load_state_dict(state)
        next(loader)  # still usable

    def test_damaged_shard_is_a_data_error(self):
        bad = os.path.join(WORK, "damaged")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(DATA, bad)
        with open(os.path.join(bad, "manifest.json")) as f:
            manifest = json.load(f)
        victim = manifest["shards"][0]["path"]
        with open(os.path.join(bad, victim), "r+b") as f:
            f.seek(40)
            f.write(b"\xff" * 16)
        loader = kiln.Loader(bad, seq_len=16, micro_batch=4, weights={"code": 1})
        with self.assertRaises(kiln.DataError) as ctx:
            for _ in range(50):
                next(loader)
        self.assertIn(os.path.basename(victim), str(ctx.exception))
        self.assertIsInstance(ctx.exception, RuntimeError)
        with self.assertRaises(kiln.DataError):  # the error repeats; nothing crashes
            next(loader)
        # skip_bad_shards reads on and counts the shard.
        loader = kiln.Loader(bad, seq_len=16, micro_batch=4, weights={"code": 1},
                             skip_bad_shards=True)
        for _ in range(50):
            next(loader)
        self.assertEqual(loader.stats()["skipped_shards"], 1)

    def test_closed(self):
        loader = kiln.Loader(DATA, seq_len=8, micro_batch=1)
        with loader:
            next(loader)
        self.assertTrue(loader._core.closed)
        with self.assertRaisesRegex(ValueError, "closed"):
            next(loader)
        with self.assertRaisesRegex(ValueError, "closed"):
            loader.state_dict()
        loader.close()  # twice is fine

    def test_not_picklable(self):
        import pickle
        loader = kiln.Loader(DATA, seq_len=8, micro_batch=1)
        with self.assertRaisesRegex(TypeError, "state_dict"):
            pickle.dumps(loader)

    def test_after_fork(self):
        loader = kiln.Loader(DATA, seq_len=8, micro_batch=1)
        next(loader)
        pid = os.fork()
        if pid == 0:  # the child: its copy of the loader has no threads
            code = 3
            try:
                next(loader)
            except ValueError as e:
                code = 0 if "another process" in str(e) else 4
            except BaseException:
                code = 5
            del loader
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertTrue(os.WIFEXITED(status), "the child crashed: %d" % status)
        self.assertEqual(os.WEXITSTATUS(status), 0)
        next(loader)  # the parent's loader is untouched


class Threads(unittest.TestCase):
    def test_open_releases_the_gil_while_it_waits(self):
        """manifest.json is a named pipe that this (main) Python thread fills only while another
        Python thread waits in kiln.Loader(...) reading it: if the C++ side held the GIL, this
        thread could never write it and the test would hang (faulthandler ends it after 120 s).
        (Shards must be regular files, so next() cannot be made to wait the same way; it
        releases the GIL through the same PyLoader::call.)"""
        import errno
        import faulthandler
        import fcntl
        slow = os.path.join(WORK, "fifo")
        shutil.rmtree(slow, ignore_errors=True)
        shutil.copytree(DATA, slow)
        manifest = os.path.join(slow, "manifest.json")
        with open(manifest, "rb") as f:
            text = f.read()
        os.remove(manifest)
        os.mkfifo(manifest)
        got = []
        opener = threading.Thread(
            target=lambda: got.append(kiln.Loader(slow, seq_len=16, micro_batch=2)))
        faulthandler.dump_traceback_later(120, exit=True)
        try:
            opener.start()
            fed = False
            while not fed:
                try:  # succeeds once the loader has the pipe open for reading
                    fd = os.open(manifest, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as e:
                    if e.errno != errno.ENXIO:
                        raise
                    opener.join(0.01)
                    continue
                fcntl.fcntl(fd, fcntl.F_SETFL, 0)  # blocking writes from here
                os.write(fd, text)
                os.close(fd)
                fed = True
            opener.join()
        finally:
            faulthandler.cancel_dump_traceback_later()
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0].domains, ["code", "web"])

    def test_two_threads_share_a_loader(self):
        loader = kiln.Loader(DATA, seq_len=16, micro_batch=2, prefetch=1)
        steps, lock = [], threading.Lock()

        def work():
            for _ in range(100):
                b = next(loader)
                loader.state_dict()
                with lock:
                    steps.append(b.step)

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(sorted(steps), list(range(200)))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
