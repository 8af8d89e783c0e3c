"""``RUN/eval/<step>/results.json``: where `prores eval` writes lm-evaluation-harness's results of a checkpoint,
and the metrics in them, for the study tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def results_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "eval" / str(step) / "results.json"


def metrics(results: dict) -> dict[str, float]:
    """``{"<task>/<metric>": value}`` of the harness's ``results``: the numbers, filter names and stderrs dropped."""
    return {f"{task}/{name.split(',')[0]}": float(value) for task, values in results.items()
            for name, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and "_stderr" not in name
            and name.split(",")[0] not in ("sample_len", "samples")}


def newest_metrics(run_dir: Path) -> tuple[Optional[int], dict[str, float]]:
    """The metrics of the run's newest evaluated checkpoint, and its step."""
    steps = sorted(int(p.parent.name) for p in Path(run_dir).glob("eval/*/results.json") if p.parent.name.isdigit())
    if not steps:
        return None, {}
    try:
        return steps[-1], metrics(json.loads(results_path(run_dir, steps[-1]).read_text())["results"])
    except (OSError, ValueError, KeyError):
        return steps[-1], {}
