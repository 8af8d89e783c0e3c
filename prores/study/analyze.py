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

from prores.config import load_config
from prores.data.tokenizers import load_tokenizer
from prores.errors import UsageError
from prores.launcher.builders import build_data, model_pieces, prores_schedule
from prores.model.block import Block
from prores.monitor.heatmaps import heatmap, png, rgb
from prores.parallel import topology
from prores.parallel.consolidate import consolidated_weights
from prores.run.checkpoint import Checkpoints


def _load(pieces: list, specs: list, weights: dict[str, torch.Tensor]) -> None:
    """A tied piece's weights are saved once, under the first piece of its tie."""
    first = {}
    for i, spec in enumerate(specs):
        first.setdefault(spec.tie_key, i)
    for i, (piece, spec) in enumerate(zip(pieces, specs)):
        owner = first[spec.tie_key] if spec.tie_key else i
        piece.load_state_dict({name: weights[f"{owner:02d}/{name}"] for name, _ in piece.named_parameters()})


@torch.no_grad()
def _block_outputs(pieces: list, tokens: torch.Tensor, step: int) -> dict[int, torch.Tensor]:
    """Every block's output for ``tokens``, with the alpha of ``step`` (the pieces after the last block
    are not needed)."""
    outputs, h = {}, tokens
    for piece in pieces:
        if isinstance(piece, Block):
            piece.set_step(step)
            outputs[piece.layer_number] = h = piece(h)
        elif not outputs:
            h = piece(h)
    return outputs


def analyze(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.yaml); give the --run-dir of a run.")
    cfg = load_config(run_dir / "config.yaml")
    steps = [found.step for found in Checkpoints(run_dir).complete()]
    if len(steps) < 2:
        have = "no complete checkpoint" if not steps else f"one checkpoint (step {steps[0]}), nothing to compare it with"
        raise UsageError(f"{run_dir} has {have}; keep checkpoints along a run with checkpoint.interval (and"
                         " checkpoint.keep_every, or checkpoint.keep_last=0, so that they stay).")
    topology.init(1, 1)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    probe = build_data(cfg, run_dir, tokenizer).valid[0][0]
    m = cfg.model
    specs = model_pieces(cfg, tokenizer.vocab_size, prores_schedule(cfg))
    pieces = [s.cls(**s.kwargs).eval() for s in specs]
    outputs = {}
    for step in [steps[-1]] + steps[:-1]:
        _load(pieces, specs, consolidated_weights(run_dir / "checkpoints" / f"global_step{step}", pieces))
        outputs[step] = _block_outputs(pieces, probe, step)
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
