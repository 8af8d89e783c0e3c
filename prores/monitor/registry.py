"""Every callback a run can use, by name, in the order they run; ``train.callbacks`` picks which.

The order matters and is stated here only: what logs a step runs before what may veto its checkpoint
(a divergence), which runs before the save, which runs before a stop signal's save-and-exit. A run
calls its callbacks in this order whatever the order of its ``train.callbacks`` list.

Names and import paths only, so that ``prores.config`` validates the list without importing torch;
a class is imported when a run builds it (:func:`build_callbacks`).
"""

from __future__ import annotations

import contextlib
import importlib

CALLBACKS = {
    "lock_lapse": ("prores.run.callbacks:StopWhenLapsed", "first: a run whose lock was taken over or lapsed during a"
                                                          " step exits 75 before anything of the step is written"),
    "run_record": ("prores.run.record:RecordRun", "rank 0 records each start, its progress and its clean end"
                                                  " (RUN/attempts.jsonl, progress.json), refuses a job's start once"
                                                  " its restarts make no progress; faults and restarts in the summary"),
    "hang_watchdog": ("prores.run.watchdog:WatchForHangs", "train.hang_timeout: a rank with no progress for it writes"
                                                           " its stacks to RUN/hangs/ and exits 124"),
    "scalars": ("prores.monitor.run_scalars:LogScalars",
                "train/*, valid/*, eval/* and prores/alpha/* in TensorBoard"),
    "spikes": ("prores.monitor.spikes:SpikeScores", "loss and grad-norm spike scores (monitor.spike_*)"),
    "layer_stats": ("prores.monitor.layer_stats:LayerDiagnostics",
                    "layers/* per block every logging.stats_interval steps"),
    "heatmaps": ("prores.monitor.heatmaps:Heatmaps", "layer x step images of act RMS, grad norm and alpha"),
    "progress": ("prores.run.callbacks:ShowProgress", "a progress bar on a terminal, plain lines in a log"),
    "best_valid": ("prores.run.callbacks:BestValidation", "the best validation loss and its step, in the summary"),
    "nonfinite": ("prores.run.callbacks:StopWhenNonFinite", "train.on_nonfinite: stop or skip a non-finite step"),
    "checkpoint": ("prores.run.callbacks:SaveCheckpoints", "a checkpoint every checkpoint.interval steps and at"
                                                           " the end"),
    "run_lock": ("prores.run.callbacks:KeepRunLock", "stop after the same step on every rank once the run directory's"
                                                     " lock is lost (exit 75)"),
    "signals": ("prores.run.callbacks:StopOnSignal", "SIGUSR1/SIGTERM: every rank saves after the same step and"
                                                     " exits (Slurm: requeue)"),
}


# the callbacks that only watch (the others act: progress, best validation, divergence, checkpoints, signals)
MONITORS = ("scalars", "spikes", "layer_stats", "heatmaps")


def callback_class(name: str) -> type:
    module, cls = CALLBACKS[name][0].split(":")
    return getattr(importlib.import_module(module), cls)


@contextlib.contextmanager
def without_monitors(trainer):
    """The trainer's steps with only the callbacks that act, and without the diagnostics' forward hooks: what a
    run costs apart from watching it (the benchmarks' arms without monitors). All come back after."""
    every = trainer.callbacks
    hooked = [c for c in every if isinstance(c, callback_class("layer_stats"))]
    for c in hooked:
        c.on_end(trainer, None)
    watching = tuple(callback_class(name) for name in MONITORS)
    trainer.callbacks = [c for c in every if not isinstance(c, watching)]
    try:
        yield
    finally:
        trainer.callbacks = every
        for c in hooked:
            c.on_start(trainer)


def build_callbacks(cfg) -> list:
    """The callbacks ``train.callbacks`` names, built from ``cfg``, in the registry's order."""
    return [callback_class(name).from_config(cfg) for name in CALLBACKS if name in cfg.train.callbacks]
