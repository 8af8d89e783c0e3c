"""A run's record of its starts, progress and faults (``RUN/attempts.jsonl``, ``RUN/progress.json``,
:mod:`prores.run.faults`), kept by rank 0 whether or not the hang watchdog runs, and the restart budget
(:mod:`prores.run.restarts`) checked at each start. Every write is careful: a full disk costs the record a
line, never the run."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from prores.errors import UsageError
from prores.run.callbacks import Callback
from prores.run.faults import ATTEMPTS, PROGRESS, append_attempt, faults, read_attempts, read_json, restarts, write_progress
from prores.run.files import Careful
from prores.run.restarts import budget_spent, job_id, restart_count
from prores.run.signals import highest_on_any_rank

PROGRESS_EVERY_S = 1.0  # RUN/progress.json at most this often (a step of a small model takes milliseconds)


class RecordRun(Callback):
    """Rank 0 appends a ``start`` line (and how far the previous start got) and, at a clean end, an ``ended`` one;
    writes ``RUN/progress.json`` at most once a second; puts the faults and restarts into the summary; and
    refuses a start once its job's ``train.max_restarts_without_progress`` restarts in a row resumed from the
    same checkpoint (a fault that every restart meets)."""

    def on_start(self, trainer) -> None:
        self.careful = Careful(lambda line: print(line, file=sys.stderr, flush=True))
        self.start_time, self.written = time.time(), 0.0
        rank0 = trainer.topo.rank == 0
        spent = budget_spent(read_attempts(trainer.run_dir), job_id(), trainer.step,
                             trainer.cfg.train.max_restarts_without_progress) if rank0 else None
        if trainer.topo.world_size > 1 and highest_on_any_rank(1 if spent else 0, trainer.device) and not spent:
            spent = "rank 0 stops the run: its restarts are spent"  # every rank stops alike; rank 0 says why
        if spent:
            raise UsageError(spent)
        if rank0:
            self._previous_reached(trainer.run_dir)
            self._append(trainer.run_dir, {"event": "start", "time": self.start_time, "step": trainer.step,
                                           "job": job_id(), "restart": restart_count(), "host": socket.gethostname()})

    def _previous_reached(self, run_dir: Path) -> None:
        """How far the previous start got (``RUN/progress.json``): its steps lost if it ended in a fault that left
        no record."""
        progress = read_json(Path(run_dir) / PROGRESS)
        starts = [a for a in read_attempts(run_dir) if a["event"] == "start"]
        if progress and starts and starts[-1]["time"] <= progress["time"]:
            self._append(run_dir, {"event": "reached", "start_time": starts[-1]["time"], "step": progress["step"],
                                   "time": progress["time"]})

    def _append(self, run_dir: Path, entry: dict) -> None:
        self.careful(str(Path(run_dir) / ATTEMPTS), lambda: append_attempt(run_dir, entry))

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        now = time.time()
        if trainer.topo.rank == 0 and now - self.written >= PROGRESS_EVERY_S:
            self.written = now
            self.careful(f"{trainer.run_dir / PROGRESS}", lambda: write_progress(trainer.run_dir, step + 1))

    def on_end(self, trainer, summary) -> None:
        if trainer.topo.rank == 0 and summary.status in ("completed", "stopped", "diverged"):
            self._append(trainer.run_dir, {"event": "ended", "start_time": self.start_time, "time": time.time(),
                                           "status": summary.status, "step": trainer.step})
        summary.faults = faults(trainer.run_dir)
        summary.restarts = restarts(trainer.run_dir)
