"""Per-layer activation statistics through forward hooks: the model code knows nothing of them.

While :attr:`LayerStats.active`, every forward of a watched block adds the
mean square of its output to an on-device accumulator; nothing syncs with the
host until :meth:`LayerStats.collect`, so an active step costs one small
reduction per block and no stall.
"""

from __future__ import annotations

import torch
from torch import nn


class LayerStats:
    def __init__(self, blocks: dict[int, nn.Module]):
        self.active = False
        self._sum: dict[int, torch.Tensor] = {}
        self._count: dict[int, int] = {}
        self._handles = [block.register_forward_hook(self._hook(layer)) for layer, block in blocks.items()]

    def _hook(self, layer: int):
        def hook(module, inputs, output):
            if self.active:
                sq = output.detach().float().square().mean()
                self._sum[layer] = self._sum[layer] + sq if layer in self._sum else sq
                self._count[layer] = self._count.get(layer, 0) + 1

        return hook

    def collect(self) -> dict[int, float]:
        """RMS of each block's output, averaged over the forwards since the last collect."""
        rms = {l: float((s / self._count[l]).sqrt()) for l, s in sorted(self._sum.items())}
        self._sum.clear()
        self._count.clear()
        return rms

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
