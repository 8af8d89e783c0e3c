"""A hang watchdog in every rank.

A rank that waits too long for progress is a hung job: a peer stopped in a collective, a dead file system, a
deadlocked data worker. Each rank runs a thread that knows the phase the rank is in (the first step, a step, an
evaluation, a checkpoint save) and since when; each phase has its bound (``train.hang_timeout`` and the longer
ones of the first step, an evaluation, a save). Past it, the rank

* writes every thread's Python stack to ``RUN/hangs/step<N>-rank<k>.txt`` (``faulthandler``, which reads the
  stacks even of a thread blocked in C++: a waiting rank shows which collective it waits in),
* prints one line naming rank, host, pid, step, phase and seconds waited,
* records the fault under ``RUN/faults/`` and exits with :data:`EXIT_HUNG`, so that the launcher ends the
  others (and, given ``--max-restarts``, restarts them: they resume from the newest good checkpoint).

It cannot die: a write that fails (a full disk is when a run hangs in its save) is said once, the stacks then
go to stderr, and the rank still exits :data:`EXIT_HUNG`. A thread cannot run while another holds the GIL (a
C extension that never lets go): ``faulthandler.dump_traceback_later`` backs it up from C, :data:`BACKSTOP_S`
past the bound, writing the stacks to stderr and exiting 1.

A stopped rank cannot write its own stacks: its peers, left waiting on it, write theirs. Rank 0 stopped (or its
host frozen) past its run lock's lease wakes with its bound long passed: its lock lapsed (``held``), so it writes
nothing into a directory that may be another trainer's now, says so and exits :data:`EXIT_LOST_LOCK`. The run's
record of starts and faults, and the restart budget, are :mod:`prores.run.record`'s (with or without this
watchdog).

nvidia-resiliency-ext's ``ft_launcher`` was tried first (issue 26's note says why it is not used).
"""

from __future__ import annotations

import faulthandler
import math
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from prores.run.callbacks import EXIT_LOST_LOCK, Callback, exiting_lapsed
from prores.run.faults import record_fault
from prores.run.files import Careful

EXIT_HUNG = 124  # `prores train` exit status of a rank that found the run hung (as timeout(1)'s)
HANGS = "hangs"
BACKSTOP_S = 30.0  # past a phase's bound, faulthandler's C thread ends a rank whose Python threads cannot run


class Watchdog:
    """``bounds``: seconds per phase (0: unbounded). :meth:`enter` moves the rank to a phase."""

    def __init__(self, bounds: dict, run_dir: Path, rank: int, held: Callable[[], bool] = lambda: True):
        self.bounds, self.run_dir, self.rank, self.held = bounds, Path(run_dir), rank, held
        # (phase, step, since): one attribute, replaced whole, so the thread never reads a new phase with an old
        # start (a step bound against the first step's minutes)
        self.state = ("first step", 0, time.monotonic())
        self.careful = Careful(_say)
        self.armed = -math.inf  # when the backstop was last set
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
        now = time.monotonic()
        changed = phase != self.state[0]
        self.state = (phase, step, now)
        if changed or now - self.armed >= 1.0:  # at most once a second: each setting starts a C thread
            bound = self.bounds.get(phase, 0)
            if bound:
                faulthandler.dump_traceback_later(bound + BACKSTOP_S, exit=True)
            else:
                faulthandler.cancel_dump_traceback_later()
            self.armed = now

    def stop(self) -> None:
        self._stop.set()
        faulthandler.cancel_dump_traceback_later()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        bounded = [b for b in self.bounds.values() if b]
        poll = min([1.0] + [b / 20 for b in bounded])
        while not self._stop.wait(poll):
            phase, step, since = self.state
            waited = time.monotonic() - since
            bound = self.bounds.get(phase, 0)
            if bound and waited > bound:
                if not self.held():
                    _say(f"prores: error: rank {self.rank} made no progress in phase '{phase}' for {waited:.0f} s, and"
                         f" the run directory's lock lapsed meanwhile (was the process stopped?);"
                         f" {exiting_lapsed(self.run_dir)}")
                    os._exit(EXIT_LOST_LOCK)
                try:
                    self._hung(phase, step, waited)
                finally:
                    os._exit(EXIT_HUNG)

    def _hung(self, phase: str, step: int, waited: float) -> None:
        host, pid = socket.gethostname(), os.getpid()
        stacks = self.run_dir / HANGS / f"step{step}-rank{self.rank}.txt"
        header = (f"rank {self.rank} on {host}, pid {pid}: step {step}, phase {phase}, no progress for {waited:.0f} s"
                  f" (bound {self.bounds[phase]:g} s)\n\n")

        def write_stacks() -> None:
            stacks.parent.mkdir(parents=True, exist_ok=True)
            with open(stacks, "w") as fh:
                fh.write(header)
                fh.flush()
                faulthandler.dump_traceback(fh, all_threads=True)

        if not self.careful(str(stacks), write_stacks):
            stacks = "stderr"
            _say(header.rstrip())
            faulthandler.dump_traceback(sys.stderr, all_threads=True)
        self.careful(str(self.run_dir / "faults"), lambda: record_fault(self.run_dir, {
            "kind": "hang", "step": step, "rank": self.rank, "host": host, "pid": pid, "phase": phase,
            "detect_s": round(waited, 3), "stacks": str(stacks)}))
        _say(f"prores: error: rank {self.rank} on {host} (pid {pid}) hung at step {step}: no progress in phase"
             f" '{phase}' for {waited:.0f} s (bound {self.bounds[phase]:g} s); stacks in {stacks}; exiting {EXIT_HUNG}")


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


class WatchForHangs(Callback):
    """The watchdog's phases from the loop's hooks."""

    def on_start(self, trainer) -> None:
        cfg, bound = trainer.cfg, trainer.cfg.train.hang_timeout
        self.dog = None
        if bound:
            self.dog = Watchdog({"first step": cfg.train.hang_timeout_first_step, "step": bound,
                                 "eval": cfg.train.hang_timeout_eval, "save": cfg.checkpoint.save_timeout},
                                trainer.run_dir, trainer.topo.rank, trainer.held).start(trainer.step)

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
