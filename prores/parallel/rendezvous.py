"""Who this process is, from its launcher's variables alone: rank, world size and the rendezvous.

deepspeed and torchrun set ``RANK``/``WORLD_SIZE``/``MASTER_*`` themselves; under ``srun`` they come
from ``SLURM_*``; a plain ``prores train`` is a world of one. Nothing here starts a process group or
imports torch: ``prores train`` checks a launch against tp × pp before either, and a parent that starts
training processes of its own (a sweep, a test, a benchmark) clears these variables with
:func:`own_world` so that each child is a world of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
from typing import Callable, Mapping

from prores.errors import UsageError

RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class TopologyError(UsageError):
    """A parallel layout that cannot be built; the message says what to change."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_rendezvous(env: Mapping[str, str], hostnames: Callable[[str], list[str]]) -> dict[str, str]:
    """torch.distributed variables for one `srun` task, from the SLURM_* ones.

    The master is the first host of the job's node list; the port is derived
    from the job id so that every task of the job agrees on it without talking.
    """
    job_id = int(env.get("SLURM_JOB_ID", "0"))
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR") or hostnames(env["SLURM_JOB_NODELIST"])[0],
        "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + job_id % 20000),
    }


def scontrol_hostnames(nodelist: str) -> list[str]:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise TopologyError(f"cannot expand SLURM_JOB_NODELIST={nodelist!r} with `scontrol show hostnames`"
                            f" ({exc}); set MASTER_ADDR to the first node's address.") from None
    return out.split()


def _ensure_rendezvous_env() -> None:
    """Fill torch.distributed's variables when no torch-aware launcher did."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    if "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ:
        os.environ.update(slurm_rendezvous(os.environ, scontrol_hostnames))
        return
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT") or str(_free_port()))


def check_divisible(world_size: int, tp: int, pp: int) -> int:
    if world_size % (tp * pp):
        raise TopologyError(
            f"world size {world_size} is not divisible by parallel.tp × parallel.pp = {tp} × {pp};"
            f" launch a multiple of {tp * pp} processes or change tp/pp."
        )
    return world_size // (tp * pp)


def launched_as(tp: int, pp: int) -> tuple[int, int]:
    """(rank, dp) of this process from the launcher's variables alone, before any process group."""
    _ensure_rendezvous_env()
    return int(os.environ["RANK"]), check_divisible(int(os.environ["WORLD_SIZE"]), tp, pp)


def own_world(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without a launcher's rendezvous variables: a child started with it picks its own."""
    return {k: v for k, v in env.items() if k not in RENDEZVOUS_VARS}
