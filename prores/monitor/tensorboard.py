"""TensorBoard event files in the run directory: written only by the rank that owns each number
(:class:`RunWriter`), read back by the study tools (:func:`read_scalars`).

Layer numbers in tags are global, 1-based, 3 digits (``layer_001``). The tags
themselves are listed in the manual's monitoring page (docs/monitoring.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Union

# Per-layer families: one multiline chart each in the Custom Scalars tab.
LAYER_FAMILIES = ("prores/alpha", "layers/act_rms", "layers/cos_in_out", "layers/grad_norm", "layers/update_ratio",
                  "layers/gain")


def layer_tag(prefix: str, layer: Union[int, str]) -> str:
    """``prefix/layer_007`` for block 7; ``prefix/embedding`` for a piece that is not a block."""
    return f"{prefix}/layer_{layer:03d}" if isinstance(layer, int) else f"{prefix}/{layer}"


def mark_resume(run_dir: Path, step: int) -> None:
    """Once per resume, before the resumed run's writers open: an event file holding only a
    SessionLog.START at ``step``, so TensorBoard drops whatever the interrupted run logged at
    steps >= ``step`` in the files read before it. Files are read in name order, and names start
    with the creation second: the resumed writers must open in a later second (the caller waits).
    One marker, not one per writer: a marker read after another writer's resumed file would purge
    that file's new events too."""
    from torch.utils.tensorboard import SummaryWriter

    SummaryWriter(log_dir=str(run_dir), purge_step=step, filename_suffix=".resume").close()


def custom_scalars_layout(has_gains: bool) -> dict:
    """Each per-layer family the run logs as one multiline chart (TensorBoard's Custom Scalars tab); a
    method without residual gains logs no ``layers/gain``."""
    families = [f for f in LAYER_FAMILIES if has_gains or f != "layers/gain"]
    return {"per layer": {family: ["Multiline", [f"^{family}/.*"]] for family in families}}


class RunWriter:
    """A SummaryWriter for ranks that own numbers; a no-op elsewhere.

    Several ranks may write into one run directory: each gets its own event
    file (suffix ``.rankN``) and TensorBoard merges them. A stage writer also
    keeps the per-block series it wrote (``history[family][step][layer]``), for
    the heatmaps.

    ``held`` (rank 0: still the run lock's holder?) is asked before each event is
    handed to the writer's thread, whichever thread hands it (the heatmaps' painter
    draws on its own): a holder frozen past its lease and continued writes no event
    into a directory that may be another's now. The local writer thread writes each
    event as it takes it, within milliseconds, so what it holds at a freeze is all
    that can still reach the file.
    """

    def __init__(self, run_dir: Path, rank: int, owns_loss: bool, owns_layers: bool,
                 held: Callable[[], bool] = lambda: True):
        self.owns_loss, self.owns_layers, self.held = owns_loss, owns_layers, held
        self.history: dict[str, dict[int, dict[int, float]]] = {}
        self._writer = None
        if owns_loss or owns_layers:
            from torch.utils.tensorboard import SummaryWriter

            # a queue that holds a stats step's events: a full one makes each write wait for the writer's thread
            self._writer = SummaryWriter(log_dir=str(run_dir), filename_suffix=f".rank{rank}", max_queue=1000)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """All of ``values`` as one event (TensorBoard reads it as it reads one event a value): add_scalar's
        event a value costs ~50 µs of the step each, and a stats step writes hundreds of values."""
        if self._writer is not None and values and self.held():
            from tensorboard.compat.proto.summary_pb2 import Summary

            summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
            self._writer.file_writer.add_summary(summary, step)

    def loss_scalars(self, values: Mapping[str, float], step: int) -> None:
        if self.owns_loss:
            self.scalars(values, step)

    def layer_scalars(self, prefix: str, per_layer: Mapping[Union[int, str], float], step: int) -> None:
        if self.owns_layers:
            self.scalars({layer_tag(prefix, l): v for l, v in per_layer.items()}, step)
            blocks = {l: v for l, v in per_layer.items() if isinstance(l, int)}
            if blocks:
                self.history.setdefault(prefix, {}).setdefault(step, {}).update(blocks)

    def image(self, tag: str, rgb, step: int) -> None:
        """An [H, W, 3] uint8 image."""
        if self._writer is not None and self.held():
            self._writer.add_image(tag, rgb, step, dataformats="HWC")

    def layout(self, has_gains: bool) -> None:
        if self._writer is not None and self.held():
            self._writer.add_custom_scalars(custom_scalars_layout(has_gains))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read_scalars(run_dir: Path, wanted: Callable[[str], bool] = lambda tag: True) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of every scalar series in ``run_dir``'s event files whose tag ``wanted``
    accepts, as TensorBoard shows them: a resume's marker (:func:`mark_resume`) drops what the run it
    resumed had logged after its checkpoint. Empty where there is no run directory (yet)."""
    from tensorboard.backend.event_processing import event_accumulator

    if not Path(run_dir).is_dir():
        return {}
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"] if wanted(t)}
