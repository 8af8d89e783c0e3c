"""Packed token streams, a deterministic train/valid split and resumable batch iterators.

Each document ends with the tokenizer's <eod>. The last ``valid_fraction`` of
every document goes to validation, so both splits cover every source. The
streams are cut into windows of ``seq_length + 1`` tokens (input and shifted
label). Training samples are a seeded permutation per epoch, addressed by a
global sample counter: the order depends only on the seed, never on dp, and
the counter alone is the data position to save and restore.
"""

from __future__ import annotations

from prores.errors import UsageError

import math
from dataclasses import dataclass

import torch


@dataclass
class Splits:
    train: torch.Tensor  # 1-D int32
    valid: torch.Tensor

    def unigram_entropy(self) -> float:
        """Entropy (nats/token) of the train split's token frequencies: the no-context baseline."""
        counts = torch.bincount(self.train.long()).double()
        p = counts[counts > 0] / counts.sum()
        return float(-(p * p.log()).sum())


def split_documents(docs: list[str], tokenizer, valid_fraction: float) -> Splits:
    eod = torch.tensor([tokenizer.eod], dtype=torch.int32)
    train, valid = [], []
    for doc in docs:
        ids = tokenizer.encode(doc)
        cut = len(ids) - math.floor(len(ids) * valid_fraction)
        train += [ids[:cut], eod]
        if cut < len(ids):
            valid += [ids[cut:], eod]
    return Splits(torch.cat(train), torch.cat(valid) if valid else torch.zeros(0, dtype=torch.int32))


class PackedSamples:
    """Non-overlapping windows of ``seq_length + 1`` tokens (neighbours share one token)."""

    def __init__(self, tokens: torch.Tensor, seq_length: int):
        self.tokens, self.seq_length = tokens, seq_length
        self.count = max(0, (len(tokens) - 1) // seq_length)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        start = i * self.seq_length
        return self.tokens[start: start + self.seq_length + 1]

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        windows = torch.stack([self[int(i)] for i in indices]).long()
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class TrainBatches:
    """Endless iterator of this data-parallel rank's micro-batches, (inputs, labels) of [b, s]."""

    def __init__(self, samples: PackedSamples, micro_batch_size: int, seed: int, dp_rank: int = 0,
                 dp_size: int = 1):
        if len(samples) == 0:
            raise UsageError("the training split is shorter than one sequence; lower model.seq_length.")
        self.samples, self.micro, self.seed = samples, micro_batch_size, seed
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.consumed = 0  # global samples handed out, over all dp ranks
        self._perm_epoch, self._perm = -1, None

    def _sample(self, index: int) -> int:
        epoch, offset = divmod(index, len(self.samples))
        if epoch != self._perm_epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._perm_epoch = torch.randperm(len(self.samples), generator=gen), epoch
        return int(self._perm[offset])

    def global_indices(self, start: int, count: int) -> list[int]:
        return [self._sample(i) for i in range(start, start + count)]

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.consumed + self.dp_rank * self.micro
        self.consumed += self.micro * self.dp_size
        return self.samples.batch(self.global_indices(start, self.micro))

    def state_dict(self) -> dict:
        return {"consumed": self.consumed, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed:
            raise UsageError(f"data state was saved with seed {state['seed']}, this run uses {self.seed}")
        self.consumed = state["consumed"]


def valid_batches(samples: PackedSamples, micro_batch_size: int, num_batches: int, dp_rank: int = 0,
                  dp_size: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``num_batches`` global validation batches in order, this rank's share of each."""
    per_step = micro_batch_size * dp_size
    usable = min(num_batches, len(samples) // per_step)
    if usable == 0:
        raise UsageError(
            f"the validation split has {len(samples)} sequences, fewer than one batch of {per_step};"
            " raise data.valid_fraction or lower train.micro_batch_size."
        )
    return [samples.batch(range(k * per_step + dp_rank * micro_batch_size,
                                k * per_step + (dp_rank + 1) * micro_batch_size)) for k in range(usable)]
