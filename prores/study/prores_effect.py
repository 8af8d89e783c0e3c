"""What ProRes did to each method: the report's "ProRes on − off" table.

Two runs are a pair when their resolved configs differ only in ``prores.*`` (the ProRes run has a schedule,
the other none) and in operational keys (:func:`prores.config.operational_keys`: checkpointing, watchdogs,
monitors; a cell resumed by a newer prores may carry more of them), and they share a seed: the same method,
depth and data with and without ProRes. Each pair gives a difference of final validation losses, on − off;
over seeds it is a paired mean with its 95% t-interval, and its verdict is the claims' rule
(:func:`prores.study.claims.shown`): ProRes helped when the whole interval lies below 0, hurt when it lies
above, and otherwise its effect is not shown (one seed shows nothing).
"""

from __future__ import annotations

import statistics

import yaml

from prores.config import operational_keys
from prores.study.claims import prores_on, shown
from prores.study.intervals import ABOVE, BELOW, Interval, interval
from prores.study.runs import DEPTH, SEED, Run

HELPS, HURTS, UNSHOWN = "helps", "hurts", "not shown"
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


def effect(pair_list: list[tuple[Run, Run]]) -> tuple[Interval, str]:
    """(on − off over the seeds, with its 95% interval; verdict)."""
    iv = interval([on.summary["final_valid_loss"] - off.summary["final_valid_loss"] for off, on in pair_list])
    return iv, HELPS if shown(iv, BELOW) else HURTS if shown(iv, ABOVE) else UNSHOWN


def effect_table(runs: list[Run]) -> list[list[str]]:
    """Rows of the report's table, by method in the grid's order, then depth; empty without pairs."""
    found = pairs(runs)
    if not found:
        return []
    order = {}
    for key in found:
        order.setdefault(key[0], len(order))
    rows = [["method", "depth", "off", "on", "on − off (paired, 95% interval)", "seeds", "ProRes"]]
    for (method, depth), pair_list in sorted(found.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        iv, verdict = effect(pair_list)
        off, on = ([p[i].summary["final_valid_loss"] for p in pair_list] for i in (0, 1))
        rows.append([method, str(depth), f"{statistics.fmean(off):.4f}", f"{statistics.fmean(on):.4f}",
                     iv.text().rsplit(" (", 1)[0], str(len(pair_list)),
                     verdict])
    return rows
