"""The training loop's seam: everything that is not the loop itself is a callback.

For every step t -> t+1 the loop calls, in order and on every rank:

* ``pre_step(trainer, t)``: before the step; every block's alpha is that of step t by then.
* ``pre_update(trainer, t)``: inside the step, once the gradients are reduced over data
  parallelism and before the optimizer clips them and updates the weights.
* ``post_step(trainer, t, metrics)``: after it; ``metrics`` describe the update from t to t+1.
* ``pre_eval(trainer, t + 1)`` and ``post_eval(trainer, t + 1, metrics)``: around an evaluation of the model
  after t+1 updates.
* ``pre_checkpoint(trainer, t + 1)`` and ``post_checkpoint(trainer, t + 1, path)``: around a checkpoint of it.

and ``on_start(trainer)`` / ``on_end(trainer, summary)`` around the run (``on_end`` may add to the
summary). A callback ends the run with :meth:`Trainer.request_stop`. Callbacks with a ``name``
keep state across a resume: their ``state_dict()`` goes into every checkpoint. Callbacks run in
list order, so a check that can veto a checkpoint comes before the one that saves.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Optional

from prores.run.progress import Progress
from prores.run.signals import StopSignals, highest_on_any_rank, requeue

EXIT_DIVERGED = 3  # `prores train` exit status of a diverged run
EXIT_LOST_LOCK = 75  # ... of a run that lost its run directory's lock (EX_TEMPFAIL: start it again to resume)


class Callback:
    name: Optional[str] = None  # set by callbacks whose state is checkpointed

    @classmethod
    def from_config(cls, cfg) -> "Callback":
        """How a run builds it (:mod:`prores.monitor.registry`); most callbacks read the config later,
        from ``trainer.cfg``."""
        return cls()

    def on_start(self, trainer) -> None:
        pass

    def pre_step(self, trainer, step: int) -> None:
        pass

    def pre_update(self, trainer, step: int) -> None:
        pass

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        pass

    def pre_eval(self, trainer, step: int) -> None:
        pass

    def post_eval(self, trainer, step: int, metrics: dict) -> None:
        pass

    def pre_checkpoint(self, trainer, step: int) -> None:
        pass

    def post_checkpoint(self, trainer, step: int, path) -> None:
        pass

    def on_end(self, trainer, summary) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ShowProgress(Callback):
    """A bar on a terminal, plain lines in a log (:mod:`prores.run.progress`)."""

    def on_start(self, trainer) -> None:
        cfg = trainer.cfg
        owner = trainer.topo.is_loss_writer
        self.progress = Progress(cfg.train.steps, trainer.step, cfg.train.log_interval,
                                 bar=cfg.logging.progress_bar and owner, quiet=not owner)

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        self.progress.step(step + 1, metrics)

    def post_eval(self, trainer, step: int, metrics: dict) -> None:
        self.progress.write(f"step {step}: valid loss {metrics['valid/loss']:.4f}"
                            f" (unigram entropy {trainer.data.unigram_entropy:.4f})")

    def on_end(self, trainer, summary) -> None:
        self.progress.close()


class StopWhenNonFinite(Callback):
    """``train.on_nonfinite``. A step whose loss or gradient norm is not finite had its update dropped
    by the optimizer (DeepSpeed's overflow check, or :class:`GlobalNormAdamW`'s). ``stop`` ends the run
    there as diverged; ``skip`` goes on, counting ``train/skipped_steps``, until ``train.max_skipped``
    in a row. Loss and gradient norm are the same numbers on every rank (the pipeline broadcasts the
    loss, the norm is global), so all ranks decide alike without talking."""

    name = "nonfinite"

    def __init__(self):
        self.skipped, self.in_a_row = 0, 0
        self.diverged_at: Optional[int] = None

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        cfg = trainer.cfg.train
        loss, norm = metrics["train/loss"], metrics.get("train/grad_norm", 0.0)
        finite = math.isfinite(loss) and math.isfinite(norm)
        self.in_a_row = 0 if finite else self.in_a_row + 1
        self.skipped += not finite
        if not finite and (cfg.on_nonfinite == "stop" or self.in_a_row > cfg.max_skipped):
            self.diverged_at = step
            why = "" if cfg.on_nonfinite == "stop" else f" ({self.in_a_row} non-finite steps in a row)"
            last = trainer.checkpoints.newest_manifest()
            kept = "no checkpoint yet" if last is None else f"the last good checkpoint {last.path} is kept"
            trainer.request_stop("diverged", f"diverged at step {step}{why}: loss {loss:.6g}, grad norm {norm:.6g};"
                                             f" nothing after it is saved, {kept}")
        if step % cfg.log_interval == 0 or step == cfg.steps - 1:
            trainer.writer.loss_scalars({"train/skipped_steps": float(self.skipped)}, step)

    def on_end(self, trainer, summary) -> None:
        summary.diverged_at = self.diverged_at

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.in_a_row = state["skipped"], state["in_a_row"]


class BestValidation(Callback):
    """The lowest validation loss so far and its step, for the summary."""

    name = "best_valid"

    def __init__(self):
        self.loss, self.step = math.inf, None

    def post_eval(self, trainer, step: int, metrics: dict) -> None:
        if metrics["valid/loss"] < self.loss:
            self.loss, self.step = metrics["valid/loss"], step

    def on_end(self, trainer, summary) -> None:
        if self.step is not None:
            summary.best_valid_loss, summary.best_valid_step = self.loss, self.step

    def state_dict(self) -> dict:
        return {"loss": self.loss, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.loss, self.step = state["loss"], state["step"]


class SaveCheckpoints(Callback):
    """``checkpoint.interval`` steps apart, and at the end."""

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        done, interval = step + 1, trainer.cfg.checkpoint.interval
        if trainer.stop_status is None and (done == trainer.cfg.train.steps or (interval and done % interval == 0)):
            trainer.save()


def save_unless_saved(trainer, step: int):
    """The checkpoint of ``step`` completed updates: the one saved at it already, or a new one."""
    newest = trainer.checkpoints.newest_manifest()
    return newest.path if newest is not None and newest.step == step else trainer.save()


class KeepRunLock(Callback):
    """Rank 0 holds ``RUN/lock`` (:mod:`prores.run.lock`); every rank stops after the same step once it is lost.
    Not renewed for half its lease: the run saves a checkpoint while the lease still holds, and stops. Taken over
    by another trainer, or its lease lapsed: every rank exits :data:`EXIT_LOST_LOCK` at once, after one line,
    writing nothing more (no checkpoint, no summary, no event or progress flushed) into a directory that may be
    another's now. Either way ``prores train`` exits with :data:`EXIT_LOST_LOCK`."""

    UNRENEWED, LAPSED = 1, 2

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        if trainer.stop_status is not None:
            return
        lock, code = getattr(trainer, "lock", None), 0
        why = lock.lost() if lock is not None else None
        if why:
            code = self.LAPSED if lock.lapsed() else self.UNRENEWED
        code = highest_on_any_rank(code, trainer.device) if trainer.topo.world_size > 1 else code
        if not code:
            return
        if code == self.LAPSED:
            exit_lapsed(trainer, step, why)
        saved = save_unless_saved(trainer, step + 1)
        why = f"{why}; " + (f"checkpoint {saved} saved" if saved else "no checkpoint of this step could be saved")
        trainer.request_stop("lost_lock", f"stopping after step {step + 1}: {why}")


class StopWhenLapsed(KeepRunLock):
    """:class:`KeepRunLock`'s lapsed case, first of a step's callbacks: a lock taken over or lapsed during the
    step ends every rank before any callback writes anything of it (its scalars, a checkpoint due)."""

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        exit_if_lapsed(trainer, step)


def exit_if_lapsed(trainer, step: int) -> None:
    """Every rank exits :data:`EXIT_LOST_LOCK` if rank 0's lock was taken over or lapsed (a collective)."""
    lock = getattr(trainer, "lock", None)
    code = 1 if lock is not None and lock.lapsed() else 0
    if (highest_on_any_rank(code, trainer.device) if trainer.topo.world_size > 1 else code):
        exit_lapsed(trainer, step, lock.lost() if lock is not None else None)


def exiting_lapsed(run_dir) -> str:
    """The end of the one line a lapsed holder says, wherever it stops (here, or in its hang watchdog)."""
    return f"exiting {EXIT_LOST_LOCK} without writing anything more into {run_dir}"


def exit_lapsed(trainer, step: int, why: Optional[str]) -> None:
    trainer.say(f"stopping after step {step + 1}: {why or 'the lock was lost on rank 0'}; "
                f"{exiting_lapsed(trainer.run_dir)}")
    sys.stderr.flush()
    os._exit(EXIT_LOST_LOCK)  # no exit handler, writer thread or buffer may write after this line


class StopOnSignal(Callback):
    """SIGUSR1/SIGTERM (:mod:`prores.run.signals`): all ranks stop after the same step, save, and
    under Slurm the job is requeued."""

    def on_start(self, trainer) -> None:
        self.signals = StopSignals().__enter__()

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        done = step + 1
        if trainer.stop_status is not None or done == trainer.cfg.train.steps:
            return  # every rank knows either alike: no all-reduce needed
        if not self.signals.agreed(trainer.device):
            return
        trainer.say(f"stop signal ({self.signals.received}): stopping after step {done}")
        path = save_unless_saved(trainer, done)
        trainer.say(f"checkpoint {path} saved" if path else "no checkpoint of this step: the run resumes from its"
                                                            " newest one")
        if trainer.topo.rank == 0:
            trainer.say(requeue())
        trainer.request_stop("stopped")

    def on_end(self, trainer, summary) -> None:
        self.signals.__exit__(None, None, None)
