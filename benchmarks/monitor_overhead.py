"""Cost of watching a run: training time with every monitoring callback on against all of them off
(goal: at most 1.03x).

"On" is what a default run has: TensorBoard scalars with alpha every step here (train.log_interval=1),
spike scores, the per-layer diagnostics at ``logging.stats_interval=10`` and the heatmaps refreshed at
every evaluation; "off" removes those four callbacks (prores/monitor/registry.py's MONITORS) and the
diagnostics' forward hooks. Both arms keep the callbacks that act (checkpoint interval, divergence,
signals, best validation) and evaluate every 10 steps on 16 samples, so the heatmaps are redrawn 10 times
as often as at the default evaluation interval of 100: an upper bound on their cost.

The heatmaps' painter draws on a thread of its own, resting between pictures (prores/monitor/heatmaps.py): the
picture it is drawing when an on block ends is waited for and charged to that block, and it draws nothing
during the off blocks, so its work falls on the on arm only.

Runs the tiny config (or ``--config``) in one process through the training loop's own step and
interleaves blocks of 10 steps with the monitors on and off, so that drift in the machine's load hits
both alike; prints the median block time of each and their ratio, and the ms a step each monitor's own hooks
took in the on blocks, timed around them: unlike the ratio of two noisy arms, it says which monitor costs what (the
diagnostics' forward statistics run inside the blocks' forward and are not in it). It does so at 12 and at 48 blocks
(``--layers``), each in its own process. Usage:

    python benchmarks/monitor_overhead.py [--blocks 12] [--layers 12 48] [--config configs/tiny.yaml]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time

from _harness import Phases, benchmark_trainer, machine

from prores.monitor.heatmaps import Painter, heatmap, rgb, series_matrix
from prores.monitor.registry import MONITORS, callback_class, without_monitors
from prores.study.intervals import Spread

INTERVAL = 10
STEP_HOOKS = ("pre_step", "pre_update", "post_step", "pre_eval", "post_eval")


def time_the_monitors(trainer, phases: Phases) -> None:
    """Each monitor's step hooks timed into ``phases`` under its registry name."""
    names = {callback_class(name): name for name in MONITORS}
    for callback in trainer.callbacks:
        if type(callback) in names:
            for hook in STEP_HOOKS:
                setattr(callback, hook, phases.timed(names[type(callback)], getattr(callback, hook)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 48], help="model.num_layers, a case each")
    parser.add_argument("--config", default=None)
    parser.add_argument("--without", nargs="+", default=[], choices=MONITORS,
                        help="leave these monitors out of the on arm too: what each of the others costs")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config overrides, repeatable (the smoke test's tiny model)")
    args = parser.parse_args()
    if len(args.layers) > 1:  # a process per case: one Trainer a process, as prores train has
        for layers in args.layers:  # the same arguments; the last --layers is the one argparse keeps
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--layers", str(layers)], check=True)
        return
    cfg, trainer = benchmark_trainer(args.config, "train.log_interval=1", f"train.eval_interval={INTERVAL}",
                                     "data.eval_samples=16", f"logging.stats_interval={INTERVAL}",
                                     f"model.num_layers={args.layers[0]}", *args.set)
    left_out = tuple(callback_class(name) for name in args.without)
    trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, left_out)]
    heatmaps = next((c for c in trainer.callbacks if isinstance(c, callback_class("heatmaps"))), None)
    trainer.call("on_start")
    painter = heatmaps.painter if heatmaps else Painter(None)  # without heatmaps: one that never draws
    for _ in range(INTERVAL):  # warm-up (compilation), monitors included
        trainer.step_once()
    hooks = Phases()  # the off blocks run without the monitors: what it counts is the on blocks'
    time_the_monitors(trainer, hooks)
    times = {"on": [], "off": []}
    for block in range(args.blocks):
        mode = "on" if block % 2 == 0 else "off"
        with without_monitors(trainer) if mode == "off" else contextlib.nullcontext():
            start = time.perf_counter()
            for _ in range(INTERVAL):
                trainer.step_once()
            if mode == "on":  # the picture being drawn is the on block's; the painter waits out the off block
                painter.pause()
            times[mode].append(time.perf_counter() - start)
        if mode == "off":
            painter.resume()
    if args.blocks % 2:  # ended on an on block
        painter.resume()
    hooks.steps = len(times["on"]) * INTERVAL
    on, off = (statistics.median(times[m]) for m in ("on", "off"))
    on_label = "every monitor on" + (f" but {', '.join(args.without)}" if args.without else "")
    print(f"layers={cfg.model.num_layers} tokens/step={trainer.tokens_per_step} kernels={trainer.backend}"
          f" stats_interval={INTERVAL},"
          f" an evaluation and a heatmap refresh every {cfg.train.eval_interval} steps, on {machine()}")
    spread = Spread.of(times["on"][:len(times["off"])], times["off"])  # an on block and the off block after it
    print(f"median time of {INTERVAL} steps: {on_label} {on * 1e3:.0f} ms, all off {off * 1e3:.0f} ms,"
          f" ratio on/off {spread.text()} (the blocks' 10th to 90th percentile)")
    print(f"ms a step in each monitor's own hooks, on blocks: {hooks.per_step(digits=2)}")
    if heatmaps:
        refresh = []
        for _ in range(3):  # what one evaluation's heatmap redraw costs, with the run's own series
            start = time.perf_counter()
            heatmaps.post_eval(trainer, trainer.step, {})
            refresh.append(time.perf_counter() - start)
        start = time.perf_counter()
        pictures = [rgb(heatmap(*series_matrix(s, cfg.model.num_layers), title="", xlabel="step", label=""))
                    for s in heatmaps.series.values() if s]
        drawing = time.perf_counter() - start
        print(f"one evaluation's heatmap refresh ({len(pictures)} pictures): {statistics.median(refresh) * 1e3:.0f}"
              f" ms on the training step; drawing them takes {drawing * 1e3:.0f} ms on the painter's thread, which"
              f" rests so as to draw at most {painter.SHARE:.1%} of the time")


if __name__ == "__main__":
    main()
