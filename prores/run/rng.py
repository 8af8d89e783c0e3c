"""Each rank's random streams: the rule that seeds them, and what a resume does with the saved ones.

The default generators draw the dropout masks (weights are seeded per parameter, :mod:`prores.model.init`).
The rule, as in Megatron: a stream of its own on every data-parallel replica and pipeline stage, one stream
shared by the tensor-parallel ranks of a stage, whose dropout acts on the same replicated activations.

A checkpoint keeps every rank's states (``rng/rank{R}.pt``, R its global rank then). A resume restores a
rank's saved stream where its role is unchanged: the same stage of the same pp, the same replica of the same
dp (a change of tp alone: the peers shared the stream, any one of them stands for it). Where the role
changed, no saved stream is that rank's, and reusing one by rank number would break the rule (two tp peers
with two replicas' streams, or two replicas with one stream): the streams are derived afresh from the seed,
the step and the rank's (stage, replica), the same on every resume of that checkpoint on that layout.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy
import torch
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology


def stream_seed(seed: int, pp_rank: int, dp_rank: int, step: int = 0) -> int:
    """The seed of a (stage, replica)'s stream from ``step`` on (0: the run's start)."""
    return int(numpy.random.SeedSequence([seed, pp_rank, dp_rank] + ([step] if step else [])).generate_state(1)[0])


def seed_streams(seed: int, pp_rank: int, dp_rank: int, step: int = 0) -> None:
    s = stream_seed(seed, pp_rank, dp_rank, step)
    random.seed(s)
    numpy.random.seed(s)
    torch.manual_seed(s)  # and every CUDA device's


def states() -> dict:
    """Plain tensors, numbers and strings only, so that it loads with ``weights_only=True`` (no pickle
    code runs): numpy's state array becomes a list of ints."""
    name, keys, pos, has_gauss, cached = numpy.random.get_state()
    state = {"python": random.getstate(), "numpy": (name, keys.tolist(), pos, has_gauss, cached),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_states(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    numpy.random.set_state((name, numpy.asarray(keys, dtype=numpy.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def saved_rank(saved: dict, pp_rank: int, dp_rank: int) -> int:
    """The global rank that held stage ``pp_rank`` of replica ``dp_rank`` (tp rank 0) in the layout ``saved``
    = ``{"tp", "pp", "dp"}`` (DeepSpeed's rank order, axes pipe, data, model)."""
    topo = PipeModelDataParallelTopology(num_pp=saved["pp"], num_mp=saved["tp"], num_dp=saved["dp"])
    return topo.get_rank(pipe=pp_rank, data=dp_rank, model=0)


def restore(rng_dir: Path, saved: dict, topo, seed: int, step: int) -> str:
    """This rank's streams after a resume of the checkpoint whose ``rng`` directory is ``rng_dir``, written on
    ``saved``; says which way, for the resume's line."""
    if (saved["pp"], saved["dp"]) == (topo.pp, topo.dp):
        path = Path(rng_dir) / f"rank{saved_rank(saved, topo.pp_rank, topo.dp_rank)}.pt"
        if path.is_file():
            set_states(torch.load(path, weights_only=True))
            return "RNG streams restored"
    seed_streams(seed, topo.pp_rank, topo.dp_rank, step)
    return f"RNG streams derived afresh from train.seed, step {step} and each rank's stage and replica"
