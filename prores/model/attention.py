"""Megatron-core attention and MLP, built from ModuleSpecs, runnable on CPU and GPU.

Two small pieces of our own, both plugged in without patching Megatron:

* :class:`SDPACoreAttention`, a causal core attention on
  ``torch.nn.functional.scaled_dot_product_attention`` (Megatron's
  DotProductAttention needs its fused softmax kernels; TE needs CUDA).
* :func:`rotate`, rotary embedding applied inside the core attention, after Megatron's Q and K norms as
  Megatron applies it. Megatron's ``RotaryEmbedding.get_emb`` moves its buffer to
  ``torch.cuda.current_device()``, so it cannot run on CPU, and its ``apply_rotary_pos_emb`` takes the cosine
  and sine of the angles on every call and concatenates twice per tensor; the tables here are computed once,
  and the rotation is one flip, two multiplies and one add, bitwise Megatron's values.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_reduce

from megatron.core.parallel_state import get_tensor_model_parallel_group, get_tensor_model_parallel_world_size
from megatron.core.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                           copy_to_tensor_model_parallel_region,
                                           set_tensor_model_parallel_attributes)
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_config import TransformerConfig

from prores.model import fused
from prores.model.kernels import reference
from prores.model.norm import Norm


class ProjectionNorm(Norm):
    """HybridNorm's norm of a whole Q, K or V projection, all heads at once, as OLMo's ``q_norm``/``k_norm``
    (one weight of the projection's width) on which the HybridNorm reference builds. Megatron hands it this
    rank's heads as [s, b, heads, head_dim]; under tensor parallelism a rank holds its heads' share of the
    weight (partitioned like the projection's rows), and the statistics are summed over the tp group."""

    def __init__(self, hidden_size: int, config: TransformerConfig = None, eps: float = 1e-5, *, kind: str,
                 dyt_init: float = 0.5):
        # Megatron passes the head's size; the norm spans the projection, split over tp like its heads
        self.width = config.num_attention_heads * config.kv_channels
        self.tp = get_tensor_model_parallel_world_size()
        super().__init__(kind, self.width // self.tp, eps, dyt_init=dyt_init)
        for p in (self.weight, self.bias):
            if p is not None:
                set_tensor_model_parallel_attributes(p, is_parallel=True, dim=0, stride=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(*x.shape[:-2], -1)
        if self.kind == "dyt":  # elementwise but for its scalar, which every rank's slice shares
            alpha = copy_to_tensor_model_parallel_region(self.alpha) if self.tp > 1 else self.alpha
            out = reference.dyt(flat, alpha, self.weight)
        elif self.tp == 1:
            out = fused.ops("eager").norm(flat, self)
        else:
            out = self._split_norm(flat)
        return out.view(x.shape)

    def _split_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The norm over the projection whose features lie on the tp ranks: sums all-reduced, and all-reduced
        again in the backward pass (every rank's output depends on every rank's input)."""
        group = get_tensor_model_parallel_group()
        h = reference.up(x)
        if self.kind == "layernorm":
            h = h - all_reduce(h.sum(-1, keepdim=True), group=group) / self.width
        rstd = torch.rsqrt(all_reduce(h.square().sum(-1, keepdim=True), group=group) / self.width + self.eps)
        out = h * rstd * reference.up(self.weight)
        return (out if self.bias is None else out + reference.up(self.bias)).to(x.dtype)


class SDPACoreAttention(nn.Module):
    """Causal attention on [s, b, heads, head_dim] tensors; returns [s, b, heads·head_dim]. ``v_norm``
    (HybridNorm): the norm of V, as Megatron's ``q_layernorm`` is of Q."""

    def __init__(self, *, config: TransformerConfig, layer_number: int, attn_mask_type, attention_type,
                 cp_comm_type=None, softmax_scale=None, pg_collection=None, attention_dropout=None,
                 v_norm: Optional[ModuleSpec] = None, rope_base: Optional[float] = None):
        super().__init__()
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale
        self.rope_base = rope_base  # None: no rotary embedding
        self.head_dim = config.kv_channels
        self.v_norm = None if v_norm is None else build_module(v_norm, hidden_size=config.kv_channels,
                                                               config=config, eps=config.layernorm_epsilon)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if self.v_norm is not None:
            value = self.v_norm(value)
        if self.rope_base is not None:
            cos, sin = self.rope(query.shape[0], query.dtype, query.device)
            query, key = rotate(query, cos, sin), rotate(key, cos, sin)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # -> [b, n, s, d]
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale,
            dropout_p=self.dropout if self.training else 0.0,
        )
        s, b = out.shape[2], out.shape[0]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def rope(self, seq_length: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables of a sequence of ``seq_length`` at ``dtype`` on ``device``."""
        return rope_tables(seq_length, self.head_dim, self.rope_base, dtype, device)


# A plain dict, not functools.lru_cache: Dynamo ignores lru_cache and traces the function, so a compiled block
# (kernels.backend=block) recomputed the tables' cosines and sines in every block's forward and backward (18%
# of the step at 48 blocks); a hit in a dict is a graph input. prores.model.block_compile fills it before the
# trace.
_ROPE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_tables(seq_length: int, head_dim: int, base: float, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` for the half-split convention, [s, 1, 1, head_dim] at the activations' dtype, from fp32
    angles as Megatron's: the cosine and sine are taken in fp32, then cast. The sine's first half is negated,
    so that :func:`rotate` needs no negation of its own. Computed once per key."""
    key = (seq_length, head_dim, base, dtype, device)
    if key in _ROPE_TABLES:
        return _ROPE_TABLES[key]
    tables = _rope_tables(seq_length, head_dim, base, dtype, device)
    if not torch.compiler.is_compiling():  # a store while tracing would change the guarded dict: a recompile
        _ROPE_TABLES[key] = tables
    return tables


def _rope_tables(seq_length: int, head_dim: int, base: float, dtype: torch.dtype,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float64), inv_freq).float()
    cos, sin = torch.cos(angles), torch.sin(angles)
    tables = torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)
    return tuple(t[:, None, None, :].to(dtype=dtype, device=device) for t in tables)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of [s, b, heads, head_dim]: ``x·cos + [x2, x1]·sin`` with ``sin`` from
    :func:`rope_tables`, which is Megatron's ``x·cos + [-x2, x1]·sin`` (a negation is exact)."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x * cos + swapped * sin


def attention_spec(model_cfg, qkv_norm: bool = False) -> ModuleSpec:
    """Megatron's SelfAttention with our core attention; ``qkv_norm``: Q, K and V each normed whole."""
    norm = None
    core_params = {"rope_base": model_cfg.rope_base if model_cfg.position == "rope" else None}
    if qkv_norm:
        norm = ModuleSpec(module=ProjectionNorm, params={"kind": model_cfg.norm, "dyt_init": model_cfg.dyt_init})
        core_params["v_norm"] = norm
    core = ModuleSpec(module=SDPACoreAttention, params=core_params)
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(linear_qkv=ColumnParallelLinear, core_attention=core,
                                           linear_proj=RowParallelLinear, q_layernorm=norm, k_layernorm=norm),
    )

MLP_SPEC = ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                           linear_fc2=RowParallelLinear))


def _leave_to_prores_init(weight: torch.Tensor) -> None:
    """Megatron's init hook, deliberately empty: :mod:`prores.model.init` fills every weight."""


def megatron_config(model_cfg) -> TransformerConfig:
    """The TransformerConfig for our pieces.

    ``perform_initialization`` stays on only because Megatron sets the
    tensor-parallel attributes (partition_dim, stride) on that path; the init
    method itself is a no-op and the layout-invariant init runs afterwards.
    """
    swiglu = model_cfg.mlp == "swiglu"
    return TransformerConfig(
        num_layers=model_cfg.num_layers,
        hidden_size=model_cfg.hidden_size,
        ffn_hidden_size=model_cfg.ffn_hidden_size,
        num_attention_heads=model_cfg.num_heads,
        hidden_dropout=model_cfg.dropout,
        attention_dropout=model_cfg.dropout,
        add_bias_linear=False,
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else F.gelu,
        bias_activation_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=True,
        perform_initialization=True,
        init_method=_leave_to_prores_init,
        output_layer_init_method=_leave_to_prores_init,
        params_dtype=torch.float32,
        layernorm_epsilon=model_cfg.norm_eps,  # the eps Megatron gives q_layernorm and k_layernorm
    )
