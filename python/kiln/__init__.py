"""Kiln's data loader for Python: stream a `kiln prep` dataset into a training loop.

    import kiln
    loader = kiln.Loader("OUT", seq_len=1024, micro_batch=8, weights={"web": 0.7, "code": 0.3})
    for batch in loader:                 # endless: every rank gets exactly one batch per step
        batch.tokens                     # numpy uint32 [micro_batch, seq_len + 1], no copy
        batch.domain                     # numpy int32 [micro_batch], index into loader.domains
        batch.doc_starts                 # per row, the offsets where a document begins
        loader.set_weights({"web": 0.5, "code": 0.5})   # from the next batch on
        state = loader.state_dict()      # plain JSON-able data; load_state_dict(state) resumes

Each data-parallel rank reads a disjoint part of every domain; batches, mixing and state are
exactly those of `kiln stream` and `kiln train` for the same settings (docs/LOADER.md). The
reading, decompression and packing run in C++ threads without the GIL; `next()` releases the
GIL while it waits. `kiln.torch` wraps a Loader as a `torch.utils.data.IterableDataset`.

Errors carry the C++ message: ValueError (bad options, weights or state), FileNotFoundError (no
dataset there), kiln.DataError (a damaged dataset: the message names shard and member), OSError.
"""
import json
import os
import sys

from ._core import Batch, DataError  # noqa: F401  (re-exported)
from . import _core

__all__ = ["Loader", "Batch", "DataError", "merge_states", "dist_rank_world"]


def dist_rank_world():
    """(rank, world) of this process: from torch.distributed when it is initialised, else from
    the RANK / WORLD_SIZE variables that torchrun (torch.distributed.run) sets, else (0, 1)."""
    torch = sys.modules.get("torch")  # never import torch just to ask
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        try:
            return int(rank), int(world)
        except ValueError:
            raise ValueError("RANK=%r / WORLD_SIZE=%r are not integers" % (rank, world)) from None
    return 0, 1


def _state_texts(state):
    """A state_dict() (one rank, or merged), a list of the state_dict()s of all ranks, or the JSON
    text of either (e.g. a `kiln train` checkpoint's data_state) -> list of JSON texts."""
    if isinstance(state, (str, bytes)):
        text = state.decode() if isinstance(state, bytes) else state
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError("load_state_dict: not JSON: %s" % e) from None
        return _state_texts(parsed)
    if isinstance(state, dict):
        return [json.dumps(state)]
    if isinstance(state, (list, tuple)):
        if not state:
            raise ValueError("load_state_dict: an empty list of states")
        if not all(isinstance(s, dict) for s in state):
            raise ValueError("load_state_dict: a list of states must hold one state_dict() per rank")
        return [json.dumps(s) for s in state]
    raise TypeError("load_state_dict: expected a state_dict() (dict), a list of them, or JSON "
                    "text, got %s" % type(state).__name__)


class Loader:
    """Batches of one data-parallel rank of a `kiln prep` dataset, endlessly.

    dataset      the output folder of `kiln prep` (or its manifest.json)
    seq_len      tokens per sequence; each row holds seq_len + 1 (inputs [:-1], targets [1:])
    micro_batch  sequences per batch (per rank)
    global_batch sequences per optimizer step over all ranks (micro_batch x world x gradient
                 accumulation); None: micro_batch x world. The same global_batch gives the same
                 global batches (Batch.global_rows) at every world size dividing `partitions`
    partitions   canonical partitions; None: global_batch (docs/LOADER.md)
    repartition  load a state whose partitions this world does not divide, in another order
    seed         shuffles and mixture decisions; the same on every rank
    weights      {domain: weight}, normalised; domains not named get 0. None: the manifest's
                 token shares
    rank, world  data-parallel rank and size. None: see dist_rank_world() (torch.distributed,
                 then RANK / WORLD_SIZE, then 0 / 1). Tensor-parallel peers pass the same rank.
    workers      C++ threads that read, decompress and pack shards
    prefetch     batches assembled ahead
    split        "train", or "val" for the validation shards of `kiln prep`'s split settings
    skip_bad_shards   skip (count, log) unreadable shards instead of raising DataError
    verify_checksums  check each shard's XXH3 against the manifest before using it
    sample_ids   read each document's input id, for Batch.samples (costs a JSON parse per sample)
    """

    def __init__(self, dataset, *, seq_len, micro_batch, seed=0, weights=None, rank=None,
                 world=None, workers=2, prefetch=4, split="train", skip_bad_shards=False,
                 verify_checksums=True, sample_ids=False, global_batch=None, partitions=None,
                 repartition=False):
        if rank is None or world is None:
            auto_rank, auto_world = dist_rank_world()
            rank = auto_rank if rank is None else rank
            world = auto_world if world is None else world
        dataset = os.fspath(dataset)
        if weights is not None:
            weights = dict(weights)
        self._rank, self._world = int(rank), int(world)
        self._core = _core.Loader(
            dataset, seq_len=seq_len, micro_batch=micro_batch, seed=seed, weights=weights,
            rank=self._rank, world=self._world, workers=workers, prefetch=prefetch, split=split,
            skip_bad_shards=skip_bad_shards, verify_checksums=verify_checksums,
            sample_ids=sample_ids, global_batch=int(global_batch or 0),
            partitions=int(partitions or 0), repartition=bool(repartition))
        self.dataset = dataset
        self.seq_len = int(seq_len)
        self.micro_batch = int(micro_batch)

    # ---- iteration ---------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        """The next Batch (blocks, without the GIL, until it is ready). Never StopIteration: the
        loader starts each domain's next epoch when one ends."""
        return self._core.next()

    next = __next__

    # ---- mixing -------------------------------------------------------------------------------
    @property
    def domains(self):
        """Domain names in id order (Batch.domain indexes this list)."""
        return self._core.domains

    @property
    def weights(self):
        """Normalised weights in effect for the next batch, every domain named."""
        return self._core.weights

    def set_weights(self, weights):
        """Replaces the weights from the next batch on (normalised; domains not named get 0).
        Invalid weights (unknown domain, negative or non-finite, all zero) raise ValueError and
        change nothing. The change is part of state_dict()."""
        self._core.set_weights(dict(weights))

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self):
        """The position after the last batch returned, as plain JSON-able data (the format of
        `kiln stream --state-out` and of `kiln train` checkpoints)."""
        return json.loads(self._core.state_json())

    def load_state_dict(self, state):
        """Continues exactly after the batch a state was taken at. `state` is this rank's
        state_dict() (same world size), a merged state, or a list of the state_dict()s of every
        rank of a run — then any world size continues the epochs in progress with no sample
        repeated or skipped. JSON text of either is accepted too. The state's seed and weights
        history replace the constructor's; call set_weights() afterwards to change them.
        Prefetched batches are discarded. ValueError when the state does not fit this dataset."""
        self._core.restore_json(_state_texts(state))

    # ---- the rest -----------------------------------------------------------------------------
    @property
    def rank(self):
        return self._rank

    @property
    def world(self):
        return self._world

    def stats(self):
        """Counters: step, tokens, shards_read, tar_bytes, skipped_shards, wait_ms_total, and per
        domain epoch and sequences."""
        return self._core.stats()

    def close(self):
        """Stops the worker threads now (otherwise when the Loader is garbage-collected)."""
        self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        raise TypeError("a kiln.Loader cannot be pickled or sent to another process (its prefetch "
                        "runs in threads of this one): open one per process, and carry its "
                        "position with state_dict() / load_state_dict()")

    def __repr__(self):
        return "kiln.Loader(%r, seq_len=%d, micro_batch=%d, rank=%d, world=%d)" % (
            self.dataset, self.seq_len, self.micro_batch, self._rank, self._world)


def merge_states(states):
    """The merged state of a list of every rank's state_dict() (what load_state_dict does with
    a list), for saving one elastic checkpoint. Needs no dataset: the states are combined as
    they are."""
    texts = _state_texts(list(states))
    return json.loads(_core.merge_states(texts))
