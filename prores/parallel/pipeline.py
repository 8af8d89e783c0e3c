"""A DeepSpeed PipelineModule from the model's pieces: each stage builds only its own.

Stages are cut by counting blocks: stage s holds ``blocks_per_stage[s]``
blocks, the pieces before the first block (embedding) join stage 0 and the
pieces after the last block (final norm, head) join the last stage.
"""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Callable, Sequence

from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec


def layer_specs(pieces) -> list[LayerSpec]:
    specs = []
    for p in pieces:
        if p.tie_key is None:
            specs.append(LayerSpec(p.cls, **p.kwargs))
        else:
            specs.append(TiedLayerSpec(p.tie_key, p.cls, forward_fn=p.tied_forward,
                                       tied_weight_attr=[p.tied_attr], **p.kwargs))
    return specs


def stage_bounds(is_block: Sequence[bool], blocks_per_stage: Sequence[int]) -> list[int]:
    """Piece index where each stage starts, then the number of pieces."""
    block_at = [i for i, b in enumerate(is_block) if b]
    if sum(blocks_per_stage) != len(block_at) or min(blocks_per_stage) < 1:
        raise ValueError(f"blocks per stage {list(blocks_per_stage)} do not split {len(block_at)} blocks")
    bounds, seen = [0], 0
    for count in blocks_per_stage[:-1]:
        seen += count
        bounds.append(block_at[seen])
    return bounds + [len(is_block)]


class StagedPipeline(PipelineModule):
    """PipelineModule whose stage boundaries are given, not searched for.

    DeepSpeed 0.19's partition methods (uniform, parameters, type:regex) cannot
    express an explicit per-stage block count, so we set ``parts`` ourselves in
    the hook its constructor calls.
    """

    def __init__(self, *, bounds: list[int], **kwargs):
        self._given_bounds = bounds
        super().__init__(partition_method="given", **kwargs)

    def _partition_layers(self, method="given"):
        self.parts = list(self._given_bounds)
        stage = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])


def use_megatron_rng_tracker() -> None:
    """DeepSpeed's activation checkpointing replays a recomputed piece under the RNG states of its first
    forward: the CPU and device generators, and the states of its ``get_cuda_rng_tracker()``. Point that
    tracker at Megatron's, so that what Megatron-core draws inside a fork of its tracker (on GPU, the
    tensor-parallel ranks' own dropout streams) is replayed too."""
    from deepspeed.runtime.activation_checkpointing import checkpointing
    from megatron.core import tensor_parallel

    checkpointing.configure(None)
    checkpointing._CUDA_RNG_STATE_TRACKER = tensor_parallel.get_cuda_rng_tracker()


def build_pipeline(pieces, loss_fn: Callable, topology, is_block: Callable, blocks_per_stage: Sequence[int],
                   recompute: Sequence[str] = ()):
    """``recompute``: class names of the pieces whose activations are recomputed in the backward pass,
    each piece on its own (DeepSpeed's ``activation_checkpoint_interval=1``); the others keep theirs."""
    bounds = stage_bounds([is_block(p) for p in pieces], blocks_per_stage)
    if recompute:
        use_megatron_rng_tracker()
    # PipelineModule print()s its seed settings and topology; they show when DeepSpeed's logger is at INFO
    verbose = logging.getLogger("DeepSpeed").isEnabledFor(logging.INFO)
    with contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO()):
        return StagedPipeline(bounds=bounds, layers=layer_specs(pieces), loss_fn=loss_fn,
                              topology=topology.ds_topology, activation_checkpoint_interval=1 if recompute else 0,
                              checkpointable_layers=list(recompute) or None)
