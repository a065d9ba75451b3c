"""kiln.torch: a kiln.Loader as a torch.utils.data.IterableDataset.

    import kiln.torch
    data = kiln.torch.Dataset("OUT", seq_len=1024, micro_batch=8)   # rank/world from torch.distributed
    loader = torch.utils.data.DataLoader(data, batch_size=None)    # num_workers=0: C++ prefetches
    for batch in loader:
        x, y = batch["tokens"][:, :-1], batch["tokens"][:, 1:]
        ...
        ckpt = {"model": model.state_dict(), "data": data.state_dict()}   # or loader's, below
    data.load_state_dict(ckpt["data"])        # continues exactly after the saved batch

Each item is one batch (already batched: use batch_size=None) as a dict of tensors:
  tokens        [micro_batch, seq_len + 1], dtype `dtype` (torch.long by default; torch.int32
                shares the loader's memory without a copy)
  domain        [micro_batch] long, an index into Dataset.domains
  position_ids  [micro_batch, seq_len + 1] long: position within the document, reset at every
                document start (and at the row start)
  doc_starts    a list of micro_batch int32 tensors: where documents begin in each row
  step          the batch's 0-based step (int)

The Dataset follows the state_dict() / load_state_dict() protocol of stateful data loaders
(torchdata's StatefulDataLoader asks the dataset when num_workers=0). Read it only from the
process that made it: DataLoader(num_workers > 0) would copy it into worker processes, so it
raises there with a message instead.
"""
import numpy as np
import torch
import torch.utils.data

import kiln

__all__ = ["Dataset"]


class Dataset(torch.utils.data.IterableDataset):
    """An endless IterableDataset of kiln batches; the arguments are those of kiln.Loader, plus
    `dtype` for the tokens and `position_ids` (False: leave them out)."""

    def __init__(self, dataset, *, seq_len, micro_batch, dtype=torch.long, position_ids=True,
                 **loader_args):
        super().__init__()
        if dtype not in (torch.long, torch.int32):
            raise ValueError("dtype must be torch.long or torch.int32, got %s" % (dtype,))
        self.loader = kiln.Loader(dataset, seq_len=seq_len, micro_batch=micro_batch,
                                  **loader_args)
        self.dtype = dtype
        self.position_ids = position_ids

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None:
            raise RuntimeError(
                "kiln.torch.Dataset is read in a DataLoader worker process (num_workers=%d): use "
                "DataLoader(dataset, batch_size=None, num_workers=0) - the reading, "
                "decompression and packing already run in C++ threads, and the state_dict() of a "
                "worker's copy would not be the one you checkpoint" % info.num_workers)
        return self

    def __next__(self):
        b = next(self.loader)
        # NumPy converts in one C loop; torch.from_numpy then wraps without a copy (torch 1.13
        # has no uint32: ids < 2**31, so the int32 view holds the same values).
        if self.dtype == torch.long:
            tokens = torch.from_numpy(b.tokens.astype(np.int64))
        else:
            tokens = torch.from_numpy(b.tokens.view(np.int32))
        item = {
            "tokens": tokens,
            "domain": torch.from_numpy(b.domain.astype(np.int64)),
            "doc_starts": [torch.from_numpy(s) for s in b.doc_starts],
            "step": b.step,
        }
        if self.position_ids:
            item["position_ids"] = torch.from_numpy(b.position_ids.astype(np.int64))
        return item

    # The stateful protocol and mixing, forwarded to the loader.
    def state_dict(self):
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self.loader.load_state_dict(state)

    def set_weights(self, weights):
        self.loader.set_weights(weights)

    @property
    def weights(self):
        return self.loader.weights

    @property
    def domains(self):
        return self.loader.domains

    def close(self):
        self.loader.close()
