"""A results page's study tables written again from its kept results.csv, after rows were added to it
(scripts/merge_results.py):

    python scripts/refresh_tables.py docs/results/cpu-horizon.md docs/cpu_horizon_results.csv

A study table is one whose header starts with the study's grid columns (those before ``name`` in the CSV) and
whose every other column is one of COLUMNS, ``status`` or ``seeds``; it gets a row for every cell of the CSV, in
its order, each figure the mean ± sample std over the cell's completed runs, as `prores report` writes them.
Other tables (`prores compare`'s, for one) are left as they are. tests/test_docs.py checks every such table
against the CSV on its own.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from prores.study.runs import mean_spread

COLUMNS = {"final valid loss": ("final_valid_loss", 4), "loss spikes, whole run": ("loss_spike_score", 4),
           "grad-norm spikes, whole run": ("grad_norm_spike_score", 4),
           "last / first act RMS": ("act_rms_last_over_first", 3), "growth per block": ("act_rms_growth_per_block", 4)}


def column(title: str) -> tuple[str, int] | None:
    if title in COLUMNS:
        return COLUMNS[title]
    return (f"eval:{title}", 4) if "/" in title else None  # an evaluation metric, as the report names it


def cell_rows(rows: list[dict], grid: list[str], head: list[str]) -> list[list[str]]:
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault(tuple(r[k] for k in grid), []).append(r)
    out = []
    for key, group in cells.items():
        done = [r for r in group if r["status"] == "completed"]
        states = sorted({r["status"] for r in group})
        line = list(key)
        for title in head[len(grid):]:
            if title == "status":
                line.append(", ".join(f"{s} {sum(r['status'] == s for r in group)}" for s in states))
            elif title == "seeds":
                line.append(str(len(done)))
            else:
                field, digits = column(title)
                line.append(mean_spread([float(r[field]) for r in done if r[field]], digits) or "—")
        out.append(line)
    return out


def refresh(page: Path, results: Path) -> int:
    rows = list(csv.DictReader(results.open()))
    grid = list(rows[0])[:list(rows[0]).index("name")]
    lines, out, i, done = page.read_text().splitlines(), [], 0, 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            out.append(lines[i])
            i += 1
            continue
        j = i
        while j < len(lines) and lines[j].startswith("|"):
            j += 1
        head = [c.strip() for c in lines[i].strip().strip("|").split("|")]
        rest = head[len(grid):]
        if head[:len(grid)] == grid and rest and all(t in ("status", "seeds") or column(t) for t in rest):
            out += lines[i:i + 2] + ["| " + " | ".join(r) + " |" for r in cell_rows(rows, grid, head)]
            done += 1
        else:
            out += lines[i:j]
        i = j
    page.write_text("\n".join(out) + "\n")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("results", type=Path)
    args = parser.parse_args()
    print(f"{args.page}: {refresh(args.page, args.results)} study tables written from {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
