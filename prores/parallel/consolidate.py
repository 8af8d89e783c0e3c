"""Full (unsharded) weights from a DeepSpeed pipeline checkpoint, whatever its tp and pp.

DeepSpeed writes one file per pipeline piece and tensor-parallel rank,
``layer_{piece:02d}-model_{tp_rank:02d}-model_states.pt``. The pieces, built
at any tp in this process, supply the Megatron partition attributes that say
how to glue the shards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from prores.model.sharding import unshard


def consolidated_weights(tag_dir: Path, pieces: Sequence[nn.Module]) -> dict[str, torch.Tensor]:
    """``{"<piece index>/<parameter name>": full tensor}`` for every piece saved in ``tag_dir``."""
    weights = {}
    for index, module in enumerate(pieces):
        files = sorted(Path(tag_dir).glob(f"layer_{index:02d}-model_*-model_states.pt"))
        if not files:
            continue  # a tied piece is saved once, under its first index
        shards = [torch.load(f, map_location="cpu", weights_only=True) for f in files]
        for name, param in module.named_parameters():
            weights[f"{index:02d}/{name}"] = unshard([s[name] for s in shards], param)
    return weights
