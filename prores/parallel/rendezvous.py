"""Who this process is, from its launcher's variables alone: rank, world size and the rendezvous.

deepspeed and torchrun set ``RANK``/``WORLD_SIZE``/``MASTER_*`` themselves; under ``srun`` they come
from ``SLURM_*``; a plain ``prores train`` is a world of one. Nothing here starts a process group or
imports torch: ``prores train`` checks a launch against tp × pp before either, and a parent that starts
training processes of its own (a sweep, a test, a benchmark) clears these variables with
:func:`own_world` so that each child is a world of its own.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
from pathlib import Path
from typing import Callable, Mapping

from prores.errors import UsageError

RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class TopologyError(UsageError):
    """A parallel layout that cannot be built; the message says what to change."""


def free_port() -> int:
    """A port free now, drawn below the kernel's ephemeral range (``ip_local_port_range``).

    The rendezvous binds it seconds later, once torch is imported. A port the kernel handed out (bind to
    port 0) may by then be the source port of any outgoing connection, and gloo opens many: with several
    runs on one machine (a sweep's cells, a test suite) that failed as EADDRINUSE. Below the ephemeral
    range only another listener can take it, and the draw is random.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    draw = random.SystemRandom()
    for _ in range(100):
        # a machine whose ephemeral range starts low leaves no room below it: take the kernel's port
        port = draw.randrange(10000, low) if low > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise TopologyError(f"no free port in 10000-{low - 1} after 100 draws; set MASTER_PORT")


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


def launched_alone(env: Mapping[str, str]) -> bool:
    """No launcher started this process among others (torchrun and deepspeed set WORLD_SIZE, srun
    SLURM_NTASKS)."""
    return int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or 1) == 1


def _ensure_rendezvous_env() -> None:
    """Fill torch.distributed's variables when no torch-aware launcher did."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    if "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ:
        os.environ.update(slurm_rendezvous(os.environ, scontrol_hostnames))
        return
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT") or str(free_port()))


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
