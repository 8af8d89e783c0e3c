"""Two studies of the same methods at two training lengths, side by side: ``prores compare SHORT LONG``.

Each study is what ``prores report`` wrote (``results.csv``, or the sweep directory that holds it): a row per run
with its grid values (``model.num_layers`` and ``method``), seed, status and final validation loss. Per depth,
over the methods both studies ran there:

* each method's final validation loss at both lengths (mean over seeds; a run that failed or diverged counts as
  worse than any loss, as in :mod:`prores.study.claims`);
* the ranking at both (1 = lowest loss), and Kendall's τ between the two rankings (τ-a: concordant minus
  discordant pairs over all pairs; 1 = the same order, -1 = reversed);
* the paired difference treatment − reference (``Pre-LN + ProRes`` − ``Pre-LN``: negative when ProRes ends
  lower), over the seeds both have, at both lengths, and whether the treatment's lead grows with training.
"""

from __future__ import annotations

import csv
import math
import statistics
from itertools import combinations
from pathlib import Path
from typing import Optional

from prores.errors import UsageError
from prores.study.runs import DEPTH

METHOD = "method"


FINISHED = ("completed", "diverged", "failed")


def read_results(target: Path) -> tuple[dict, int, int]:
    """``{(depth, method): {seed: loss}}`` (inf for a run that diverged or failed), the study's steps, and how many
    runs it has that have not finished (pending, running, stopped): those are left out, not counted as failed."""
    path = target / "results.csv" if target.is_dir() else target
    if not path.is_file():
        raise UsageError(f"{target}: no results.csv; run `prores report {target}` first (or give its results.csv).")
    rows = list(csv.DictReader(path.open()))
    if not rows or DEPTH not in rows[0] or METHOD not in rows[0]:
        raise UsageError(f"{path}: needs the columns {DEPTH} and {METHOD} (a sweep whose grid has both).")
    out: dict = {}
    for r in rows:
        if r["status"] not in FINISHED:
            continue
        loss = float(r["final_valid_loss"]) if r["status"] == "completed" and r["final_valid_loss"] else math.inf
        out.setdefault((int(r[DEPTH]), r[METHOD]), {})[r["seed"]] = loss
    unfinished = sum(r["status"] not in FINISHED for r in rows)
    return out, max(int(r["steps"]) for r in rows if r["steps"]), unfinished


def kendall_tau(a: list[float], b: list[float]) -> float:
    """τ-a of two orderings of the same items: (concordant − discordant) / all pairs."""
    pairs = list(combinations(range(len(a)), 2))
    if not pairs:
        return math.nan
    def sign(i, j):  # two failed runs (inf - inf) tie, as equal losses do
        d = (a[i] - a[j]) * (b[i] - b[j])
        return 0 if d == 0 or math.isnan(d) else math.copysign(1, d)

    return sum(sign(i, j) for i, j in pairs) / len(pairs)


def ranks(values: list[float]) -> list[int]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    for rank, i in enumerate(order, 1):
        out[i] = rank
    return out


def paired(treatment: dict, reference: dict) -> Optional[tuple[float, Optional[float], int]]:
    """Mean and sample spread of treatment − reference over the seeds both completed, and how many."""
    diffs = [treatment[s] - reference[s] for s in sorted(set(treatment) & set(reference))
             if math.isfinite(treatment[s]) and math.isfinite(reference[s])]
    if not diffs:
        return None
    return statistics.fmean(diffs), statistics.stdev(diffs) if len(diffs) > 1 else None, len(diffs)


def _loss(v: float) -> str:
    return f"{v:.4f}" if math.isfinite(v) else "failed"


def _diff(d) -> str:
    if d is None:
        return "n/a"
    mean, spread, n = d
    return f"{mean:+.4f}" + (f" ± {spread:.4f}" if spread is not None else "") + f" ({n} seed{'s' if n > 1 else ''})"


def compare(short: Path, long: Path, reference: str = "Pre-LN", treatment: str = "Pre-LN + ProRes") -> str:
    """The comparison as Markdown."""
    (a, a_steps, a_open), (b, b_steps, b_open) = read_results(short), read_results(long)
    lines = [f"# {short} ({a_steps} steps) against {long} ({b_steps} steps)", ""]
    lines += [f"**In progress**: {n} run{'s' if n > 1 else ''} of {t} not finished yet (pending, running or stopped)"
              " left out." for n, t in ((a_open, short), (b_open, long)) if n] + ([""] if a_open or b_open else [])
    lines += ["Final validation loss, mean over seeds; rank 1 is the lowest at that length.", "",
             f"| {DEPTH} | method | {a_steps} steps | rank | {b_steps} steps | rank |", "|---|---|---|---|---|---|"]
    taus = []
    for depth in sorted({d for d, _ in a} & {d for d, _ in b}):
        methods = sorted({m for d, m in a if d == depth} & {m for d, m in b if d == depth})
        means = {k: [statistics.fmean(s[(depth, m)].values()) for m in methods] for k, s in (("a", a), ("b", b))}
        ra, rb = ranks(means["a"]), ranks(means["b"])
        for i, m in enumerate(methods):
            lines.append(f"| {depth} | {m} | {_loss(means['a'][i])} | {ra[i]} | {_loss(means['b'][i])} | {rb[i]} |")
        taus.append((depth, len(methods), kendall_tau(means["a"], means["b"])))
    lines += ["", "Kendall's τ between the two rankings:", "", f"| {DEPTH} | methods | τ |", "|---|---|---|"]
    lines += [f"| {d} | {n} | {t:+.3f} |" for d, n, t in taus]
    lines += ["", f"{treatment} − {reference}, paired by seed (negative: {treatment} ends lower):", "",
              f"| {DEPTH} | {a_steps} steps | {b_steps} steps | the lead of {treatment} |", "|---|---|---|---|"]
    for depth in sorted({d for d, _ in a} & {d for d, _ in b}):
        diffs = [paired(s[(depth, treatment)], s[(depth, reference)])
                 if (depth, treatment) in s and (depth, reference) in s else None for s in (a, b)]
        trend = "n/a" if None in diffs else "grows" if diffs[1][0] < diffs[0][0] else "shrinks"
        lines.append(f"| {depth} | {_diff(diffs[0])} | {_diff(diffs[1])} | {trend} |")
    return "\n".join(lines) + "\n"
