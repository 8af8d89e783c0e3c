"""A DeepSpeed PipelineModule from the model's pieces: each stage builds only its own."""

from __future__ import annotations

from typing import Callable

from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec


def layer_specs(pieces) -> list[LayerSpec]:
    specs = []
    for p in pieces:
        if p.tie_key is None:
            specs.append(LayerSpec(p.cls, **p.kwargs))
        else:
            specs.append(TiedLayerSpec(p.tie_key, p.cls, forward_fn=p.tied_forward,
                                       tied_weight_attr=["word_embeddings.weight"], **p.kwargs))
    return specs


def build_pipeline(pieces, loss_fn: Callable, topology, balance_type: str) -> PipelineModule:
    """Stages hold equal numbers of pieces of class ``balance_type`` (the blocks)."""
    return PipelineModule(layers=layer_specs(pieces), loss_fn=loss_fn, topology=topology.ds_topology,
                          partition_method=f"type:{balance_type}", activation_checkpoint_interval=0)
