"""The data loader's share of a training step (goal: under 2%).

Runs the tiny config (or ``--config``) in one process and times, within the
same steps, the calls that fetch micro-batches from the indexed dataset
against the whole ``train_step``. Usage:

    python benchmarks/data_loader.py [--steps 30] [--config configs/tiny.yaml]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from prores.config import load_config
from prores.launcher.train import Trainer


class Timed:
    """Wraps the batch iterator and adds up the time spent producing batches."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def __iter__(self):
        return self

    def __getattr__(self, name):  # the data position (``consumed``) and the rest, from the real iterator
        return getattr(self.inner, name)

    def __next__(self):
        start = time.perf_counter()
        batch = next(self.inner)
        self.seconds += time.perf_counter() - start
        return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--config", default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, repeatable (the smoke test's tiny model)")
    args = parser.parse_args()
    cfg = load_config(args.config, ("logging.progress_bar=false", *args.set))
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="prores-bench-")))
    trainer.train_step()  # warm-up (compilation)
    timed = trainer.data.train = Timed(trainer.data.train)
    start = time.perf_counter()
    for _ in range(args.steps):
        trainer.train_step()
    total = time.perf_counter() - start
    print(f"{args.steps} steps, {trainer.tokens_per_step} tokens/step: step {total / args.steps * 1e3:.1f} ms,"
          f" data {timed.seconds / args.steps * 1e3:.3f} ms, data share {timed.seconds / total:.2%}")


if __name__ == "__main__":
    main()
