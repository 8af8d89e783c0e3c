"""Layer × step heatmaps: a 120-layer family in one picture.

:func:`heatmap` draws with matplotlib's object API on the Agg canvas (no
pyplot, no display): layer on the y axis (1..L), step on the x axis, a log
colour scale with its colour bar; zeros and gaps are grey. The
:class:`Heatmaps` callback refreshes ``heatmaps/act_rms``,
``heatmaps/grad_norm``, ``heatmaps/alpha`` and, for a method with learnable gains, ``heatmaps/gain``
at every evaluation: the first
rank gathers the stage writers' series over the pipeline group and hands them to
a :class:`Painter`, which draws and writes the pictures as TensorBoard images on a
thread of its own, off the training step; the run's end waits for the last ones.
"""

from __future__ import annotations

import atexit
import io
import threading
import time
from typing import Callable, Optional, Sequence

import numpy
import torch.distributed as dist
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from megatron.core import parallel_state

from prores.run.callbacks import Callback

FAMILIES = {"act_rms": "layers/act_rms", "grad_norm": "layers/grad_norm", "alpha": "prores/alpha", "gain": "layers/gain"}


def _edges(columns: Sequence[float]) -> numpy.ndarray:
    """Column j spans [columns[j], columns[j + 1]): a value holds from its step until the next one, and the
    picture starts at the first step (the last column is as wide as the one before it)."""
    c = numpy.asarray(columns, dtype=float)
    last = c[-1] + (c[-1] - c[-2] if len(c) > 1 else 1.0)
    return numpy.append(c, last)


def heatmap(values: numpy.ndarray, columns: Sequence[float], *, title: str, xlabel: str, label: str,
            log: bool = True, vmin: Optional[float] = None, vmax: Optional[float] = None) -> Figure:
    """``values[l - 1, j]`` is layer l at ``columns[j]``; NaN (and, on a log scale, values <= 0) are grey."""
    values = numpy.asarray(values, dtype=float)
    bad = ~numpy.isfinite(values) | ((values <= 0) if log else False)
    shown = numpy.ma.masked_array(values, mask=bad)
    good = values[~bad]
    lo = vmin if vmin is not None else (good.min() if good.size else 1.0)
    hi = vmax if vmax is not None else (good.max() if good.size else 1.0)
    hi = hi if hi > lo else lo * 1.01 + 1e-12
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = colormaps["viridis"].with_extremes(bad="0.8")
    mesh = ax.pcolormesh(_edges(columns), numpy.arange(values.shape[0] + 1) + 0.5, shown,
                         norm=LogNorm(lo, hi) if log else Normalize(lo, hi), cmap=cmap, shading="flat")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("layer")
    ax.set_ylim(0.5, values.shape[0] + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    fig.colorbar(mesh, ax=ax, label=label)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.12, top=0.92)  # tight_layout measured every label: slow
    return fig


def rgb(fig: Figure) -> numpy.ndarray:
    """The figure as an [H, W, 3] uint8 image."""
    fig.canvas.draw()
    return numpy.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def png(fig: Figure) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def series_matrix(series: dict[int, dict[int, float]], num_layers: int) -> tuple[numpy.ndarray, list[int]]:
    """``{step: {layer: value}}`` as a [layers, steps] matrix (NaN where a layer has no value)."""
    steps = sorted(series)
    matrix = numpy.full((num_layers, len(steps)), numpy.nan)
    for j, step in enumerate(steps):
        for layer, value in series[step].items():
            matrix[layer - 1, j] = value
    return matrix, steps


class Painter:
    """Draws pictures on a thread of its own and writes them: the training step only hands over the numbers.
    Of the pictures of one tag still waiting, only the newest is drawn (each holds the whole history). After
    each picture it rests ``1/SHARE - 1`` times as long as the picture took, so drawing takes at most SHARE of
    one core whatever the model's depth or the evaluation interval; the run's end draws what is waiting."""

    SHARE = 0.005  # of one core: at 48 blocks a picture every ~20 s, still one per default evaluation

    def __init__(self, writer):
        self.writer, self.pending, self.closed, self.drawing = writer, {}, False, False
        self.rest_until = self.paused_at = 0.0
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._draw, name="prores-heatmaps", daemon=True)
        self.thread.start()
        atexit.register(self.close)  # a process that ends without on_end must not end mid-picture

    def submit(self, tag: str, draw: Callable[[], Figure], step: int) -> None:
        with self.changed:
            self.pending[tag] = (draw, step)
            self.changed.notify_all()

    def _draw(self) -> None:
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.pending or self.closed)
                if not self.pending:
                    return
                tag = next(iter(self.pending))
                draw, step = self.pending.pop(tag)
                self.drawing = True
            start = time.perf_counter()
            self.writer.image(tag, rgb(draw()), step)
            end = time.perf_counter()
            with self.changed:
                self.drawing = False
                self.rest_until = end + (end - start) * (1 / self.SHARE - 1)
                self.changed.notify_all()
                while not self.closed and self.rest_until > time.perf_counter():
                    self.changed.wait(self.rest_until - time.perf_counter())

    def pause(self) -> None:
        """Wait for the picture being drawn, then draw nothing until :meth:`resume` (a benchmark's off arm)."""
        self.changed.acquire()
        self.changed.wait_for(lambda: not self.drawing)
        self.paused_at = time.perf_counter()

    def resume(self) -> None:
        self.rest_until += time.perf_counter() - self.paused_at  # a pause is no rest: the share is of the time run
        self.changed.release()

    def close(self) -> None:
        """Draw what is waiting, then stop (again: nothing)."""
        with self.changed:
            self.closed = True
            self.changed.notify_all()
        self.thread.join()


class Heatmaps(Callback):
    name = "heatmaps"

    def __init__(self):
        self.series: dict[str, dict[int, dict[int, float]]] = {family: {} for family in FAMILIES.values()}
        self.sent: dict[str, int] = {}  # per family: the last step this rank has sent
        self.painter: Optional[Painter] = None

    def on_start(self, trainer) -> None:
        if trainer.topo.rank == 0:
            self.painter = Painter(trainer.writer)

    def on_end(self, trainer, summary) -> None:
        if self.painter is not None:
            self.painter.close()

    def post_eval(self, trainer, step: int, metrics: dict) -> None:
        history = trainer.writer.history
        new = {}
        for family in FAMILIES.values():
            last = self.sent.get(family, -1)
            new[family] = {s: v for s, v in history.get(family, {}).items() if s > last}
            if new[family]:
                self.sent[family] = max(new[family])
        group = parallel_state.get_pipeline_model_parallel_group()
        first = dist.get_process_group_ranks(group)[0]
        parts = [None] * dist.get_world_size(group) if trainer.topo.rank == first else None
        dist.gather_object(new, parts, dst=first, group=group)
        if trainer.topo.rank != 0:
            return
        for part in parts:
            for family, by_step in part.items():
                for s, values in by_step.items():
                    self.series[family].setdefault(s, {}).update(values)
        for name, family in FAMILIES.items():
            if self.series[family]:
                matrix, steps = series_matrix(self.series[family], trainer.cfg.model.num_layers)
                self.painter.submit(f"heatmaps/{name}", lambda m=matrix, s=steps, f=family, n=name: heatmap(
                    m, s, title=f"{f} (step {step})", xlabel="step", label=n), step)

    def state_dict(self) -> dict:
        return {"series": self.series}

    def load_state_dict(self, state: dict) -> None:
        self.series = {family: state["series"].get(family, {}) for family in FAMILIES.values()}
