"""``RUN/summary.json``: what a finished run leaves for people and for tools (strict JSON: null, never NaN)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from prores.run.files import write_atomic

SUMMARY = "summary.json"


@dataclass
class Summary:
    status: str  # completed, stopped (by a signal), diverged, or lost_lock (never written: see KeepRunLock)
    steps: int
    final_valid_loss: Optional[float]  # the last evaluation's
    unigram_entropy: float
    parameters: int  # of the whole model, each counted once
    # tokens of the steps this process trained / train_seconds; None when it trained none (a resume
    # at the last step)
    tokens_per_sec: Optional[float]
    # the median over the second half of those steps, each step's train_batch alone: the steady state
    steady_tokens_per_sec: Optional[float]
    train_seconds: float  # wall time of this process's training loop, evaluations and checkpoints included
    diverged_at: Optional[int] = None  # the step whose loss or gradient norm was not finite
    best_valid_loss: Optional[float] = None
    best_valid_step: Optional[int] = None
    config: str = "config.yaml"  # the resolved config, next to this file ...
    config_sha256: Optional[str] = None  # ... and the hash of its text
    spikes: dict = field(default_factory=dict)  # per series: count, steps and score (prores.monitor.spikes)
    faults: list = field(default_factory=list)  # every fault the run survived (prores.run.watchdog.faults)
    restarts: int = 0  # starts that a launcher's restart made (torchrun --max-restarts, a Slurm requeue)

    def write(self, run_dir: Path) -> None:
        finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in asdict(self).items()}
        write_atomic(run_dir / SUMMARY, json.dumps(finite, indent=2, allow_nan=False))


def read_summary(run_dir: Path) -> Optional[dict]:
    """A run directory's summary, or None where there is none (yet) or it cannot be read."""
    try:
        return json.loads((Path(run_dir) / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
