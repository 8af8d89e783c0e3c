"""One residual block: a residual method (:mod:`prores.model.layouts`) around Megatron-core attention and
MLP, its branches scaled by alpha."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from megatron.core.transformer.spec_utils import build_module

from prores.model import fused
from prores.model.attention import MLP_SPEC, attention_spec, megatron_config
from prores.model.block_compile import compile_block
from prores.model.depth_mup import branch_multiplier, hidden_optimizer_scales
from prores.model.init import init_piece
from prores.model.layouts import LAYOUTS
from prores.model.norm import Norm
from prores.model.prores import ProRes


class Block(nn.Module):
    """Block ``layer`` (global, 1-based) of ``model_cfg.num_layers``, on tensor-parallel rank ``tp[0]`` of
    ``tp[1]`` (as Megatron's parallel_state has them: its layers size themselves from it).

    ``alpha`` is ``None`` (exactly 1, no multiply) or a 0-dim fp32 tensor set by
    :meth:`set_step` from the ProRes schedule (times depth-µP's fixed branch
    multiplier, if on); it is never a parameter or a buffer, so neither the
    optimizer, a dtype cast nor a checkpoint touches it. The method's learnable
    gains are parameters ``gain_<on>`` (:meth:`gain`).
    """

    def __init__(self, model_cfg, prores: ProRes, layer: int, seed: int, backend: str = "eager",
                 tp: tuple[int, int] = (0, 1)):
        super().__init__()
        if prores.num_layers != model_cfg.num_layers:
            raise ValueError("ProRes and the model disagree on the number of blocks")
        self.layer_number = layer
        self.model_cfg = model_cfg
        self.prores = prores
        self.ops = fused.ops(backend)
        self.layout = LAYOUTS[model_cfg.norm_layout]
        self.skip_scale = self.layout.skip_scale(model_cfg.num_layers)
        self.multiplier = branch_multiplier(model_cfg)
        self.optimizer_scales = hidden_optimizer_scales(model_cfg)  # (learning rate, AdamW eps) factors
        self.dropout = model_cfg.dropout

        config = megatron_config(model_cfg)
        self.self_attention = build_module(attention_spec(model_cfg, self.layout.qkv_norm), config=config,
                                           layer_number=layer)
        self.mlp = build_module(MLP_SPEC, config=config, ffn_hidden_size=model_cfg.ffn_hidden_size)
        scale = self.layout.norm_out_scale(layer)
        # LNS's 1/√l: a constant on the norm's output, or (model.lns_scale=gain) the gain's initial value
        out_scale, gain_init = (1.0, scale) if model_cfg.lns_scale == "gain" else (scale, 1.0)
        for name in self.layout.norms:
            self.add_module(name, Norm(model_cfg.norm, model_cfg.hidden_size, model_cfg.norm_eps, out_scale,
                                       model_cfg.dyt_init, gain_init))
        for g in self.layout.gains:
            self.register_parameter(f"gain_{g.on}",
                                    nn.Parameter(torch.zeros(model_cfg.hidden_size if g.per_channel else 1)))
        init_piece(self, model_cfg, layer, seed, tp)
        self.alpha: Optional[torch.Tensor] = None
        self.set_step(0)
        if backend == "block":
            compile_block(self)

    def initial_values(self) -> dict[str, float]:
        """The method's gains, from their init rules (:mod:`prores.model.init` draws the rest)."""
        m = self.model_cfg
        return {f"gain_{g.on}": g.init(self.layer_number, m.num_layers, m) for g in self.layout.gains}

    def gain(self, on: str) -> Optional[torch.Tensor]:
        """The learnable gain on ``on`` (a branch or a skip), if the method has one."""
        return getattr(self, f"gain_{on}", None)

    def gains(self) -> list[nn.Parameter]:
        return [self.gain(g.on) for g in self.layout.gains]

    def set_step(self, step: int) -> None:
        """Set alpha for ``step`` completed optimizer steps."""
        if self.prores.saturated(step) and self.multiplier == 1.0:
            self.alpha = None
        else:
            device = self.mlp.linear_fc2.weight.device
            self.alpha = torch.tensor(self.prores.alpha(self.layer_number, step) * self.multiplier,
                                      dtype=torch.float32, device=device)

    def _drop(self, out: torch.Tensor) -> torch.Tensor:
        return F.dropout(out, self.dropout, self.training) if self.dropout else out

    def _compute(self, y: torch.Tensor) -> torch.Tensor:
        """A branch's input at the weights' dtype: with model.fp32_residual the stream is fp32 and the
        branches bf16; the residual adds (prores.model.fused) keep the stream's dtype."""
        return y.to(self.mlp.linear_fc2.weight.dtype)

    def attention_branch(self, y: torch.Tensor) -> torch.Tensor:
        out, _ = self.self_attention(self._compute(y), None)  # rotary embedding: in the core attention
        return self._drop(out)

    def mlp_branch(self, y: torch.Tensor) -> torch.Tensor:
        out, _ = self.mlp(self._compute(y))
        return self._drop(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layout.forward(self, x)
