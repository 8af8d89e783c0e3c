"""Training samples from Megatron indexed datasets (``PREFIX.bin`` / ``PREFIX.idx``).

Megatron-core does the work: ``BlendedMegatronDatasetBuilder`` builds one
``GPTDataset`` per prefix (its index caches go to ``cache_dir``, so the data
directory may be read-only) and blends them by weight. Rank 0 builds the
caches first and the others load them (the builder's own protocol when
torch.distributed is initialised). :class:`IndexedSamples` exposes the result
with the same interface as :class:`prores.data.batches.PackedSamples`, so
:class:`prores.data.batches.TrainBatches` addresses it by a global sample
counter: dp-invariant and resumable.

Not yet wired into ``prores train`` (see the issue note): this is the piece
that will replace the in-memory packing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer

from prores.errors import UsageError


class MegatronTokenizer(MegatronLegacyTokenizer):
    """What GPTDataset needs of a tokenizer (eod, pad, vocab size), from one of ours."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer.name)
        self._tok = tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    @property
    def vocab(self):
        raise NotImplementedError("not needed by GPTDataset")

    @property
    def inv_vocab(self):
        raise NotImplementedError("not needed by GPTDataset")

    def tokenize(self, text: str):
        return self._tok.encode(text).tolist()

    @property
    def eod(self) -> int:
        return self._tok.eod

    @property
    def pad(self) -> int:
        return getattr(self._tok, "pad", self._tok.eod)


def check_prefixes(prefixes: Sequence[str]) -> None:
    for prefix in prefixes:
        for ext in (".bin", ".idx"):
            if not Path(f"{prefix}{ext}").is_file():
                raise UsageError(f"indexed dataset '{prefix}': {prefix}{ext} not found; create PREFIX.bin/.idx"
                                 f" with `prores preprocess INPUT... --output-prefix {prefix}`.")


def build_gpt_datasets(prefixes: Sequence[str], weights: Optional[Sequence[float]], tokenizer, *, seq_length: int,
                       seed: int, cache_dir: Path, num_train: int, num_valid: int, split: str = "95,5,0"):
    """(train, valid) blended GPT datasets with at least ``num_train`` / ``num_valid`` samples."""
    check_prefixes(prefixes)
    if weights is not None and len(weights) != len(prefixes):
        raise UsageError(f"data.weights has {len(weights)} entries for {len(prefixes)} data.paths; give one each.")
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, split=split, path_to_cache=str(cache_dir),
        blend=(list(prefixes), None if weights is None else [float(w) for w in weights]),
        tokenizer=MegatronTokenizer(tokenizer), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False,
    )
    _check_split_documents(prefixes, config.split_matrix)
    # Sizes must be 0, not None, for an unused split when weights are given.
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_train, num_valid, 0], lambda: True,
                                                    config).build()
    return train, valid


def _check_split_documents(prefixes: Sequence[str], split_matrix) -> None:
    """Every prefix needs >= 1 document in the train and valid splits: with none, megatron-core
    0.16.1's GPTDataset._get_num_epochs loops forever (0 tokens per epoch)."""
    for prefix in prefixes:
        num_docs = len(IndexedDataset(prefix).document_indices) - 1
        for name, (begin, end) in zip(("train", "valid"), split_matrix[:2]):
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
