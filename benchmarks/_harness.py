"""What the step benchmarks share (not a benchmark itself): a trainer that never reaches its end or an evaluation
by itself, rounds in which every arm runs side by side, and a timer of a step's phases."""

from __future__ import annotations

import collections
import contextlib
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


class Phases:
    """Seconds in each named phase of the steps run while ``counting``, and how many steps."""

    def __init__(self, counting: bool = True):
        self.seconds, self.steps, self.counting = collections.Counter(), 0, counting

    def reset(self) -> None:
        self.seconds.clear()
        self.steps = 0

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.counting:
                self.seconds[name] += time.perf_counter() - start

    def timed(self, name: str, f):
        def run(*args, **kwargs):
            with self(name):
                return f(*args, **kwargs)

        return run

    def per_step(self, digits: int = 1) -> str:
        """ms a step in each phase; the whole step, where timed as "step", shows as what the others leave:
        "other"."""
        ms = {name: s / self.steps * 1e3 for name, s in self.seconds.items()}
        if "step" in ms:
            ms["other"] = ms.pop("step") - sum(ms.values())
        return ", ".join(f"{name} {v:.{digits}f}" for name, v in ms.items())
