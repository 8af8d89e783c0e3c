"""A GPT as an ordered list of pieces: embedding, blocks, (final norm), head.

The pieces are plain (class, kwargs) pairs so that the same list builds a
single-process model or a DeepSpeed pipeline in which each stage builds only
its own pieces. Activations between pieces are [s, b, h].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from megatron.core import tensor_parallel
from megatron.core.tensor_parallel import ColumnParallelLinear, VocabParallelEmbedding

from prores.model.attention import megatron_config
from prores.model.block import Block
from prores.model import fused
from prores.model.init import init_piece
from prores.model.layouts import LAYOUTS
from prores.model.norm import Norm
from prores.model.prores import ProRes
from prores.model.size import padded_vocab_size


class Embedding(nn.Module):
    """Tokens [b, s] -> hidden [s, b, h]. Layer index 0. In a stack with no norm to set the scale of the
    stream and the logits, the output is multiplied by √h: a learnable scalar from √h with DyT (the DyT
    paper's LLaMA runs), the Transformer's fixed √d_model (Vaswani et al. 2017, §3.4) with ReZero."""

    def __init__(self, model_cfg, vocab_size: int, seed: int, tp: tuple[int, int] = (0, 1)):
        super().__init__()
        config = megatron_config(model_cfg)
        self.dropout = model_cfg.dropout
        self.fp32_residual = model_cfg.fp32_residual
        self.word_embeddings = VocabParallelEmbedding(vocab_size, model_cfg.hidden_size,
                                                      init_method=config.init_method, config=config)
        self.position_embeddings = nn.Embedding(model_cfg.seq_length, model_cfg.hidden_size) \
            if model_cfg.position == "learned" else None
        dyt, norm_free = model_cfg.norm == "dyt", LAYOUTS[model_cfg.norm_layout].embedding_scale
        self.scale_init = math.sqrt(model_cfg.hidden_size) if dyt or norm_free else 1.0
        self.scale = nn.Parameter(torch.full((1,), self.scale_init)) if dyt else self.scale_init
        init_piece(self, model_cfg, 0, seed, tp)

    def initial_values(self) -> dict[str, float]:
        return {"scale": self.scale_init} if isinstance(self.scale, nn.Parameter) else {}

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.word_embeddings(tokens)
        if self.position_embeddings is not None:
            h = h + self.position_embeddings.weight[: tokens.shape[1]]
        if self.scale_init != 1.0:
            h = h * self.scale
        h = h.transpose(0, 1).contiguous()
        if self.fp32_residual:  # the residual stream starts here
            h = h.float()
        return F.dropout(h, self.dropout, self.training) if self.dropout else h


def tied_head_forward(embedding: Embedding, hidden: torch.Tensor) -> torch.Tensor:
    """The head when embeddings are tied: logits from the (vocab-parallel) embedding weight."""
    weight = embedding.word_embeddings.weight
    hidden = tensor_parallel.copy_to_tensor_model_parallel_region(hidden.to(weight.dtype))
    return F.linear(hidden, weight)


class FinalNorm(nn.Module):
    """The norm after the last block of pre-style layouts. Layer index L+1."""

    layer_index = staticmethod(lambda model_cfg: model_cfg.num_layers + 1)

    def __init__(self, model_cfg, seed: int, backend: str = "eager", tp: tuple[int, int] = (0, 1)):
        super().__init__()
        self.ops = fused.ops(backend)
        self.norm = Norm(model_cfg.norm, model_cfg.hidden_size, model_cfg.norm_eps, dyt_init=model_cfg.dyt_init)
        init_piece(self, model_cfg, self.layer_index(model_cfg), seed, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.norm(x, self.norm)


class EmbeddingNorm(FinalNorm):
    """The norm on the embedding's output of layouts that have one (Peri-LN). Layer index 0."""

    layer_index = staticmethod(lambda model_cfg: 0)


class Head(nn.Module):
    """Hidden [s, b, h] -> vocab-parallel logits [s, b, V/tp]. Layer index L+1."""

    def __init__(self, model_cfg, vocab_size: int, seed: int, tp: tuple[int, int] = (0, 1)):
        super().__init__()
        config = megatron_config(model_cfg)
        self.linear = ColumnParallelLinear(model_cfg.hidden_size, vocab_size, config=config,
                                           init_method=config.init_method, bias=False, gather_output=False)
        init_piece(self, model_cfg, model_cfg.num_layers + 1, seed, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.to(self.linear.weight.dtype))[0]


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits [s, b, V/tp], labels [b, s]."""
    return tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels.t().contiguous()).mean()


@dataclass(frozen=True)
class Piece:
    cls: type
    kwargs: dict = field(default_factory=dict)
    tie_key: Optional[str] = None  # pieces sharing a key share their weight ...
    tied_attr: Optional[str] = None  # ... this one
    tied_forward: Optional[Callable] = None


def gpt_pieces(model_cfg, prores: ProRes, vocab_size: int, seed: int, backend: str = "eager",
               tp: tuple[int, int] = (0, 1)) -> list[Piece]:
    """``backend`` is a resolved :mod:`prores.model.fused` backend name; ``tp`` is (rank, size) of this
    process's tensor-parallel group, which every piece's init cuts its shard for."""
    vocab = padded_vocab_size(vocab_size, model_cfg.vocab_multiple)
    embed_kwargs = dict(model_cfg=model_cfg, vocab_size=vocab, seed=seed, tp=tp)
    tie = "embed" if model_cfg.tie_embeddings else None
    tied = dict(tie_key=tie, tied_attr="word_embeddings.weight" if tie else None)
    layout = LAYOUTS[model_cfg.norm_layout]
    pieces = [Piece(Embedding, embed_kwargs, **tied)]
    if layout.embedding_norm:
        pieces.append(Piece(EmbeddingNorm, dict(model_cfg=model_cfg, seed=seed, backend=backend, tp=tp)))
    pieces += [Piece(Block, dict(model_cfg=model_cfg, prores=prores, layer=l, seed=seed, backend=backend, tp=tp))
               for l in range(1, model_cfg.num_layers + 1)]
    if layout.final_norm:
        pieces.append(Piece(FinalNorm, dict(model_cfg=model_cfg, seed=seed, backend=backend, tp=tp)))
    if tie:
        pieces.append(Piece(Embedding, embed_kwargs, **tied, tied_forward=tied_head_forward))
    else:
        pieces.append(Piece(Head, dict(model_cfg=model_cfg, vocab_size=vocab, seed=seed, tp=tp)))
    return pieces
