"""One process layout, three views that must agree: torch.distributed, Megatron-core
``parallel_state`` and DeepSpeed's ``PipeModelDataParallelTopology``.

Both Megatron (order tp-dp-pp) and DeepSpeed (axes pipe, data, model) put
tensor-parallel ranks innermost and pipeline stages outermost; :func:`init`
checks that they agree for this rank instead of assuming it.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from prores.errors import UsageError


class TopologyError(UsageError):
    """A parallel layout that cannot be built; the message says what to change."""


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    ds_topology: object

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def is_stage_writer(self) -> bool:
        """The first TP/DP rank of its stage: writes that stage's per-layer numbers."""
        return self.tp_rank == 0 and self.dp_rank == 0

    @property
    def is_loss_writer(self) -> bool:
        return self.is_stage_writer and self.is_last_stage


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
    """Fill torch.distributed's variables when no torch-aware launcher did.

    deepspeed and torchrun set RANK/WORLD_SIZE themselves; under `srun` they
    come from SLURM_*; a plain `prores train` is a world of one.
    """
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


def init(tp: int, pp: int) -> Topology:
    import deepspeed
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from megatron.core import parallel_state

    _, dp = launched_as(tp, pp)
    if not torch.cuda.is_available():
        # DeepSpeed JIT-builds its shared-memory collectives op on CPUs when it starts (30 s or more on a
        # cold extension cache); the op serves only deepspeed.comm.inference_all_reduce, which prores
        # never calls. Marked incompatible, it is never built and DeepSpeed uses torch.distributed.
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo",
                                   verbose=False)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    ds_topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    rank = torch.distributed.get_rank()
    coord = ds_topo.get_coord(rank)
    ours = (parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_data_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank())
    if (coord.pipe, coord.data, coord.model) != ours:
        raise TopologyError(f"rank {rank}: DeepSpeed places it at {coord}, Megatron at (pipe, data, model)={ours}")
    return Topology(rank=rank, world_size=torch.distributed.get_world_size(), tp=tp, pp=pp, dp=dp,
                    tp_rank=ours[2], pp_rank=ours[0], dp_rank=ours[1], ds_topology=ds_topo)
