"""The record of a run's faults and restarts, in files of the run directory (no torch: `prores sweep status`
reads them).

``RUN/attempts.jsonl`` has a line per start of the run (rank 0 writes it): when, from which step, under which
launcher job and restart; ``reached`` (how far a start got, from ``RUN/progress.json``) and ``ended`` (a clean
end) lines follow. A start whose predecessor ended without a clean end follows a fault, whose kind the
predecessor's fault record under ``RUN/faults/`` gives (``hang``: :mod:`prores.run.watchdog`), or, without one,
``rank lost`` (killed, crashed or out of memory). :func:`faults` puts them together for ``summary.json``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

from prores.run.files import write_atomic
from prores.run.restarts import job_id, restart_count

FAULTS, ATTEMPTS, PROGRESS = "faults", "attempts.jsonl", "progress.json"


def record_fault(run_dir: Path, fault: dict) -> None:
    """One file per fault under ``RUN/faults/`` (every rank may write one; none is overwritten)."""
    folder = Path(run_dir) / FAULTS
    folder.mkdir(parents=True, exist_ok=True)
    fault = {"time": time.time(), "job": job_id(), "restart": restart_count()} | fault
    write_atomic(folder / f"{time.time_ns()}-rank{fault.get('rank', 0)}.json", json.dumps(fault))


def read_attempts(run_dir: Path) -> list[dict]:
    try:
        lines = (Path(run_dir) / ATTEMPTS).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def append_attempt(run_dir: Path, entry: dict) -> None:
    with open(Path(run_dir) / ATTEMPTS, "a") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def write_progress(run_dir: Path, step: int) -> None:
    """``RUN/progress.json``: the step this start reached, for the next start to know what a fault lost."""
    write_atomic(Path(run_dir) / PROGRESS, json.dumps({"step": step, "time": time.time()}))


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def faults(run_dir: Path) -> list[dict]:
    """Every fault of the run, in order: each start after an unclean end is one, with its kind, the step it
    struck at, the rank and time to detect where a fault record has them, the step resumed from and the steps
    lost (the work between the checkpoint resumed from and the fault)."""
    run_dir = Path(run_dir)
    records = sorted((r for r in map(read_json, (run_dir / FAULTS).glob("*.json")) if r), key=lambda r: r["time"])
    attempts = read_attempts(run_dir)
    starts = [a for a in attempts if a["event"] == "start"]
    ended = {a["start_time"] for a in attempts if a["event"] == "ended"}
    reached = {a["start_time"]: a for a in attempts if a["event"] == "reached"}
    out = []
    for before, after in zip(starts, starts[1:]):
        if before["time"] in ended:
            continue  # a clean end (completed, stopped by a signal): no fault
        seen = [r for r in records if before["time"] <= r["time"] < after["time"]]
        # without a record, the step last seen in RUN/progress.json (up to a second behind), or at least the one
        # the next start resumed from
        fault = seen[0] if seen else {"kind": "rank lost"} | reached.get(before["time"], before)
        step = max(fault["step"], after["step"])
        out.append({"kind": fault["kind"], "step": step, "detected_by_rank": fault.get("rank"),
                    "detect_s": fault.get("detect_s"), "resumed_from": after["step"],
                    "steps_lost": step - after["step"], "restart": after["restart"],
                    "lost_s": round(after["time"] - fault["time"], 3)})  # the fault (or last progress) to the restart
    return out


def restarts(run_dir: Path) -> int:
    """The starts that a launcher's restart made (torchrun --max-restarts, slurm/train.sbatch's loop)."""
    return sum(a["event"] == "start" and a["restart"] > 0 for a in read_attempts(run_dir))
