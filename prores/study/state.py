"""What a sweep's cells have done, from their run directories and the runners' start records.

A runner records each start of a cell in ``<sweep>/state/<cell>.json`` (the host and the pid, or the
Slurm job; the local runner adds the exit status). A cell's state:

* ``completed``, ``stopped`` or ``diverged``: its ``summary.json`` says so;
* ``running``: started and its process or Slurm job is alive;
* ``failed``: started, gone, no summary, and (unless the runner saw it exit 0) no checkpoint to resume;
* ``stopped`` too when it left checkpoints but no summary (killed: a re-run resumes it);
* ``pending``: never started.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from prores.monitor.tensorboard import read_scalars
from prores.run.summary import read_summary
from prores.study.sweep import Cell, read_cells

FINAL = ("completed", "diverged")  # a re-run skips these


def record_path(sweep_dir: Path, cell: Cell) -> Path:
    return Path(sweep_dir) / "state" / f"{cell.name}.json"


def record_start(sweep_dir: Path, cell: Cell, **where) -> None:
    path = record_path(sweep_dir, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": socket.gethostname(), "returncode": None, **where}))


def record_exit(sweep_dir: Path, cell: Cell, returncode: int) -> None:
    path = record_path(sweep_dir, cell)
    path.write_text(json.dumps(json.loads(path.read_text()) | {"returncode": returncode}))


def _alive(record: dict) -> bool:
    if "job" in record:
        if not shutil.which("squeue"):
            return True  # cannot tell: assume the job is queued or running
        out = subprocess.run(["squeue", "-h", "-j", record["job"]], capture_output=True, text=True)
        return bool(out.stdout.strip())
    if record["host"] != socket.gethostname():
        return True  # another machine's process: cannot tell
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def finished(cell: Cell) -> bool:
    """Completed or diverged: a re-run skips it."""
    return (read_summary(Path(cell.run_dir)) or {}).get("status") in FINAL


@dataclass
class CellState:
    state: str
    step: Optional[int] = None
    loss: Optional[float] = None


def last_loss(run_dir: Path) -> tuple[Optional[int], Optional[float]]:
    losses = read_scalars(run_dir, lambda tag: tag == "train/loss").get("train/loss")
    if not losses:
        return None, None
    last = max(losses)
    return last + 1, losses[last]  # the loss at TensorBoard step t is that of step t + 1's update


def cell_state(sweep_dir: Path, cell: Cell) -> CellState:
    run_dir = Path(cell.run_dir)
    step, loss = last_loss(run_dir)
    summary = read_summary(run_dir)
    if summary is not None:
        return CellState(summary["status"], summary["steps"], loss)
    try:
        record = json.loads(record_path(sweep_dir, cell).read_text())
    except (OSError, ValueError):
        return CellState("pending", step, loss)
    if record["returncode"] is None and _alive(record):
        return CellState("running", step, loss)
    resumable = any((run_dir / "checkpoints").glob("global_step*")) if run_dir.is_dir() else False
    return CellState("stopped" if resumable and record["returncode"] in (None, 0) else "failed", step, loss)


def status_table(sweep_dir: Path) -> str:
    """`prores sweep status`: a line per cell (state, step, last training loss), then the counts."""
    rows = [(c, cell_state(sweep_dir, c)) for c in read_cells(sweep_dir)]
    width = max(len(c.name) for c, _ in rows)
    lines = [f"{'cell':<{width}}  {'state':<9}  {'step':>7}  last loss"]
    for cell, st in rows:
        lines.append(f"{cell.name:<{width}}  {st.state:<9}  {'' if st.step is None else st.step:>7}  "
                     + ("" if st.loss is None else f"{st.loss:.4f}"))
    counts = Counter(st.state for _, st in rows)
    return "\n".join(lines + [", ".join(f"{n} {s}" for s, n in sorted(counts.items()))])
