"""One process layout, three views that must agree: torch.distributed, Megatron-core
``parallel_state`` and DeepSpeed's ``PipeModelDataParallelTopology``.

Both Megatron (order tp-dp-pp) and DeepSpeed (axes pipe, data, model) put
tensor-parallel ranks innermost and pipeline stages outermost; :func:`init`
checks that they agree for this rank instead of assuming it.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Optional

import torch

from prores.parallel.rendezvous import RENDEZVOUS_VARS, TopologyError, launched_as


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
    device: torch.device  # where this rank's parameters, activations and every collective's tensors live

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


def cuda_index(local_rank: int, visible: int) -> int:
    """The GPU a rank drives, of the ``visible`` ones its process sees: its own when a scheduler shows each task
    only its own GPU (Slurm's ``--gpus-per-task=1``, ``CUDA_VISIBLE_DEVICES`` of one), else the one at its
    node-local rank (torchrun, or Slurm showing a task all of its node's GPUs)."""
    if visible == 1:
        return 0
    if 0 <= local_rank < visible:
        return local_rank
    raise TopologyError(f"local rank {local_rank} sees {visible} GPUs, none of them its own: start as many tasks a"
                        " node as it has GPUs (torchrun --nproc-per-node, srun --ntasks-per-node), or show each task"
                        " one GPU (srun --gpus-per-task=1)")


def run_device() -> torch.device:
    """This process's device: its GPU where CUDA is, else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", cuda_index(int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()))


TIMEOUT_S = {"collectives": 600.0}  # parallel.timeout, set by the run before its first collective (preflight's)


def connect() -> None:
    """torch.distributed's default process group (gloo on CPUs, NCCL on GPUs), started once; a collective
    waiting on a peer fails after ``TIMEOUT_S``."""
    import deepspeed

    if not torch.cuda.is_available():
        # DeepSpeed JIT-builds its shared-memory collectives op on CPUs when it starts (30 s or more on a
        # cold extension cache); the op serves only deepspeed.comm.inference_all_reduce, which prores
        # never calls. Marked incompatible, it is never built and DeepSpeed uses torch.distributed.
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if torch.cuda.is_available():
        device = run_device()
        torch.cuda.set_device(device)
        # DeepSpeed takes LOCAL_RANK for the GPU's index (PipelineModule.to, the engine's device): where a task
        # sees only its own GPU that index is 0, whatever its rank on the node
        os.environ["LOCAL_RANK"] = str(device.index)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=TIMEOUT_S["collectives"])
    if not torch.distributed.is_initialized() and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store across --max-restarts, with the last attempt's keys in it: a restarted
        # rank that starts before its peer reads the peer's old address and fails (connection refused). Each
        # attempt gets keys of its own; DeepSpeed then wraps the group as it is.
        env = os.environ
        store = torch.distributed.PrefixStore(
            f"prores/attempt{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
            torch.distributed.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]),
                                       is_master=False, timeout=timeout))
        torch.distributed.init_process_group(backend, store=store, rank=int(env["RANK"]),
                                             world_size=int(env["WORLD_SIZE"]), timeout=timeout)
    if not torch.distributed.is_initialized() or not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timeout)


def agree(problem: Optional[str]) -> Optional[str]:
    """Every rank's verdict on its own checks, made one, so that all ranks go on or all stop: None when
    every rank passed, else the first failing rank's message (with its rank, when others passed).
    Collective over the launched world (whose variables :func:`launched_as` has checked)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 or not all(v in os.environ for v in RENDEZVOUS_VARS):
        return problem
    connect()
    verdicts: list = [None] * world
    torch.distributed.all_gather_object(verdicts, problem)
    failed = [(rank, p) for rank, p in enumerate(verdicts) if p is not None]
    if not failed:
        return None
    rank, first = failed[0]
    return first if len(failed) == world else f"rank {rank} of {world}: {first}"


def init(tp: int, pp: int) -> Topology:
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from megatron.core import parallel_state

    _, dp = launched_as(tp, pp)
    connect()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                                 distributed_timeout_minutes=TIMEOUT_S["collectives"] / 60)
    ds_topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    rank = torch.distributed.get_rank()
    coord = ds_topo.get_coord(rank)
    ours = (parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_data_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank())
    if (coord.pipe, coord.data, coord.model) != ours:
        raise TopologyError(f"rank {rank}: DeepSpeed places it at {coord}, Megatron at (pipe, data, model)={ours}")
    return Topology(rank=rank, world_size=torch.distributed.get_world_size(), tp=tp, pp=pp, dp=dp,
                    tp_rank=ours[2], pp_rank=ours[0], dp_rank=ours[1], ds_topology=ds_topo, device=run_device())
