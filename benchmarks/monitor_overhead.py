"""Cost of the per-layer diagnostics: training time with all of them on at ``logging.stats_interval=10``
against all off (goal: at most 1.03x).

Runs the tiny config (or ``--config``) in one process through the training loop's own step, with its
callbacks, and interleaves blocks of 10 steps (one stats step each) with the diagnostics on and off,
so that drift in the machine's load hits both alike; prints the median block time of each and their
ratio. "Off" removes the diagnostics callback and its forward hooks. Usage:

    python benchmarks/monitor_overhead.py [--blocks 12] [--config configs/tiny.yaml]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from prores.config import load_config
from prores.launcher.train import Trainer
from prores.monitor.layer_stats import LayerDiagnostics

INTERVAL = 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--config", default=None)
    args = parser.parse_args()
    cfg = load_config(args.config, ("logging.progress_bar=false", "train.steps=100000", "train.eval_interval=100000",
                                    f"logging.stats_interval={INTERVAL}"))
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="prores-bench-")))
    diagnostics = next(c for c in trainer.callbacks if isinstance(c, LayerDiagnostics))
    trainer.call("on_start")
    for _ in range(INTERVAL):  # warm-up (compilation), diagnostics included
        trainer.step_once()
    times = {"on": [], "off": []}
    for block in range(args.blocks):
        mode = "on" if block % 2 == 0 else "off"
        if mode == "off":
            diagnostics.on_end(trainer, None)  # its forward hooks go
            trainer.callbacks.remove(diagnostics)
        start = time.perf_counter()
        for _ in range(INTERVAL):
            trainer.step_once()
        times[mode].append(time.perf_counter() - start)
        if mode == "off":
            trainer.callbacks.append(diagnostics)
            diagnostics.on_start(trainer)
    on, off = (statistics.median(times[m]) for m in ("on", "off"))
    print(f"layers={cfg.model.num_layers} tokens/step={trainer.tokens_per_step} stats_interval={INTERVAL}")
    print(f"median time of {INTERVAL} steps: diagnostics on {on * 1e3:.0f} ms, off {off * 1e3:.0f} ms,"
          f" ratio on/off {on / off:.3f}")


if __name__ == "__main__":
    main()
