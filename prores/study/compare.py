"""Two studies of the same methods side by side, at two training lengths or under two setups at one length:
``prores compare FIRST SECOND``.

Each study is what ``prores report`` wrote (``results.csv``, or the sweep directory that holds it): a row per run
with its grid values (``model.num_layers`` and ``method``), seed, status and final validation loss. Per depth,
over the methods both studies ran there:

* each method's final validation loss in both studies (mean over seeds; a run that failed or diverged counts as
  worse than any loss, as in :mod:`prores.study.claims`);
* the ranking in both (1 = lowest loss), and Kendall's τ-b between the two rankings (concordant minus
  discordant pairs, over the pairs neither ranking ties: 1 = the same order, ties included; -1 = reversed);
* the paired difference treatment − reference (``Pre-LN + ProRes`` − ``Pre-LN``: negative when ProRes ends
  lower) in both, over the seeds that both methods completed in both studies (so that the two compare the same
  draws), each with its 95% t-interval (:mod:`prores.study.intervals`); what happens to the lead from the first
  study to the second (:func:`trend`: with training, or under the second setup), and the interval of that change,
  per seed, second minus first.

A study is named by its steps where the two lengths differ, else by its name (the sweep directory, or the
results file's stem, less ``_results``): ``prores compare docs/cpu_horizon_results.csv runs/cpu-horizon-reference``
puts the default setup and the reference setup side by side.
"""

from __future__ import annotations

import csv
import math
import statistics
from itertools import combinations
from pathlib import Path

from prores.errors import UsageError
from prores.study.intervals import interval
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
    """τ-b of two orderings of the same items: (concordant − discordant) / √(pairs untied in a · pairs untied in
    b); two failed runs (inf − inf) tie, as equal losses do. NaN when either ordering ties everything."""
    pairs = list(combinations(range(len(a)), 2))

    def sign(x, i, j):
        d = x[i] - x[j]
        return 0 if d == 0 or math.isnan(d) else math.copysign(1, d)

    untied = [sum(sign(x, i, j) != 0 for i, j in pairs) for x in (a, b)]
    if not untied[0] or not untied[1]:
        return math.nan
    return sum(sign(a, i, j) * sign(b, i, j) for i, j in pairs) / math.sqrt(untied[0] * untied[1])


def ranks(values: list[float]) -> list[int]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    for rank, i in enumerate(order, 1):
        out[i] = rank
    return out


def finite_seeds(*arms: dict) -> list[str]:
    """The seeds every arm completed (a finite loss)."""
    common = set.intersection(*(set(arm) for arm in arms)) if arms else set()
    return sorted(s for s in common if all(math.isfinite(arm[s]) for arm in arms))


def trend(short: float, long: float) -> str:
    """What training longer does to treatment − reference (negative: the treatment ends lower)."""
    if short < 0 and long < 0:
        return "the lead grows" if long < short else "the lead shrinks"
    if short > 0 and long > 0:
        return "the gap closes" if long < short else "the gap widens"
    if short < 0 <= long:
        return "the lead is lost" if long == 0 else "reverses: the lead becomes a gap"
    if short > 0 >= long:
        return "the gap closes to 0" if long == 0 else "reverses: the gap becomes a lead"
    return "none at first" if long == 0 else ("a lead appears" if long < 0 else "a gap appears")


def _loss(v: float) -> str:
    return f"{v:.4f}" if math.isfinite(v) else "failed"


def study_name(target: Path) -> str:
    """A sweep directory's name; a results file's stem without "_results" (docs/cpu_horizon_results.csv: cpu_horizon)."""
    if target.is_dir() or target.name == "results.csv":
        return (target if target.is_dir() else target.parent).name
    return target.stem.removesuffix("_results")


def compare(short: Path, long: Path, reference: str = "Pre-LN", treatment: str = "Pre-LN + ProRes") -> str:
    """The comparison as Markdown."""
    (a, a_steps, a_open), (b, b_steps, b_open) = read_results(short), read_results(long)
    if a_steps != b_steps:
        la, lb, moving, both = f"{a_steps} steps", f"{b_steps} steps", "with training", "at both lengths"
    else:
        la, lb = study_name(short), study_name(long)
        if la == lb:
            la, lb = str(short), str(long)
        moving, both = f"{lb} against {la}", "in both studies"
    lines = [f"# {short} ({a_steps} steps) against {long} ({b_steps} steps)", ""]
    lines += [f"**In progress**: {n} run{'s' if n > 1 else ''} of {t} not finished yet (pending, running or stopped)"
              " left out." for n, t in ((a_open, short), (b_open, long)) if n] + ([""] if a_open or b_open else [])
    lines += ["Final validation loss, mean over seeds; rank 1 is the lowest in that study.", "",
             f"| {DEPTH} | method | {la} | rank | {lb} | rank |", "|---|---|---|---|---|---|"]
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
    lines += ["", f"{treatment} − {reference} (negative: {treatment} ends lower), paired over the seeds that both"
              f" completed {both}: mean and 95% t-interval on n − 1 degrees of freedom; the change is {lb} minus"
              f" {la}, per seed.", "",
              f"| {DEPTH} | seeds | {la} | {lb} | {moving} | change |",
              "|---|---|---|---|---|---|"]
    for depth in sorted({d for d, _ in a} & {d for d, _ in b}):
        arms = [s.get((depth, m)) for s in (a, b) for m in (treatment, reference)]
        seeds = finite_seeds(*arms) if all(arm is not None for arm in arms) else []
        if not seeds:
            lines.append(f"| {depth} | none | n/a | n/a | n/a | n/a |")
            continue
        short, long = ([t[s] - r[s] for s in seeds] for t, r in (arms[:2], arms[2:]))
        ia, ib, change = interval(short), interval(long), interval([y - x for x, y in zip(short, long)])
        said = f"{change.text()}, {change.verdict}" if change.verdict else change.text()
        lines.append(f"| {depth} | {', '.join(seeds)} | {ia.text()} | {ib.text()} | {trend(ia.mean, ib.mean)} |"
                     f" {said} |")
    return "\n".join(lines) + "\n"
