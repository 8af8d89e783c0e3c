"""What the step benchmarks share (not a benchmark itself): a trainer that never reaches its end or an evaluation
by itself, and rounds in which every arm runs side by side."""

from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path
from typing import Callable


def machine() -> str:
    """The CPU, its vector width and the threads, as a kept printout names them: a figure depends on the machine."""
    import torch

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                platform.processor() or platform.machine())
    avx512 = "with" if " avx512f" in info else "without"
    threads = torch.get_num_threads()
    return f"{name} ({avx512} AVX-512), torch {torch.__version__}, {threads} thread{'s' * (threads != 1)}"


def benchmark_trainer(config, *overrides: str):
    """``(cfg, Trainer)`` for ``config`` with ``overrides`` on top (later ones win), in a fresh run directory."""
    from prores.config import load_config
    from prores.launcher.train import Trainer

    cfg = load_config(config, ("logging.progress_bar=false", "train.steps=100000", "train.eval_interval=100000",
                               *overrides))
    return cfg, Trainer(cfg, Path(tempfile.mkdtemp(prefix="prores-bench-")))


def interleaved(arms: dict[str, Callable[[int], object]], rounds: int, steps: int,
                tokens_per_step: int) -> dict[str, list[float]]:
    """Each arm's tokens/s in each round: ``arm(steps)`` of every arm in turn, the order rotated so that each arm
    leads an equal share of the rounds. A round's arms run side by side, so a ratio per round is what a shared
    machine's drift in load leaves alone."""
    names, rates = list(arms), {name: [] for name in arms}
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            start = time.perf_counter()
            arms[name](steps)
            rates[name].append(steps * tokens_per_step / (time.perf_counter() - start))
    return rates
