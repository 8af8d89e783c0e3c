"""A kept results.csv (docs/, its run directories gone) with the rows of a later report over more cells of the same
sweep (its results.csv, or the directory that holds it), written back in the sweep's cell order:

    python scripts/merge_results.py docs/cpu_horizon_results.csv RUNS/cpu-horizon --spec cpu-horizon.yaml

The later report's cells that have not finished there (pending, running, stopped: a sweep run with --only, or
cut off) are no runs and are left out. A run in both must be the same run: the same status and final loss (a cell
trained again ends where it did, as a run's losses are deterministic on one machine). The kept file's columns stay: the later report must have them all (one it adds, such as a newer report's
run_dir, is left out); where both have a run, the later row's values win. Every
run must be a cell of the spec. Then `python scripts/redecide_claims.py` decides the claims again from it.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from prores.errors import UsageError
from prores.study.compare import FINISHED
from prores.study.sweep import expand


def read(path: Path) -> tuple[list[str], dict[str, dict]]:
    path = path / "results.csv" if path.is_dir() else path
    with path.open() as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), {r["name"]: r for r in reader}


def merge(kept: Path, later: Path, spec: str) -> int:
    (fields, rows), (new_fields, new_rows) = read(kept), read(later)
    missing = [f for f in fields if f not in new_fields]
    if missing:
        raise UsageError(f"{later}: lacks {kept}'s columns {', '.join(missing)}")
    new_rows = {name: row for name, row in new_rows.items() if row["status"] in FINISHED}
    for name, row in new_rows.items():
        old = rows.get(name)
        if old and (old["status"], old["final_valid_loss"]) != (row["status"], row["final_valid_loss"]):
            raise UsageError(f"{name}: {kept} has {old['status']} {old['final_valid_loss']}, {later}"
                             f" {row['status']} {row['final_valid_loss']}: not the same run")
        rows[name] = {f: row[f] for f in fields}
    order = {c.name: c.index for c in expand(spec)[1]}
    unknown = sorted(set(rows) - set(order))
    if unknown:
        raise UsageError(f"{', '.join(unknown)}: no cell of {spec}; give the spec that made them.")
    with kept.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fields)
        writer.writeheader()
        writer.writerows(sorted(rows.values(), key=lambda r: order[r["name"]]))
    return len(new_rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kept", type=Path, help="the kept results.csv, rewritten in place")
    parser.add_argument("later", type=Path, help="a later report's results.csv or its directory")
    parser.add_argument("--spec", required=True, help="the sweep spec both come from (its cells' order)")
    args = parser.parse_args()
    try:
        print(f"{args.kept}: {merge(args.kept, args.later, args.spec)} rows from {args.later}")
    except UsageError as e:
        print(f"merge_results: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
