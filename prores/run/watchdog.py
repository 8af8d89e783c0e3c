"""A hang watchdog in every rank, and the record of a run's faults and restarts.

A rank that waits too long for progress is a hung job: a peer stopped in a collective, a dead file system, a
deadlocked data worker. Each rank runs a thread that knows the phase the rank is in (the first step, a step, an
evaluation, a checkpoint save) and since when; each phase has its bound (``train.hang_timeout`` and the longer
ones of the first step, an evaluation, a save). Past it, the rank

* writes every thread's Python stack to ``RUN/hangs/step<N>-rank<k>.txt`` (``faulthandler``, which reads the
  stacks even of a thread blocked in C++: a waiting rank shows which collective it waits in),
* prints one line naming rank, host, pid, step, phase and seconds waited,
* records the fault under ``RUN/faults/`` and exits with :data:`EXIT_HUNG`, so that the launcher ends the
  others (and, given ``--max-restarts``, restarts them: they resume from the newest good checkpoint).

A stopped rank cannot write its own stacks: its peers, left waiting on it, write theirs.

The callback also keeps the run's record of starts and faults (:mod:`prores.run.faults`) and a budget of
restarts.

nvidia-resiliency-ext's ``ft_launcher`` was tried first (issue 26's note says why it is not used).
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from prores.errors import UsageError
from prores.run.callbacks import Callback
from prores.run.faults import (PROGRESS, read_json, append_attempt, faults, launcher_job, read_attempts,
                               record_fault, restart_count, restarts)
from prores.run.files import write_atomic
from prores.run.signals import highest_on_any_rank

EXIT_HUNG = 124  # `prores train` exit status of a rank that found the run hung (as timeout(1)'s)
HANGS = "hangs"


class Watchdog:
    """``bounds``: seconds per phase (0: unbounded). :meth:`enter` moves the rank to a phase."""

    def __init__(self, bounds: dict, run_dir: Path, rank: int, progress: bool = False):
        self.bounds, self.run_dir, self.rank = bounds, Path(run_dir), rank
        # (phase, step, since): one attribute, replaced whole, so the thread never reads a new phase with an old
        # start (a step bound against the first step's minutes)
        self.state = ("first step", 0, time.monotonic())
        self.progress = progress  # this rank writes RUN/progress.json (the step it reached, once a second)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="prores-watchdog", daemon=True)

    def start(self, step: int) -> "Watchdog":
        self.enter("first step", step)
        self._thread.start()
        return self

    @property
    def phase(self) -> str:
        return self.state[0]

    def enter(self, phase: str, step: int) -> None:
        self.state = (phase, step, time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        bounded = [b for b in self.bounds.values() if b]
        poll = min([1.0] + [b / 20 for b in bounded])
        written = None
        while not self._stop.wait(poll):
            phase, step, since = self.state
            waited = time.monotonic() - since
            if self.progress and step != written:
                write_atomic(self.run_dir / PROGRESS, json.dumps({"step": step, "time": time.time()}))
                written = step
            bound = self.bounds.get(phase, 0)
            if bound and waited > bound:
                self._hung(phase, step, waited)

    def _hung(self, phase: str, step: int, waited: float) -> None:
        host, pid = socket.gethostname(), os.getpid()
        hangs = self.run_dir / HANGS
        hangs.mkdir(parents=True, exist_ok=True)
        stacks = hangs / f"step{step}-rank{self.rank}.txt"
        with open(stacks, "w") as fh:
            fh.write(f"rank {self.rank} on {host}, pid {pid}: step {step}, phase {phase}, no progress for"
                     f" {waited:.0f} s (bound {self.bounds[phase]:g} s)\n\n")
            fh.flush()
            faulthandler.dump_traceback(fh, all_threads=True)
        record_fault(self.run_dir, {"kind": "hang", "step": step, "rank": self.rank, "host": host, "pid": pid,
                                    "phase": phase, "detect_s": round(waited, 3), "stacks": str(stacks)})
        print(f"prores: error: rank {self.rank} on {host} (pid {pid}) hung at step {step}: no progress in phase"
              f" '{phase}' for {waited:.0f} s (bound {self.bounds[phase]:g} s); stacks in {stacks}; exiting"
              f" {EXIT_HUNG}", file=sys.stderr, flush=True)
        os._exit(EXIT_HUNG)


class WatchForHangs(Callback):
    """The watchdog's phases from the loop's hooks; rank 0 records each start and clean end in
    ``RUN/attempts.jsonl`` and refuses a start once ``train.max_restarts_without_progress`` restarts in a row
    of one launcher job resumed from the same checkpoint (looping on a fault that every restart meets)."""

    def on_start(self, trainer) -> None:
        cfg, t = trainer.cfg, trainer.topo
        self.start_time = time.time()
        spent = self._budget_spent(trainer) if t.rank == 0 else None
        if t.world_size > 1 and highest_on_any_rank(1 if spent else 0, trainer.device) and not spent:
            spent = "rank 0 stops the run: its restarts are spent"  # every rank stops alike; rank 0 says why
        if spent:
            raise UsageError(spent)
        if t.rank == 0:
            self._previous_reached(trainer.run_dir)
            append_attempt(trainer.run_dir, {"event": "start", "time": self.start_time, "step": trainer.step,
                                             "job": launcher_job(), "restart": restart_count(),
                                             "host": socket.gethostname()})
        bound = cfg.train.hang_timeout
        self.dog = None
        if bound:
            self.dog = Watchdog({"first step": cfg.train.hang_timeout_first_step, "step": bound,
                                 "eval": cfg.train.hang_timeout_eval, "save": cfg.checkpoint.save_timeout},
                                trainer.run_dir, t.rank, progress=t.rank == 0).start(trainer.step)

    def _previous_reached(self, run_dir: Path) -> None:
        """How far the previous start got (``RUN/progress.json``, written once a second): its steps lost if it
        ended in a fault that left no record."""
        progress = read_json(Path(run_dir) / PROGRESS)
        starts = [a for a in read_attempts(run_dir) if a["event"] == "start"]
        if progress and starts and starts[-1]["time"] <= progress["time"]:
            append_attempt(run_dir, {"event": "reached", "start_time": starts[-1]["time"], "step": progress["step"],
                                     "time": progress["time"]})

    @staticmethod
    def _budget_spent(trainer) -> Optional[str]:
        """Why this start must not run (its launcher job restarted too often without a new checkpoint), or None."""
        budget = trainer.cfg.train.max_restarts_without_progress
        job = launcher_job()
        mine = [a for a in read_attempts(trainer.run_dir) if a["event"] == "start" and a["job"] == job]
        if budget and len(mine) >= budget + 1 and all(a["step"] == trainer.step for a in mine[-budget:]):
            return (f"{budget} restarts in a row resumed from step {trainer.step} and saved no new checkpoint:"
                    f" stopping instead of looping (train.max_restarts_without_progress). See"
                    f" {trainer.run_dir / HANGS} and the log for the fault; run again once it is fixed.")
        return None

    def _enter(self, phase: str, step: int) -> None:
        if self.dog:
            self.dog.enter(phase, step)

    def pre_step(self, trainer, step: int) -> None:
        if self.dog and self.dog.phase == "save":  # a save that failed has no post_checkpoint
            self._enter("step", step)

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        self._enter("step", step + 1)  # the first step's bound ends here; the next step's time starts

    def pre_eval(self, trainer, step: int) -> None:
        self.before = self.dog.phase if self.dog else None  # the first step's bound goes on after a resume's eval
        self._enter("eval", step)

    def post_eval(self, trainer, step: int, metrics: dict) -> None:
        self._enter(self.before, step)

    def pre_checkpoint(self, trainer, step: int) -> None:
        self._enter("save", step)

    def post_checkpoint(self, trainer, step: int, path) -> None:
        self._enter("step", step)

    def on_end(self, trainer, summary) -> None:
        if self.dog:
            self.dog.stop()
        if trainer.topo.rank == 0 and summary.status in ("completed", "stopped", "diverged"):
            append_attempt(trainer.run_dir, {"event": "ended", "start_time": self.start_time, "time": time.time(),
                                             "status": summary.status, "step": trainer.step})
        summary.faults = faults(trainer.run_dir)
        summary.restarts = restarts(trainer.run_dir)
