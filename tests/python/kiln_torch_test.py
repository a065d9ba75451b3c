#!/usr/bin/python3
"""kiln.torch.Dataset with Debian's python3-torch:

- through torch.utils.data.DataLoader(batch_size=None, num_workers=0) it yields exactly the
  kiln.Loader's batches as tensors (tokens as torch.long or, without a copy, torch.int32;
  domain; position_ids; doc_starts);
- the state_dict() / load_state_dict() protocol: a DataLoader over a Dataset restored from a
  checkpoint (saved with torch.save) continues with exactly the batches of an uninterrupted run;
- set_weights reaches the next batch; DataLoader(num_workers=2) fails with a message that says
  what to do instead of reading copies in worker processes.

usage: kiln_torch_test.py FIXTURE_BINARY WORK_DIR   (PYTHONPATH=build/python)
"""
import io
import os
import shutil
import subprocess
import sys
import unittest

import numpy as np
import torch
import torch.utils.data

import kiln
import kiln.torch

FIXTURE, WORK = sys.argv[1:3]
DATA = os.path.join(WORK, "data")


def setUpModule():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    subprocess.run([FIXTURE, DATA], check=True)


ARGS = dict(seq_len=16, micro_batch=4, seed=3, weights={"web": 0.6, "code": 0.4})


class TorchDataset(unittest.TestCase):
    def test_same_batches_as_the_loader(self):
        ref = kiln.Loader(DATA, **ARGS)
        data = kiln.torch.Dataset(DATA, **ARGS)
        self.assertIsInstance(data, torch.utils.data.IterableDataset)
        for k, item in enumerate(torch.utils.data.DataLoader(data, batch_size=None)):
            b = next(ref)
            self.assertEqual(item["step"], k)
            self.assertEqual(item["tokens"].dtype, torch.long)
            self.assertEqual(tuple(item["tokens"].shape), (4, 17))
            self.assertTrue(np.array_equal(item["tokens"].numpy(), b.tokens.astype(np.int64)))
            self.assertEqual(item["domain"].tolist(), b.domain.tolist())
            self.assertTrue(np.array_equal(item["position_ids"].numpy(), b.position_ids))
            self.assertEqual([s.tolist() for s in item["doc_starts"]],
                             [s.tolist() for s in b.doc_starts])
            if k == 20:
                break

    def test_int32_tokens_share_memory(self):
        data = kiln.torch.Dataset(DATA, dtype=torch.int32, position_ids=False, **ARGS)
        ref = kiln.Loader(DATA, **ARGS)
        item = next(iter(data))
        self.assertEqual(item["tokens"].dtype, torch.int32)
        self.assertNotIn("position_ids", item)
        self.assertTrue(np.array_equal(item["tokens"].numpy(), next(ref).tokens.astype(np.int32)))
        with self.assertRaises(ValueError):
            kiln.torch.Dataset(DATA, dtype=torch.float32, **ARGS)

    def test_checkpoint_resume_through_dataloader(self):
        def run(data, steps):
            out = []
            for item in torch.utils.data.DataLoader(data, batch_size=None):
                out.append(item["tokens"].clone())
                if len(out) == steps:
                    break
            return out

        whole = run(kiln.torch.Dataset(DATA, **ARGS), 30)
        data = kiln.torch.Dataset(DATA, **ARGS)
        head = run(data, 11)
        buf = io.BytesIO()
        torch.save({"data": data.state_dict()}, buf)
        data.close()
        buf.seek(0)
        resumed = kiln.torch.Dataset(DATA, seq_len=16, micro_batch=4, workers=1)
        resumed.load_state_dict(torch.load(buf)["data"])
        tail = run(resumed, 19)
        self.assertEqual(len(head + tail), 30)
        for k, (a, b) in enumerate(zip(whole, head + tail)):
            self.assertTrue(torch.equal(a, b), "step %d" % k)

    def test_set_weights(self):
        data = kiln.torch.Dataset(DATA, **ARGS)
        it = iter(torch.utils.data.DataLoader(data, batch_size=None))
        next(it)
        data.set_weights({"code": 1})
        self.assertEqual(data.weights, {"code": 1.0, "web": 0.0})
        self.assertEqual(next(it)["domain"].tolist(), [data.domains.index("code")] * 4)
        with self.assertRaises(ValueError):
            data.set_weights({"nope": 1})

    def test_worker_processes_are_refused(self):
        data = kiln.torch.Dataset(DATA, **ARGS)
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2)
        with self.assertRaisesRegex(RuntimeError, "num_workers=0"):
            next(iter(loader))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
