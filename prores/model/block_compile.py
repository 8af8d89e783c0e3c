"""``kernels.backend=block``: each residual block compiled whole by ``torch.compile`` (Inductor on CPU, Triton
on CUDA), forward and backward, as torchtitan compiles each transformer block on its own.

The add+norm formulas inside are the eager ones (:mod:`prores.model.kernels.reference`); Inductor fuses them
with the block's other element-wise work (rotary embedding, SiLU, dropout, alpha). ``nn.Module.compile`` works
in place, so a block's parameter names, its state dict and checkpoints are those of the eager block. alpha is a
0-dim tensor, so a new value never recompiles; ``alpha=None`` after saturation compiles once more.

Megatron-core's linear layers ask ``get_tensor_model_parallel_group_if_none`` for their group on every call;
under Dynamo that lookup reaches its deprecation ``warnings.warn`` (which Dynamo cannot trace) and breaks the
graph at each of a block's four linear layers. :func:`_trace_tp_group_lookup` gives Dynamo the same lookup
without the warning (``torch._dynamo.substitute_in_graph``); eager calls are untouched. A pre-hook kept out of
the graph fills the rotary tables' cache before each call, so the graph takes them as an input.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


@functools.cache
def _trace_tp_group_lookup() -> None:
    import megatron.core.utils as megatron_utils
    from megatron.core import parallel_state

    @torch._dynamo.substitute_in_graph(megatron_utils.get_tensor_model_parallel_group_if_none,
                                       skip_signature_check=True)
    def lookup(tp_group, is_expert=False, check_initialized=True):
        if tp_group is not None:
            return tp_group
        get = parallel_state.get_expert_tensor_parallel_group if is_expert else \
            parallel_state.get_tensor_model_parallel_group
        return get(check_initialized=check_initialized)


@torch.compiler.disable
def _rope_tables_before_the_graph(block: nn.Module, args: tuple) -> None:
    """Put the block's rotary tables in :func:`prores.model.attention.rope_tables`'s cache outside the trace,
    where the graph finds them as an input; traced, their cosines and sines would be computed in every block's
    forward and backward."""
    core = block.self_attention.core_attention
    if core.rope_base is not None:
        core.rope(args[0].shape[0], block.mlp.linear_fc2.weight.dtype, args[0].device)


def compile_block(block: nn.Module, **options) -> None:
    """Compile ``block`` in place (its forward and, through AOT autograd, its backward); ``options`` go to
    ``torch.compile`` (Inductor by default)."""
    _trace_tp_group_lookup()
    block.register_forward_pre_hook(_rope_tables_before_the_graph)
    block.compile(**options)
