"""`prores analyze RUN_DIR`: how each layer's representation evolves over the run's kept checkpoints.

One fixed probe batch (the first validation micro-batch) goes through the model of every complete
checkpoint, each with the alpha of its own step, in this one process; each block's output is compared
with the same block's output at the final checkpoint, as the mean over tokens of their cosine (the
ProRes paper's representation-evolution figure). Checkpoints of any tp and pp are read through
:mod:`prores.parallel.consolidate`. Writes ``RUN_DIR/analysis/cosine.csv`` (a row per checkpoint step,
a column per layer), ``cosine.png``, and the same picture as the TensorBoard image ``analysis/cosine``
(the event file is in ``analysis/``). Keep checkpoints along the run with ``checkpoint.interval`` and
``checkpoint.keep_every``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
import torch.nn.functional as F

from prores.errors import UsageError
from prores.launcher.builders import build_data
from prores.launcher.restore import OneProcessModel, checkpoint_steps, run_config
from prores.model.block import Block
from prores.monitor.heatmaps import heatmap, png, rgb


@torch.no_grad()
def _block_outputs(pieces: list, tokens: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every block's output for ``tokens`` (the pieces after the last block are not needed)."""
    outputs, h = {}, tokens
    for piece in pieces:
        if isinstance(piece, Block):
            outputs[piece.layer_number] = h = piece(h)
        elif not outputs:
            h = piece(h)
    return outputs


def analyze(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    steps = checkpoint_steps(run_dir)
    if len(steps) < 2:
        have = "no complete checkpoint" if not steps else f"one checkpoint (step {steps[0]}), nothing to compare it with"
        raise UsageError(f"{run_dir} has {have}; keep checkpoints along a run with checkpoint.interval (and"
                         " checkpoint.keep_every, checkpoint.keep_steps or checkpoint.keep_last=0, so that they"
                         " stay).")
    model = OneProcessModel.of(run_dir)
    probe = build_data(cfg, run_dir, model.tokenizer).valid[0][0]
    m = cfg.model
    outputs = {}
    for step in [steps[-1]] + steps[:-1]:
        outputs[step] = _block_outputs(model.load(run_dir, step).pieces, probe)
        if step != steps[-1]:  # only the final outputs are kept whole
            outputs[step] = {l: F.cosine_similarity(out.float(), outputs[steps[-1]][l].float(), dim=-1).mean().item()
                             for l, out in outputs[step].items()}
    outputs[steps[-1]] = {l: 1.0 for l in outputs[steps[-1]]}
    layers = range(1, m.num_layers + 1)
    out_dir = run_dir / "analysis"
    out_dir.mkdir(exist_ok=True)
    with open(out_dir / "cosine.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["step"] + [f"layer_{l:03d}" for l in layers])
        for step in steps:
            writer.writerow([step] + [repr(outputs[step][l]) for l in layers])
    values = [[outputs[step][l] for step in steps] for l in layers]
    fig = heatmap(values, steps, title="cosine of each layer's output to its final-checkpoint output",
                  xlabel="checkpoint step", label="cosine", log=False, vmax=1.0)
    (out_dir / "cosine.png").write_bytes(png(fig))
    from torch.utils.tensorboard import SummaryWriter

    for old in out_dir.glob("events.out.tfevents.*"):  # an analysis is redone whole, never appended to
        old.unlink()
    with SummaryWriter(log_dir=str(out_dir)) as tb:
        tb.add_image("analysis/cosine", rgb(fig), steps[-1], dataformats="HWC")
    return out_dir
