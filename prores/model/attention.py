"""Megatron-core attention and MLP, built from ModuleSpecs, runnable on CPU and GPU.

Two small pieces of our own, both plugged in without patching Megatron:

* :class:`SDPACoreAttention`, a causal core attention on
  ``torch.nn.functional.scaled_dot_product_attention`` (Megatron's
  DotProductAttention needs its fused softmax kernels; TE needs CUDA).
* :func:`rope_table`, the rotary angle table in the layout Megatron's
  ``apply_rotary_pos_emb`` expects. Megatron's ``RotaryEmbedding.get_emb``
  moves its buffer to ``torch.cuda.current_device()``, so it cannot run on CPU.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from megatron.core.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                           copy_to_tensor_model_parallel_region)
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_config import TransformerConfig

from prores.model import fused
from prores.model.norm import Norm


class HeadNorm(Norm):
    """A norm over each head's features, as Megatron builds ``q_layernorm``/``k_layernorm`` (HybridNorm's
    QKV norm). Its weights are shared by the heads, which tensor parallelism splits over ranks: each rank's
    gradient covers its own heads, so the weights pass through Megatron's copy-to-tensor-parallel region,
    whose backward sums them over the ranks (the one-process gradient; an identity at tp = 1)."""

    def __init__(self, hidden_size: int, config: TransformerConfig = None, eps: float = 1e-5, *, kind: str,
                 dyt_init: float = 0.5):
        super().__init__(kind, hidden_size, eps, dyt_init=dyt_init)

    def affine(self):
        weight, bias = super().affine()
        return (copy_to_tensor_model_parallel_region(weight),
                None if bias is None else copy_to_tensor_model_parallel_region(bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.ops("eager").norm(x, self)


class SDPACoreAttention(nn.Module):
    """Causal attention on [s, b, heads, head_dim] tensors; returns [s, b, heads·head_dim]. ``v_norm``
    (HybridNorm): a per-head norm of V, as Megatron's ``q_layernorm`` is of Q."""

    def __init__(self, *, config: TransformerConfig, layer_number: int, attn_mask_type, attention_type,
                 cp_comm_type=None, softmax_scale=None, pg_collection=None, attention_dropout=None,
                 v_norm: Optional[ModuleSpec] = None):
        super().__init__()
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale
        self.v_norm = None if v_norm is None else build_module(v_norm, hidden_size=config.kv_channels,
                                                               config=config, eps=config.layernorm_epsilon)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if self.v_norm is not None:
            value = self.v_norm(value)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # -> [b, n, s, d]
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale,
            dropout_p=self.dropout if self.training else 0.0,
        )
        s, b = out.shape[2], out.shape[0]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


@functools.lru_cache(maxsize=16)
def rope_table(seq_length: int, head_dim: int, base: float, device: torch.device) -> torch.Tensor:
    """[s, 1, 1, head_dim] fp32 angles, kept in fp32 even when the model is bf16."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float64), inv_freq)
    return torch.cat([angles, angles], dim=-1)[:, None, None, :].float().to(device)


def attention_spec(model_cfg, qkv_norm: bool = False) -> ModuleSpec:
    """Megatron's SelfAttention with our core attention; ``qkv_norm``: Q, K and V each normed per head."""
    core = SDPACoreAttention
    norm = None
    if qkv_norm:
        norm = ModuleSpec(module=HeadNorm, params={"kind": model_cfg.norm, "dyt_init": model_cfg.dyt_init})
        core = ModuleSpec(module=SDPACoreAttention, params={"v_norm": norm})
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
