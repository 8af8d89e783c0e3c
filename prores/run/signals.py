"""Preemption: a stop signal becomes a checkpoint, an agreed exit and, under Slurm, a requeue.

SIGUSR1 (Slurm's ``--signal``) and SIGTERM (preemption, ``scancel``, the time
limit) only set a flag: nothing is done inside the handler, so a second signal
during the save changes nothing. The flag is all-reduced at every step
boundary, so all ranks stop after the same step, save together and exit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

import torch
import torch.distributed as dist

from prores.parallel.collectives import all_reduce_over

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopSignals:
    def __init__(self):
        self.received: str | None = None
        self._previous = {}

    def __enter__(self) -> "StopSignals":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.received:
            # The checkpoint is saved and the process is on its way out: a repeat signal (Slurm's
            # requeue kills the step with SIGTERM) must not turn that clean exit into a kill.
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.received = self.received or signal.Signals(signum).name

    def agreed(self, device: torch.device) -> bool:
        """True on every rank once any rank got a stop signal (one all-reduce of one number)."""
        flag = highest_on_any_rank(1 if self.received else 0, device)
        if flag and not self.received:
            self.received = "on another rank"
        return bool(flag)


def highest_on_any_rank(value: int, device: torch.device) -> int:
    """The largest of every rank's ``value``: how ranks agree on a stop one of them decided."""
    flag = torch.tensor([float(value)], device=device)
    all_reduce_over(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def requeue() -> str:
    """Requeue this Slurm job if it allows it (``sbatch --requeue``); says what happened."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return "not a Slurm job: run the same command again to resume"
    try:
        info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
        if not re.search(r"\bRequeue=1\b", info):
            return f"Slurm job {job} was not submitted with --requeue: submit it again to resume"
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not requeue Slurm job {job} ({exc}): submit it again to resume"
    if done.returncode != 0:
        return f"`scontrol requeue {job}` failed ({done.stderr.strip()}): submit it again to resume"
    return f"requeued Slurm job {job}; it resumes from this checkpoint when it runs again"
