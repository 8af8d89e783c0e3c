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


def check_prefixes(prefixes: Sequence[str]) -> None:
    for prefix in prefixes:
        for ext in (".bin", ".idx"):
            if not Path(f"{prefix}{ext}").is_file():
                raise UsageError(f"indexed dataset '{prefix}': {prefix}{ext} not found; create PREFIX.bin/.idx"
                                 f" with `prores preprocess INPUT... --output-prefix {prefix}`.")


def _gpt_config(prefixes: Sequence[str], weights, tokenizer, seq_length: int, seed: int, cache_dir: Path,
                split: str) -> GPTDatasetConfig:
    check_prefixes(prefixes)
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, split=split, path_to_cache=str(cache_dir),
        blend=(list(prefixes), None if weights is None else [float(w) for w in weights]),
        tokenizer=MegatronTokenizer(tokenizer), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False,
    )
    _check_split_documents(prefixes, config.split_matrix)
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


def _check_split_documents(prefixes: Sequence[str], split_matrix) -> None:
    """Every prefix needs >= 1 document in each used split: with none, megatron-core 0.16.1's
    GPTDataset._get_num_epochs loops forever (0 tokens per epoch)."""
    for prefix in prefixes:
        num_docs = len(IndexedDataset(prefix).document_indices) - 1
        for name, bounds in zip(("train", "valid"), split_matrix[:2]):
            if bounds is None:
                continue
            begin, end = bounds
            if int(round(end * num_docs)) - int(round(begin * num_docs)) < 1:
                raise UsageError(
                    f"indexed dataset '{prefix}' has {num_docs} document(s): its {name} split"
                    f" ({(end - begin) * 100:.0f}%) gets none. Split the input into more documents"
                    " (e.g. jsonl lines) or give that split a larger share."
                )


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
