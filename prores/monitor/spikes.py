"""Loss and gradient-norm spike scores, as the ProRes paper defines them.

A step is a spike when its value lies more than ``monitor.spike_sigma`` standard deviations above
the mean of the previous ``monitor.spike_window`` values (a step is scored once there are
``MIN_HISTORY`` previous values, so short runs are scored too). The score is the share of spike steps
among the steps so far: ``train/loss_spike_score`` and ``train/grad_norm_spike_score``. The windows
are checkpointed, so a resumed run scores as a straight one; the summary lists the spikes.
"""

from __future__ import annotations

import math
from collections import deque

import numpy

from prores.run.callbacks import Callback

MIN_HISTORY = 10  # a standard deviation of fewer values says little
SERIES = ("train/loss", "train/grad_norm")


class SpikeScore:
    def __init__(self, sigma: float, window: int):
        self.sigma, self.window = sigma, window
        self.values: deque = deque(maxlen=window)
        self.steps_seen, self.spikes = 0, []

    def add(self, step: int, value: float) -> bool:
        """Score ``value`` of ``step`` against the window, then let it in (non-finite values are neither)."""
        self.steps_seen += 1
        if not math.isfinite(value):
            return False
        history = numpy.asarray(self.values, dtype=numpy.float64)
        spike = len(history) >= min(MIN_HISTORY, self.window) and value > history.mean() + self.sigma * history.std()
        if spike:
            self.spikes.append(step)
        self.values.append(value)
        return bool(spike)

    @property
    def score(self) -> float:
        return len(self.spikes) / self.steps_seen if self.steps_seen else 0.0

    def state_dict(self) -> dict:
        return {"values": list(self.values), "steps_seen": self.steps_seen, "spikes": list(self.spikes)}

    def load_state_dict(self, state: dict) -> None:
        self.values = deque(state["values"], maxlen=self.window)
        self.steps_seen, self.spikes = state["steps_seen"], list(state["spikes"])


class SpikeScores(Callback):
    """Every rank scores alike (loss and gradient norm are global numbers); the loss writer logs."""

    name = "spikes"

    def __init__(self, sigma: float, window: int):
        self.scores = {tag: SpikeScore(sigma, window) for tag in SERIES}

    @classmethod
    def from_config(cls, cfg) -> "SpikeScores":
        return cls(cfg.monitor.spike_sigma, cfg.monitor.spike_window)

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        for tag, score in self.scores.items():
            if tag in metrics:
                score.add(step, metrics[tag])
        if trainer.log_due(step):
            trainer.writer.loss_scalars({f"{tag}_spike_score": s.score for tag, s in self.scores.items()}, step)

    def on_end(self, trainer, summary) -> None:
        summary.spikes = {tag: {"count": len(s.spikes), "steps": s.spikes, "score": s.score}
                          for tag, s in self.scores.items()}

    def state_dict(self) -> dict:
        return {tag: s.state_dict() for tag, s in self.scores.items()}

    def load_state_dict(self, state: dict) -> None:
        for tag, s in self.scores.items():
            s.load_state_dict(state[tag])
