"""Which job a start belongs to, and its budget of restarts that make no progress (no torch).

A job is what a user submitted once: a Slurm job (its requeues and slurm/train.sbatch's restarts share its id),
a torchrun launch (its ``--max-restarts`` share the rendezvous id, or without one the agent process), or a
plain `prores train` (a start of its own). A new submission is a new job, so a fault that was fixed never
leaves a later job refused.
"""

from __future__ import annotations

import os
import socket
from typing import Optional

from prores.run.lock import process_start


def job_id() -> str:
    """What names this process's job (as torchrun and Slurm name it; never a shell's pid)."""
    env = os.environ
    if env.get("SLURM_JOB_ID"):
        return f"slurm job {env['SLURM_JOB_ID']}"
    if env.get("TORCHELASTIC_RUN_ID", "none") not in ("", "none"):  # torchrun's default without --rdzv-id is "none"
        return f"torchrun run {env['TORCHELASTIC_RUN_ID']}"
    pid = os.getppid() if "TORCHELASTIC_RESTART_COUNT" in env else os.getpid()  # the agent outlives its restarts
    what = "torchrun agent" if pid != os.getpid() else "process"
    return f"{what} {pid} on {socket.gethostname()} started {process_start(pid)}"


def restart_count() -> int:
    """This start's restart within its job: torchrun's (--max-restarts) or slurm/train.sbatch's."""
    return sum(int(os.environ.get(var) or 0) for var in ("TORCHELASTIC_RESTART_COUNT", "PRORES_RESTART_COUNT"))


def budget_spent(attempts: list[dict], job: str, step: int, budget: int) -> Optional[str]:
    """Why a start of ``job`` from checkpoint ``step`` must not run, or None: the job's last ``budget`` starts all
    resumed from this same step and ended without a clean end (each a restart that made no progress). A start
    that ended cleanly (completed, stopped, diverged) or saved a newer checkpoint breaks the run of them."""
    ended = {a["start_time"] for a in attempts if a["event"] == "ended"}
    in_a_row = 0
    for start in reversed([a for a in attempts if a["event"] == "start" and a["job"] == job]):
        if start["step"] != step or start["time"] in ended:
            break
        in_a_row += 1
    if budget and in_a_row >= budget:
        return (f"{in_a_row} starts in a row of this job ({job}) resumed from step {step} and saved no new"
                " checkpoint: stopping instead of looping (train.max_restarts_without_progress). See the run's"
                " hangs/ and the log for the fault; a new job (sbatch or torchrun again) once it is fixed starts"
                " with a fresh budget.")
    return None
