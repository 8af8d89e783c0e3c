"""Micro-batches addressed by a global sample counter: dp-invariant and resumable.

``samples`` is anything with ``len()`` and ``batch(indices) -> (inputs,
labels)`` (:class:`prores.data.indexed.IndexedSamples`). Its order is already
shuffled (GPTDataset does that with the seed), so sample i of the run is
``samples[i]``: the order depends only on the data and the seed, never on dp,
and the counter alone is the data position to save and restore.
"""

from __future__ import annotations

import torch

from prores.errors import UsageError


class TrainBatches:
    """Endless iterator of this data-parallel rank's micro-batches, (inputs, labels) of [b, s]."""

    def __init__(self, samples, micro_batch_size: int, seed: int, dp_rank: int = 0, dp_size: int = 1):
        if len(samples) == 0:
            raise UsageError("the training split is shorter than one sequence; lower model.seq_length.")
        self.samples, self.micro, self.seed = samples, micro_batch_size, seed
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.consumed = 0  # global samples handed out, over all dp ranks

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.consumed + self.dp_rank * self.micro
        self.consumed += self.micro * self.dp_size
        # Past the end (a run extended beyond the steps the dataset was built for) it wraps around.
        return self.samples.batch([i % len(self.samples) for i in range(start, start + self.micro)])

    def state_dict(self) -> dict:
        return {"consumed": self.consumed, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["seed"] != self.seed:
            raise UsageError(f"data state was saved with seed {state['seed']}, this run uses {self.seed}")
        self.consumed = state["consumed"]


def check_eval_samples(num_samples: int, batch: int) -> None:
    """Evaluations see the same ``data.eval_samples`` samples in every layout, so they must fill whole
    global batches of ``batch`` = micro-batch x dp."""
    if num_samples % batch:
        raise UsageError(f"data.eval_samples={num_samples} is not a multiple of the evaluation batch of {batch}"
                         " (train.micro_batch_size x data-parallel size); every layout must evaluate the same"
                         f" samples: pick a multiple of {batch}.")


def check_enough(available: int, num_samples: int, what: str) -> None:
    if available < num_samples:
        raise UsageError(f"{what} has {available} sequences, fewer than data.eval_samples={num_samples};"
                         " give it more text or lower data.eval_samples.")


def fixed_batches(samples, micro_batch_size: int, num_samples: int, dp_rank: int = 0, dp_size: int = 1,
                  what: str = "the validation split") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``num_samples`` samples as global batches of micro-batch x dp, this rank's share of each."""
    per_step = micro_batch_size * dp_size
    check_eval_samples(num_samples, per_step)
    check_enough(len(samples), num_samples, what)
    return [samples.batch(range(k * per_step + dp_rank * micro_batch_size,
                                k * per_step + (dp_rank + 1) * micro_batch_size))
            for k in range(num_samples // per_step)]


def unigram_entropy(samples, max_samples: int = 1024) -> float:
    """Entropy (nats/token) of the token frequencies in the first samples: the no-context baseline."""
    tokens, _ = samples.batch(range(min(len(samples), max_samples)))
    counts = torch.bincount(tokens.flatten()).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())
