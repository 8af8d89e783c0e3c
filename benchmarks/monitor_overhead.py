"""Cost of per-layer statistics: step time with act-RMS collection on every step vs off.

Runs the tiny config in one process and interleaves blocks of steps with
stats on and off (so drift in machine load hits both alike), then prints the
median step time of each and their ratio. Usage:

    python benchmarks/monitor_overhead.py [--steps-per-block 5] [--blocks 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from prores.config import load_config
from prores.launcher.train import Trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps-per-block", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--config", default=None)
    args = parser.parse_args()
    cfg = load_config(args.config, ("logging.progress_bar=false", "train.steps=100000"))
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="prores-bench-")))
    trainer.train_step()  # warm-up
    times = {"stats on": [], "stats off": []}
    for block in range(args.blocks):
        mode = "stats on" if block % 2 == 0 else "stats off"
        cfg.logging.stats_interval = 1 if mode == "stats on" else 10**9
        for _ in range(args.steps_per_block):
            start = time.perf_counter()
            trainer.train_step()
            times[mode].append(time.perf_counter() - start)
    on, off = (statistics.median(times[m]) for m in ("stats on", "stats off"))
    print(f"layers={cfg.model.num_layers} tokens/step={trainer.tokens_per_step}")
    print(f"median step: stats on {on * 1e3:.1f} ms, stats off {off * 1e3:.1f} ms, ratio on/off {on / off:.3f}")


if __name__ == "__main__":
    main()
