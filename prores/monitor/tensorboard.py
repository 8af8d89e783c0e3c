"""TensorBoard event files in the run directory, written only by the rank that owns each number.

Tags (layer numbers are global, 1-based, 3 digits):
``train/loss``, ``train/lr``, ``train/samples``, ``train/grad_norm`` (before clipping), ``train/tokens_per_sec``,
``valid/loss``, ``valid/ppl``, ``prores/alpha/layer_XXX``, ``layers/act_rms/layer_XXX``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping


def layer_tag(prefix: str, layer: int) -> str:
    return f"{prefix}/layer_{layer:03d}"


def mark_resume(run_dir: Path, step: int) -> None:
    """Once per resume, before the resumed run's writers open: an event file holding only a
    SessionLog.START at ``step``, so TensorBoard drops whatever the interrupted run logged at
    steps >= ``step`` in the files read before it. Files are read in name order, and names start
    with the creation second: the resumed writers must open in a later second (the caller waits).
    One marker, not one per writer: a marker read after another writer's resumed file would purge
    that file's new events too."""
    from torch.utils.tensorboard import SummaryWriter

    SummaryWriter(log_dir=str(run_dir), purge_step=step, filename_suffix=".resume").close()


class RunWriter:
    """A SummaryWriter for ranks that own numbers; a no-op elsewhere.

    Several ranks may write into one run directory: each gets its own event
    file (suffix ``.rankN``) and TensorBoard merges them.
    """

    def __init__(self, run_dir: Path, rank: int, owns_loss: bool, owns_layers: bool):
        self.owns_loss, self.owns_layers = owns_loss, owns_layers
        self._writer = None
        if owns_loss or owns_layers:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(run_dir), filename_suffix=f".rank{rank}")

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        if self._writer is not None:
            for tag, value in values.items():
                self._writer.add_scalar(tag, value, step)

    def loss_scalars(self, values: Mapping[str, float], step: int) -> None:
        if self.owns_loss:
            self.scalars(values, step)

    def layer_scalars(self, prefix: str, per_layer: Mapping[int, float], step: int) -> None:
        if self.owns_layers:
            self.scalars({layer_tag(prefix, l): v for l, v in per_layer.items()}, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
