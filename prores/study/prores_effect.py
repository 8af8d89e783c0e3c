"""What ProRes did to each method: the report's "ProRes on − off" table.

Two runs are a pair when their resolved configs differ only in ``prores.*`` (the ProRes run has a schedule,
the other none) and in operational keys (:func:`prores.config.operational_keys`: checkpointing, watchdogs,
monitors; a cell resumed by a newer prores may carry more of them), and they share a seed: the same method,
depth and data with and without ProRes. Each pair gives a difference of final validation losses, on − off;
over seeds it is a paired mean ± std, and its verdict uses the claims' rule (:func:`prores.study.claims.beyond`):
ProRes helped when off − on is beyond twice the paired spread, hurt when on − off is, and otherwise the
difference is within the seed spread.
"""

from __future__ import annotations

import statistics
from typing import Optional

import yaml

from prores.config import operational_keys
from prores.study.claims import beyond, prores_on
from prores.study.runs import DEPTH, SEED, Run

HELPS, HURTS, WITHIN = "helps", "hurts", "within the seed spread"
OPERATIONAL = operational_keys()


def _rest(run: Run) -> str:
    """The run's config without ProRes, seed and operational keys: what a pair shares."""
    return yaml.safe_dump({k: v for k, v in run.config.items()
                           if not k.startswith("prores.") and k != SEED and k not in OPERATIONAL})


def _method(off: Run, on: Run) -> str:
    """The off run's grid values but depth and those that toggle ProRes (all of them if nothing else is left)."""
    shared = [str(v) for k, v in off.grid.items() if k != DEPTH and on.grid.get(k) == v]
    return ", ".join(shared) or ", ".join(str(v) for k, v in off.grid.items() if k != DEPTH)


def pairs(runs: list[Run]) -> dict[tuple[str, int], list[tuple[Run, Run]]]:
    """(method, depth) -> the (off, on) pairs of completed runs, by seed."""
    ons = {(_rest(r), r.seed): r for r in runs if r.completed and prores_on(r.config)}
    out: dict[tuple[str, int], list[tuple[Run, Run]]] = {}
    for off in runs:
        on = ons.get((_rest(off), off.seed)) if off.completed and not prores_on(off.config) else None
        if on is not None:
            out.setdefault((_method(off, on), off.depth), []).append((off, on))
    return out


def effect(pair_list: list[tuple[Run, Run]]) -> tuple[float, Optional[float], str]:
    """(mean of on − off, its std over seeds or None with one seed, verdict)."""
    diffs = [on.summary["final_valid_loss"] - off.summary["final_valid_loss"] for off, on in pair_list]
    mean = statistics.fmean(diffs)
    spread = statistics.stdev(diffs) if len(diffs) > 1 else None
    verdict = HELPS if beyond(-mean, spread) else HURTS if beyond(mean, spread) else WITHIN
    return mean, spread, verdict


def effect_table(runs: list[Run]) -> list[list[str]]:
    """Rows of the report's table, by method in the grid's order, then depth; empty without pairs."""
    found = pairs(runs)
    if not found:
        return []
    order = {}
    for key in found:
        order.setdefault(key[0], len(order))
    rows = [["method", "depth", "off", "on", "on − off (paired)", "seeds", "ProRes"]]
    for (method, depth), pair_list in sorted(found.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        mean, spread, verdict = effect(pair_list)
        off, on = ([p[i].summary["final_valid_loss"] for p in pair_list] for i in (0, 1))
        rows.append([method, str(depth), f"{statistics.fmean(off):.4f}", f"{statistics.fmean(on):.4f}",
                     f"{mean:+.4f}" + (f" ± {spread:.4f}" if spread is not None else ""), str(len(pair_list)),
                     verdict])
    return rows
