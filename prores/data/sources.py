"""The run's data, from the ``data`` config section to batches.

There is one pipeline: indexed datasets through Megatron's builders, in two stages.

:func:`resolve_sources` and :func:`check_sources` need no process group, so
`prores train` runs them first, on every rank: each source becomes an indexed
prefix, a raw one (``data.corpus`` when ``data.paths`` is empty, or a text file
in ``data.eval``) being preprocessed once into ``cache_dir`` by whichever
process gets there first, and too little data is found from the ``.idx`` files
alone. :func:`build_run_data` then builds Megatron's datasets, whose index
caches go to ``cache_dir`` too, so data directories may be read-only.
``cache_dir`` must be visible to every rank (on several nodes: a shared file
system, as for checkpoints).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from prores.data.batches import TrainBatches, check_enough, check_eval_samples, fixed_batches, unigram_entropy
from prores.data.corpus import SHAKESPEARE, corpus_files
from prores.data.indexed import (IndexedSamples, build_eval_dataset, build_gpt_datasets, check_prefixes, check_splits,
                                 eval_windows)
from prores.data.preprocess import preprocess


@contextlib.contextmanager
def _one_at_a_time(lock: Path):
    """Processes sharing a cache take turns. Only to save repeated work: correctness never rests on
    the lock (preprocess writes private temporaries and renames them into place), so a file system
    without locks merely lets every process preprocess, alike."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        with contextlib.suppress(OSError):
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:  # a waiter holds its own handle; an empty cache directory can then be removed
            lock.unlink(missing_ok=True)


def is_raw(source: str) -> bool:
    return source == SHAKESPEARE or Path(source).is_file()


def cached_prefix(source: str, tokenizer_spec: str, json_key: str, cache_dir: Path) -> str:
    """Raw text ``source`` as an indexed prefix in ``cache_dir``, preprocessed once."""
    files = corpus_files(source)
    # Keyed by the inputs' names, sizes and times: an edited file is preprocessed again.
    key = json.dumps([tokenizer_spec, json_key] + [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns)
                                                    for f in files])
    prefix = cache_dir / "text" / f"{Path(source).stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if not Path(f"{prefix}.idx").is_file():
        with _one_at_a_time(prefix.with_name(prefix.name + ".lock")):
            if not Path(f"{prefix}.idx").is_file():
                preprocess([str(f) for f in files], str(prefix), json_key=json_key, tokenizer=tokenizer_spec,
                           progress=False)
    return str(prefix)


@dataclass(frozen=True)
class Sources:
    train: list[str]  # indexed prefixes, blended for the train and valid splits
    evals: dict[str, str]  # eval set name -> indexed prefix


def resolve_sources(d, cache_dir: Path) -> Sources:
    """Every source of the ``data`` section as an indexed prefix that exists."""

    def prefix(source: str, key: str) -> str:
        if is_raw(source):
            return cached_prefix(source, d.tokenizer, d.json_key, cache_dir)
        check_prefixes([source], key)
        return source

    train = [prefix(p, "data.paths") for p in d.paths] if d.paths else [prefix(d.corpus, "data.corpus")]
    return Sources(train=train, evals={name: prefix(s, f"data.eval.{name}") for name, s in d.eval.items()})


def check_sources(sources: Sources, d, *, seq_length: int, batch: int) -> None:
    """Enough data for the run, from the ``.idx`` files: every train prefix has sequences in the train
    and valid splits, every eval set ``data.eval_samples`` windows, a multiple of ``batch``
    (micro-batch x dp)."""
    check_eval_samples(d.eval_samples, batch)
    check_splits(sources.train, d.split)
    for name, prefix in sources.evals.items():
        check_enough(eval_windows(prefix, seq_length), d.eval_samples, f"data.eval.{name} ({d.eval[name]})")


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
    sources = resolve_sources(d, cache_dir)
    train, valid = build_gpt_datasets(sources.train, d.weights or None, tokenizer, seq_length=seq_length, seed=seed,
                                      cache_dir=cache_dir, num_train=train_samples, num_valid=d.eval_samples,
                                      split=d.split)
    train = IndexedSamples(train)

    def batches(samples, what):
        return fixed_batches(samples, micro_batch_size, d.eval_samples, dp_rank, dp_size, what)

    evals = {}
    for name, prefix in sources.evals.items():
        dataset = build_eval_dataset(prefix, tokenizer, seq_length=seq_length, seed=seed, cache_dir=cache_dir)
        evals[name] = batches(IndexedSamples(dataset), f"data.eval.{name} ({d.eval[name]})")
    return RunData(train=TrainBatches(train, micro_batch_size, seed, dp_rank, dp_size),
                   valid=batches(IndexedSamples(valid), "the validation split (data.split)"),
                   evals=evals, unigram_entropy=unigram_entropy(train))
