"""The run's scalars in TensorBoard: ``train/*`` every ``train.log_interval`` steps (and the last),
``valid/*`` and ``eval/*`` at every evaluation, ``prores/alpha/layer_XXX`` as the blocks applied it,
and, once per run, the Custom Scalars layout that shows each per-layer family as one chart."""

from __future__ import annotations

from prores.model.layouts import LAYOUTS
from prores.run.callbacks import Callback


class LogScalars(Callback):
    def on_start(self, trainer) -> None:
        if trainer.step == 0 and trainer.topo.rank == 0:
            trainer.writer.layout(has_gains=bool(LAYOUTS[trainer.cfg.model.norm_layout].gains))

    def post_step(self, trainer, step: int, metrics: dict) -> None:
        if trainer.log_due(step):
            trainer.writer.loss_scalars(metrics, step)
            trainer.writer.layer_scalars("prores/alpha", trainer.prores.applied(), step)

    def post_eval(self, trainer, step: int, metrics: dict) -> None:
        trainer.writer.loss_scalars(metrics, step)
