"""Learning-rate schedules as pure functions of the step: a multiplier on ``optim.lr``."""

from __future__ import annotations

import math
from typing import Callable


def _warmup(step: int, warmup: int) -> float:
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def wsd(step: int, total: int, warmup: int, min_ratio: float, decay_fraction: float) -> float:
    """Warmup, stable, then a linear decay over the last ``decay_fraction`` of training."""
    decay_steps = int(round(total * decay_fraction))
    decay_start = total - decay_steps
    if step < warmup:
        return _warmup(step, warmup)
    if decay_steps == 0 or step < decay_start:
        return 1.0
    return 1.0 - (1.0 - min_ratio) * min(1.0, (step - decay_start + 1) / decay_steps)


def cosine(step: int, total: int, warmup: int, min_ratio: float, decay_fraction: float) -> float:
    if step < warmup:
        return _warmup(step, warmup)
    progress = min(1.0, (step - warmup + 1) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def constant(step: int, total: int, warmup: int, min_ratio: float, decay_fraction: float) -> float:
    return _warmup(step, warmup)


LR_SCHEDULES: dict[str, Callable[[int, int, int, float, float], float]] = {
    "wsd": wsd,
    "cosine": cosine,
    "constant": constant,
}
