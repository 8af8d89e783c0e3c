"""Training samples from Megatron indexed datasets (``PREFIX.bin`` / ``PREFIX.idx``).

Megatron-core does the work: ``BlendedMegatronDatasetBuilder`` builds one
``GPTDataset`` per prefix (its index caches go to ``cache_dir``, so the data
directory may be read-only) and blends them by weight. Rank 0 builds the
caches first and the others load them (the builder's own protocol when
torch.distributed is initialised). GPTDataset shuffles with the seed, so the
sample order is fixed by (data, seed, sizes). :class:`IndexedSamples` exposes
a dataset as batches by sample index, which
:class:`prores.data.batches.TrainBatches` addresses by a global counter:
dp-invariant and resumable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.blended_megatron_dataset_config import (convert_split_vector_to_split_matrix,
                                                                    parse_and_normalize_split)
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset

from prores.errors import UsageError


class MegatronTokenizer:
    """What GPTDataset reads of a tokenizer: eod, pad, vocab size, and the identity it hashes into
    its cache names. (Megatron's MegatronLegacyTokenizer base logs a deprecation warning on every build.)"""

    def __init__(self, tokenizer):
        self.vocab_size, self.eod = tokenizer.vocab_size, tokenizer.eod
        self.pad = getattr(tokenizer, "pad", -1)  # -1: megatron-core's own "no pad token"
        self.unique_identifiers = {"class": "prores", "tokenizer_path": [tokenizer.name]}


def check_prefixes(prefixes: Sequence[str], key: str = "data.paths") -> None:
    for prefix in prefixes:
        missing = [ext for ext in (".bin", ".idx") if not Path(f"{prefix}{ext}").is_file()]
        if len(missing) == 2:
            raise UsageError(f"{key}: '{prefix}' is neither a file nor an indexed dataset ({prefix}.bin/.idx);"
                             " give a .txt, .md or .jsonl file, or make the dataset with"
                             f" `prores preprocess INPUT... --output-prefix {prefix}`.")
        if missing:
            raise UsageError(f"{key}: indexed dataset '{prefix}': {prefix}{missing[0]} not found; create"
                             f" PREFIX.bin/.idx with `prores preprocess INPUT... --output-prefix {prefix}`.")


def _gpt_config(prefixes: Sequence[str], weights, tokenizer, seq_length: int, seed: int, cache_dir: Path,
                split: str) -> GPTDatasetConfig:
    check_prefixes(prefixes)
    check_splits(prefixes, split)
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, split=split, path_to_cache=str(cache_dir),
        blend=(list(prefixes), None if weights is None else [float(w) for w in weights]),
        tokenizer=MegatronTokenizer(tokenizer), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False,
    )
    return config


def build_gpt_datasets(prefixes: Sequence[str], weights: Optional[Sequence[float]], tokenizer, *, seq_length: int,
                       seed: int, cache_dir: Path, num_train: int, num_valid: int, split: str = "95,5,0"):
    """(train, valid) blended GPT datasets with at least ``num_train`` / ``num_valid`` samples."""
    config = _gpt_config(prefixes, weights, tokenizer, seq_length, seed, cache_dir, split)
    # Sizes must be 0, not None, for an unused split when weights are given.
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_train, num_valid, 0], lambda: True,
                                                    config).build()
    return train, valid


def build_eval_dataset(prefix: str, tokenizer, *, seq_length: int, seed: int, cache_dir: Path):
    """All of one indexed dataset as a held-out set: one epoch, no sample repeated."""
    config = _gpt_config([prefix], None, tokenizer, seq_length, seed, cache_dir, "100,0,0")
    return BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()[0]


def check_splits(prefixes: Sequence[str], split: str) -> None:
    """Every prefix needs >= 1 sequence in the train and valid splits: with none, megatron-core 0.16.1's
    GPTDataset._get_num_epochs loops forever (0 tokens per epoch). GPTDataset splits a dataset by
    sequence (one per document, or per 1 MB piece of a long text file), as counted here."""
    split_matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    for prefix in prefixes:
        dataset = IndexedDataset(prefix)  # alive while its mmap'd arrays are read
        num = len(dataset.sequence_lengths)
        for name, bounds in zip(("train", "valid"), split_matrix[:2]):
            if bounds is None:
                continue
            begin, end = bounds
            if int(round(end * num)) - int(round(begin * num)) < 1:
                raise UsageError(
                    f"indexed dataset '{prefix}' has {num} sequence(s) (a document each, or 1 MB of a long"
                    f" text file): its {name} split ({(end - begin) * 100:.0f}%, data.split={split!r}) gets none."
                    " Give it more documents (e.g. jsonl lines, or several text files) or that split a larger share."
                )


def eval_windows(prefix: str, seq_length: int) -> int:
    """Samples in one epoch of a whole dataset, as GPTDataset counts them: each window reads
    seq_length + 1 tokens (add_extra_token_to_sequence), windows overlap by that one token."""
    dataset = IndexedDataset(prefix)  # alive while its mmap'd arrays are read
    return max(int(dataset.sequence_lengths.sum()) - 1, 0) // seq_length


class IndexedSamples:
    """A Megatron dataset seen as samples addressed by index, batched as (inputs, labels) [b, s]."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        samples = [self.dataset[int(i)] for i in indices]
        return (torch.stack([s["tokens"] for s in samples]).long(),
                torch.stack([s["labels"] for s in samples]).long())
