"""The run's data, from the ``data`` config section to batches.

There is one pipeline: indexed datasets through Megatron's builders. A raw
source (``data.corpus`` when ``data.paths`` is empty, or a text file named in
``data.eval``) is first preprocessed into ``cache_dir`` by rank 0 while the
others wait; the dataset index caches go to ``cache_dir`` too, so data
directories may be read-only. ``cache_dir`` must be visible to every rank
(on several nodes: a shared file system, as for checkpoints).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch.distributed as dist

from prores.data.batches import TrainBatches, fixed_batches, unigram_entropy
from prores.data.corpus import corpus_files
from prores.data.indexed import IndexedSamples, build_eval_dataset, build_gpt_datasets
from prores.data.preprocess import preprocess
from prores.errors import UsageError


def rank0_first(work: Callable[[], None]) -> None:
    """Run ``work`` on rank 0 only; every rank returns after it, or raises its UsageError."""
    if not dist.is_initialized():
        return work()
    failure = [None]
    if dist.get_rank() == 0:
        try:
            work()
        except UsageError as exc:
            failure = [str(exc)]
    dist.broadcast_object_list(failure, src=0)  # the barrier, carrying rank 0's error if any
    if failure[0] is not None:
        raise UsageError(failure[0])


def is_prefix(path: str) -> bool:
    return Path(f"{path}.idx").is_file() or Path(f"{path}.bin").is_file()


def cached_prefix(source: str, tokenizer_spec: str, json_key: str, cache_dir: Path) -> str:
    """``source`` (an indexed prefix, or raw text preprocessed once into ``cache_dir``) as a prefix."""
    if is_prefix(source):
        return source
    files = corpus_files(source)
    # Keyed by the inputs' names, sizes and times: an edited file is preprocessed again.
    key = json.dumps([tokenizer_spec, json_key] + [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns)
                                                    for f in files])
    prefix = cache_dir / "text" / f"{Path(source).stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def work() -> None:
        if not Path(f"{prefix}.idx").is_file():
            preprocess([str(f) for f in files], str(prefix), json_key=json_key, tokenizer=tokenizer_spec,
                       progress=False)

    rank0_first(work)
    return str(prefix)


@dataclass
class RunData:
    train: TrainBatches
    valid: list  # fixed (inputs, labels) batches, this rank's share
    evals: dict[str, list]
    unigram_entropy: float  # of the training distribution, nats/token


def build_run_data(data_cfg, tokenizer, *, seq_length: int, micro_batch_size: int, train_samples: int,
                   seed: int, cache_dir: Path, dp_rank: int = 0, dp_size: int = 1) -> RunData:
    """``train_samples``: global samples the run will draw (steps x global batch)."""
    d = data_cfg
    prefixes = [cached_prefix(p, d.tokenizer, d.json_key, cache_dir) for p in d.paths or [d.corpus]]
    eval_samples = d.eval_batches * micro_batch_size * dp_size
    train, valid = build_gpt_datasets(prefixes, d.weights or None, tokenizer, seq_length=seq_length, seed=seed,
                                      cache_dir=cache_dir, num_train=train_samples, num_valid=eval_samples,
                                      split=d.split)
    train = IndexedSamples(train)

    def batches(samples, what):
        return fixed_batches(samples, micro_batch_size, d.eval_batches, dp_rank, dp_size, what)

    evals = {}
    for name, source in d.eval.items():
        prefix = cached_prefix(source, d.tokenizer, d.json_key, cache_dir)
        dataset = build_eval_dataset(prefix, tokenizer, seq_length=seq_length, seed=seed, cache_dir=cache_dir)
        evals[name] = batches(IndexedSamples(dataset), f"data.eval.{name} ({source})")
    return RunData(train=TrainBatches(train, micro_batch_size, seed, dp_rank, dp_size),
                   valid=batches(IndexedSamples(valid), "the validation split (data.split)"),
                   evals=evals, unigram_entropy=unigram_entropy(train))
