"""The runs of a study, read back from their run directories: grid values, state, resolved config,
summary and the event files' scalars, grouped by cell."""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from prores.config import load_config
from prores.errors import UsageError
from prores.monitor.tensorboard import read_scalars
from prores.run.evals import newest_metrics
from prores.run.summary import read_summary
from prores.study.state import cell_state
from prores.study.sweep import read_cells

DEPTH = "model.num_layers"
SEED = "train.seed"


@dataclass
class Run:
    name: str
    run_dir: Path
    grid: dict  # the values that tell this run from the others (seed apart)
    seed: Optional[int]
    state: str
    config: dict = field(default_factory=dict)  # flat, resolved
    summary: dict = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)  # tag -> {step: value}
    evals: dict = field(default_factory=dict)  # "<task>/<metric>" -> value, of its newest evaluation

    @property
    def completed(self) -> bool:
        return self.state == "completed"

    @property
    def depth(self) -> Optional[int]:
        """From the resolved config, or, for a cell that failed before it wrote one, from its grid values."""
        return self.config.get(DEPTH, self.grid.get(DEPTH))

    def last(self, prefix: str) -> dict[int, float]:
        """The last logged value of each layer of a per-layer family."""
        return {int(tag.rsplit("_", 1)[1]): values[max(values)] for tag, values in self.scalars.items()
                if tag.startswith(prefix + "/layer_")}


READ = ("valid/loss", "train/loss", "train/grad_norm")  # and the per-layer families below
READ_FAMILIES = ("layers/act_rms/", "prores/alpha/")


def _read_events(run_dir: Path) -> dict:
    return read_scalars(run_dir, lambda t: t in READ or t.startswith(READ_FAMILIES))


def _flat_config(run_dir: Path) -> dict:
    path = run_dir / "config.yaml"
    return load_config(path).flat() if path.is_file() else {}


def collect(targets: list[Path]) -> tuple[list[Run], list[str], Optional[str]]:
    """The runs, the grid keys (in order) and, for a sweep still running, what is missing."""
    if len(targets) == 1 and (targets[0] / "cells.jsonl").is_file():
        sweep_dir = targets[0]
        cells = read_cells(sweep_dir)
        keys = [k for k in cells[0].grid if k != SEED]
        runs = []
        for cell in cells:
            run_dir = Path(cell.run_dir)
            runs.append(Run(cell.name, run_dir, {k: cell.grid[k] for k in keys}, cell.grid.get(SEED),
                            cell_state(sweep_dir, cell).state, _flat_config(run_dir), read_summary(run_dir) or {},
                            _read_events(run_dir), newest_metrics(run_dir)[1]))
        unfinished = [r for r in runs if r.state not in ("completed", "diverged", "failed", "stopped")]
        counts = {}
        for r in runs:
            counts[r.state] = counts.get(r.state, 0) + 1
        note = None if not unfinished else (
            f"**In progress**: {', '.join(f'{n} {s}' for s, n in sorted(counts.items()))} of {len(runs)} cells;"
            " this report shows what exists so far.")
        return runs, keys, note
    missing = [str(t) for t in targets if not (t / "config.yaml").is_file()]
    if missing:
        raise UsageError(f"not run directories (no config.yaml): {', '.join(missing)}; give a sweep directory"
                         " (with cells.jsonl) or run directories.")
    configs = {t: _flat_config(t) for t in targets}
    keys = [k for k in next(iter(configs.values())) if k != SEED
            and len({yaml.safe_dump(c.get(k)) for c in configs.values()}) > 1]
    runs = []
    for t, config in configs.items():
        summary = read_summary(t) or {}
        runs.append(Run(t.name, t, {k: config[k] for k in keys}, config.get(SEED), summary.get("status", "unknown"),
                        config, summary, _read_events(t), newest_metrics(t)[1]))
    return runs, keys, None


def from_results(results_csv: Path, spec_file: str) -> list[Run]:
    """The runs of a kept ``results.csv`` whose run directories are gone: each row's status and final loss, its
    resolved config rebuilt from the sweep spec that made it (its cell by name). Enough for what depends only on
    final losses (the loss claims, the on/off table); no event, analysis or evaluation is read back."""
    from prores.config import load_config
    from prores.study.sweep import expand

    cells = {c.name: c for c in expand(spec_file)[1]}
    runs = []
    for row in csv.DictReader(Path(results_csv).open()):
        cell = cells.get(row["name"])
        if cell is None:
            raise UsageError(f"{results_csv}: run {row['name']} is no cell of {spec_file}; give the spec that made it.")
        summary = {"status": row["status"], "steps": int(row["steps"]) if row["steps"] else None,
                   "final_valid_loss": float(row["final_valid_loss"]) if row["final_valid_loss"] else None}
        runs.append(Run(cell.name, Path(cell.run_dir), {k: v for k, v in cell.grid.items() if k != SEED},
                        cell.grid.get(SEED), row["status"], load_config(cell.base, tuple(cell.overrides)).flat(),
                        summary))
    return runs


def ppl(loss: Optional[float]) -> Optional[float]:
    return None if loss is None else math.exp(min(loss, 50.0))


def mean_spread(values: list[float], digits: int = 4) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def state_text(runs: list[Run]) -> str:
    parts = []
    for state in sorted({r.state for r in runs}):
        group = [r for r in runs if r.state == state]
        at = [str(r.summary["diverged_at"]) for r in group if r.summary.get("diverged_at") is not None]
        parts.append(f"{state} {len(group)}" + (f" (at step {', '.join(at)})" if at else ""))
    return ", ".join(parts)


def groups(runs: list[Run], keys: list[str]) -> dict[tuple, list[Run]]:
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(tuple(yaml.safe_dump(r.grid[k]) for k in keys), []).append(r)
    return groups
