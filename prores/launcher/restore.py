"""A run's model in one process, from any of its checkpoints, whatever tp and pp it trained with: what
`prores analyze`, `prores eval` and `prores export` read. Each block's alpha is that of the checkpoint's step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from prores.config import Config, load_config
from prores.data.tokenizers import load_tokenizer
from prores.errors import UsageError
from prores.launcher.builders import model_pieces, prores_schedule
from prores.model.block import Block
from prores.model.gpt import Piece
from prores.parallel import topology
from prores.parallel.consolidate import consolidated_weights
from prores.run.checkpoint import Checkpoints, tag_of


def run_config(run_dir: Path) -> Config:
    if not (Path(run_dir) / "config.yaml").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.yaml); give the --run-dir of a run.")
    return load_config(Path(run_dir) / "config.yaml")


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the run's complete checkpoints, oldest first."""
    return [found.step for found in Checkpoints(Path(run_dir)).complete()]


@dataclass
class OneProcessModel:
    cfg: Config
    tokenizer: object
    specs: list[Piece]
    pieces: list[torch.nn.Module]
    step: Optional[int] = None  # the checkpoint loaded

    @classmethod
    def of(cls, run_dir: Path) -> "OneProcessModel":
        """The run's model, built in this process (tp = pp = 1), weights not loaded yet."""
        return cls.of_config(run_config(run_dir))

    @classmethod
    def of_config(cls, cfg: Config) -> "OneProcessModel":
        """The model of config ``cfg``, built in this process (tp = pp = 1) with its initial weights."""
        topology.init(1, 1)
        tokenizer = load_tokenizer(cfg.data.tokenizer)
        specs = model_pieces(cfg, tokenizer.vocab_size, prores_schedule(cfg))
        return cls(cfg, tokenizer, specs, [s.cls(**s.kwargs).eval() for s in specs])

    def load(self, run_dir: Path, step: int) -> "OneProcessModel":
        """The weights of checkpoint ``step`` (a tied piece's are saved once, under the first piece of its
        tie) and every block's alpha of that step."""
        weights = consolidated_weights(Path(run_dir) / "checkpoints" / tag_of(step), self.pieces)
        first: dict = {}
        for i, spec in enumerate(self.specs):
            first.setdefault(spec.tie_key, i)
        for i, (piece, spec) in enumerate(zip(self.pieces, self.specs)):
            owner = first[spec.tie_key] if spec.tie_key else i
            piece.load_state_dict({name: weights[f"{owner:02d}/{name}"] for name, _ in piece.named_parameters()})
        for block in self.blocks:
            block.set_step(step)
        self.step = step
        return self

    @property
    def blocks(self) -> list[Block]:
        return [p for p in self.pieces if isinstance(p, Block)]

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """[b, s] token ids -> [b, s, padded vocab] fp32 logits. The padding ids are part of the model's
        distribution, as in its training loss: a softmax over the tokenizer's ids alone would renormalise it."""
        h = tokens
        for spec, piece in zip(self.specs, self.pieces):
            h = spec.tied_forward(piece, h) if spec.tied_forward else piece(h)
        return h.transpose(0, 1).float()


def pick_step(run_dir: Path, step: Optional[int]) -> int:
    """``step``, or the newest complete checkpoint; one error naming those there are."""
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise UsageError(f"{run_dir} has no complete checkpoint to evaluate or export.")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise UsageError(f"{run_dir} has no checkpoint of step {step}; it has {', '.join(map(str, steps))}.")
    return step
