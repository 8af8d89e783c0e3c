"""What a sweep's cells have done, from their run directories, their locks and the runners' records.

A runner records each start of a cell in ``<sweep>/state/<cell>.json``, written atomically: the local
runner the host, pid and process start time (and the exit status once it is reaped), the Slurm runner
the array task's job id (``JOB_INDEX``) at submission. A cell's state:

* ``running``: a live trainer holds its run directory's lock (:mod:`prores.run.lock`), or its Slurm
  task is running;
* ``queued``: its Slurm task waits in the queue (``squeue``);
* ``completed``, ``stopped`` or ``diverged``: its ``summary.json`` says so;
* ``stopped`` too when it left checkpoints but no summary (killed: a re-run resumes it);
* ``failed``: started, gone, no summary, and (unless the runner saw it exit 0) no checkpoint to resume;
* ``pending``: never started.

A re-run starts only the cells that are neither finished (completed, diverged) nor alive (running,
queued).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from prores.monitor.tensorboard import read_scalars
from prores.run.files import write_atomic
from prores.run.lock import live_holder, process_start, this_host
from prores.run.faults import restarts
from prores.run.summary import read_summary
from prores.study.sweep import Cell, read_cells

FINAL = ("completed", "diverged")  # a re-run skips these
ALIVE = ("running", "queued")  # ... and these


def record_path(sweep_dir: Path, cell: Cell) -> Path:
    return Path(sweep_dir) / "state" / f"{cell.name}.json"


def read_record(sweep_dir: Path, cell: Cell) -> Optional[dict]:
    try:
        return json.loads(record_path(sweep_dir, cell).read_text())
    except (OSError, ValueError):
        return None


def record(sweep_dir: Path, cell: Cell, **fields) -> None:
    """Start a cell's record afresh (``pid=`` for a local process, ``job=`` for a Slurm task)."""
    if "pid" in fields:
        fields |= {"host": this_host(), "start": process_start(fields["pid"])}
    path = record_path(sweep_dir, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"returncode": None} | fields))


def record_exit(sweep_dir: Path, cell: Cell, returncode: int) -> None:
    write_atomic(record_path(sweep_dir, cell), json.dumps((read_record(sweep_dir, cell) or {}) | {"returncode": returncode}))


def slurm_state(job: str) -> Optional[str]:
    """``queued`` or ``running`` while ``squeue`` lists the task, None once it has left the queue."""
    if not shutil.which("squeue"):
        return "queued"  # cannot tell: assume the task still waits
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.split()
    if not out:
        return None
    return "queued" if out[0] in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED") else "running"


def _alive(record: dict) -> Optional[str]:
    """What the record's process or task is doing now, if it still is: ``running``, ``queued`` or None."""
    if record.get("returncode") is not None:
        return None
    if "job" in record:
        return slurm_state(record["job"])
    if record.get("host") == this_host() and process_start(record["pid"]) == record.get("start"):
        return "running"
    return None


def finished(cell: Cell) -> bool:
    """Completed or diverged: a re-run skips it."""
    return (read_summary(Path(cell.run_dir)) or {}).get("status") in FINAL


@dataclass
class CellState:
    state: str
    step: Optional[int] = None
    loss: Optional[float] = None
    restarts: int = 0  # a launcher's restarts after a fault (RUN/attempts.jsonl)


def last_loss(run_dir: Path) -> tuple[Optional[int], Optional[float]]:
    losses = read_scalars(run_dir, lambda tag: tag == "train/loss").get("train/loss")
    if not losses:
        return None, None
    last = max(losses)
    return last + 1, losses[last]  # the loss at TensorBoard step t is that of step t + 1's update


def cell_state(sweep_dir: Path, cell: Cell) -> CellState:
    state = _cell_state(sweep_dir, cell)
    state.restarts = restarts(Path(cell.run_dir))
    return state


def _cell_state(sweep_dir: Path, cell: Cell) -> CellState:
    run_dir = Path(cell.run_dir)
    step, loss = last_loss(run_dir)
    rec = read_record(sweep_dir, cell)
    if live_holder(run_dir) is not None:
        return CellState("running", step, loss)
    alive = _alive(rec) if rec else None
    if alive is not None:
        return CellState(alive, step, loss)
    summary = read_summary(run_dir)
    if summary is not None:
        return CellState(summary["status"], summary["steps"], loss)
    if rec is None:
        return CellState("pending", step, loss)
    resumable = any((run_dir / "checkpoints").glob("global_step*")) if run_dir.is_dir() else False
    return CellState("stopped" if resumable and rec["returncode"] in (None, 0) else "failed", step, loss)


def status_table(sweep_dir: Path) -> str:
    """`prores sweep status`: a line per cell (state, step, last training loss), then the counts."""
    rows = [(c, cell_state(sweep_dir, c)) for c in read_cells(sweep_dir)]
    width = max(len(c.name) for c, _ in rows)
    lines = [f"{'cell':<{width}}  {'state':<9}  {'step':>7}  {'restarts':>8}  last loss"]
    for cell, st in rows:
        lines.append(f"{cell.name:<{width}}  {st.state:<9}  {'' if st.step is None else st.step:>7}  {st.restarts:>8}  "
                     + ("" if st.loss is None else f"{st.loss:.4f}"))
    counts = Counter(st.state for _, st in rows)
    return "\n".join(lines + [", ".join(f"{n} {s}" for s, n in sorted(counts.items()))])
