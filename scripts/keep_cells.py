"""A sweep's finished cells, small enough to keep in git or share: each run directory without its checkpoints,
dataset cache and lock, its event files cut to one holding the series `prores report` reads
(prores.study.runs.READ and READ_FAMILIES, as TensorBoard shows them after resumes; alpha only where a ProRes
schedule ran, elsewhere it is 1 throughout and unread), as one CELL.tar.xz. `--restore` unpacks them
into a sweep directory, where `prores sweep` skips them (their summary says they finished) and `prores report`
reads them as it read the originals. A ProRes or Pre-LN cell that kept checkpoints for `prores analyze` is kept
only once its analysis exists (`prores report SWEEP_DIR` runs it).

    python scripts/keep_cells.py SWEEP_DIR KEPT_DIR
    python scripts/keep_cells.py --restore KEPT_DIR SWEEP_DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

from prores.monitor.tensorboard import read_scalars
from prores.run.checkpoint import Checkpoints
from prores.run.summary import read_summary
from prores.study.runs import READ, READ_FAMILIES
from prores.study.state import FINAL

LEFT_OUT = ("checkpoints", "cache", "lock", "inductor-cache")


def keep(sweep_dir: Path, kept: Path) -> None:
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copy2(sweep_dir / "cells.jsonl", kept / "cells.jsonl")
    for line in (sweep_dir / "cells.jsonl").read_text().splitlines():
        run_dir = Path(json.loads(line)["run_dir"])
        out = kept / f"{run_dir.name}.tar.xz"
        summary = read_summary(run_dir)
        if summary is None or summary.get("status") not in FINAL or out.is_file():
            continue
        if len(Checkpoints(run_dir).complete()) > 1 and not (run_dir / "analysis" / "cosine.csv").is_file():
            print(f"{run_dir.name}: not kept, its analysis is missing (run `prores report {sweep_dir}` first)")
            continue
        from torch.utils.tensorboard import SummaryWriter

        prores_on = (yaml.safe_load((run_dir / "config.yaml").read_text())["prores"]["schedule"] != "none")
        wanted = READ_FAMILIES if prores_on else tuple(f for f in READ_FAMILIES if f != "prores/alpha/")
        with tempfile.TemporaryDirectory() as tmp:
            cell = Path(tmp) / run_dir.name
            shutil.copytree(run_dir, cell, ignore=lambda d, names: [n for n in names if Path(d) == run_dir and (
                n in LEFT_OUT or n.startswith("events.out.tfevents."))])
            writer = SummaryWriter(str(cell))
            for tag, values in read_scalars(run_dir, lambda t: t in READ or t.startswith(wanted)).items():
                for step, value in sorted(values.items()):
                    writer.add_scalar(tag, value, step)
            writer.close()
            partial = out.with_name(out.name + ".partial")
            with tarfile.open(partial, "w:xz", preset=9) as tar:
                tar.add(cell, arcname=cell.name)
            partial.rename(out)
        print(f"{run_dir.name}: kept ({out.stat().st_size // 1024} KiB)")


def restore(kept: Path, sweep_dir: Path) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if not (sweep_dir / "cells.jsonl").is_file():
        shutil.copy2(kept / "cells.jsonl", sweep_dir / "cells.jsonl")
    for archive in sorted(kept.glob("*.tar.xz")):
        name = archive.name.removesuffix(".tar.xz")
        if not (sweep_dir / name / "summary.json").is_file():
            shutil.rmtree(sweep_dir / name, ignore_errors=True)
            with tarfile.open(archive) as tar:
                tar.extractall(sweep_dir, filter="data")
            print(f"{name}: restored")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restore", action="store_true", help="copy KEPT cells back into a sweep directory")
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args()
    (restore if args.restore else keep)(args.source, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
