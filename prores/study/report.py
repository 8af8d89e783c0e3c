"""`prores report SWEEP_DIR` (or `prores report RUN_DIR...`): a sweep's results as a table and plots.

Reads every run's ``summary.json``, ``config.yaml`` and event files and writes
``report.md`` (a row per cell, seeds averaged with their spread), ``results.csv``
(a row per run) and PNG plots linked from the report: final validation ppl
against depth, validation loss curves per depth, the final per-layer
activation RMS against layer index per depth (the paper's Fig. 3 view) and the
alpha schedule used (layer × step); where runs differ only in ProRes, what it did
to each method (prores_effect.py). A run that diverged, failed or has not
finished shows its state, never a number; a sweep still in progress reports
what exists so far and says so. For plain run directories the "grid" is the
config keys whose values differ between them.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Optional

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from prores.monitor.heatmaps import heatmap, png, series_matrix
from prores.run.checkpoint import Checkpoints
from prores.study.claims import Study, claims_json, claims_markdown, role
from prores.study.prores_effect import effect_table
from prores.study.runs import DEPTH, Run, collect, groups, mean_spread, ppl, state_text

LEGEND = 9  # points

def eval_metrics(runs: list[Run]) -> list[str]:
    """The `prores eval` metrics any run has (its newest evaluation's), in order."""
    return sorted({m for r in runs for m in r.evals})


def table(runs: list[Run], keys: list[str]) -> list[list[str]]:
    """Markdown rows: one per cell (seeds averaged over the completed ones), with its evaluations."""
    evals = eval_metrics(runs)
    head = keys + ["params", "steps", "final valid loss", "final ppl", "best valid loss", "best ppl",
                   "loss spikes, whole run", "grad-norm spikes, whole run", *evals, "status", "tokens/s", "seeds"]
    rows = [head]
    for group in groups(runs, keys).values():
        done = [r for r in group if r.completed]
        s = [r.summary for r in done]

        def spread(values, digits=4):
            return mean_spread([v for v in values if v is not None], digits) if done else "—"

        spikes = [x.get("spikes", {}) for x in s]
        rows.append([str(group[0].grid[k]) for k in keys] + [
            f"{group[0].summary['parameters']:,}" if group[0].summary.get("parameters") else "",
            "/".join(sorted({str(r.summary.get("steps", "")) for r in group})),
            spread([x["final_valid_loss"] for x in s]), spread([ppl(x["final_valid_loss"]) for x in s], 2),
            spread([x.get("best_valid_loss") for x in s]), spread([ppl(x.get("best_valid_loss")) for x in s], 2),
            spread([sp.get("train/loss", {}).get("score") for sp in spikes]),
            spread([sp.get("train/grad_norm", {}).get("score") for sp in spikes]),
            *[spread([r.evals.get(m) for r in done]) for m in evals],
            state_text(group), spread([x.get("tokens_per_sec") for x in s], 0),
            str(len(group))])
    return rows


def act_growth(run: Run) -> Optional[tuple[float, float]]:
    """(last / first block's activation RMS, the per-block growth factor (last / first)^(1/(L - 1))), from
    each block's last logged ``layers/act_rms``: how the residual stream grows with depth at the end."""
    act = run.last("layers/act_rms")
    if not run.completed or len(act) < 2:
        return None
    first, last = min(act), max(act)
    ratio = act[last] / act[first]
    return ratio, ratio ** (1 / (last - first))


def growth_table(runs: list[Run], keys: list[str]) -> list[list[str]]:
    """Markdown rows: per cell, the activation growth over its completed seeds (mean ± std)."""
    rows = [keys + ["last / first act RMS", "growth per block", "seeds"]]
    for group in groups(runs, keys).values():
        growth = [g for g in map(act_growth, group) if g is not None]
        rows.append([str(group[0].grid[k]) for k in keys]
                    + [mean_spread([g[0] for g in growth], 3) or "—", mean_spread([g[1] for g in growth], 4) or "—",
                       str(len(growth))])
    return rows


def markdown_table(rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])] + ["| " + " | ".join(r) + " |"
                                                                                for r in rows[1:]]


CSV_FIELDS = ["name", "seed", "status", "diverged_at", "parameters", "steps", "final_valid_loss", "final_ppl",
              "best_valid_loss", "best_valid_step", "best_ppl", "loss_spike_score", "grad_norm_spike_score",
              "act_rms_last_over_first", "act_rms_growth_per_block", "tokens_per_sec", "run_dir"]


def csv_rows(runs: list[Run], keys: list[str]) -> list[dict]:
    rows = []
    for r in runs:
        s = r.summary if r.completed else {}  # numbers only for completed runs
        spikes = s.get("spikes", {})
        growth = act_growth(r) or (None, None)
        rows.append({**{k: r.grid[k] for k in keys}, "name": r.name, "seed": r.seed, "status": r.state,
                     "diverged_at": r.summary.get("diverged_at"), "parameters": r.summary.get("parameters"),
                     "steps": r.summary.get("steps"), "final_valid_loss": s.get("final_valid_loss"),
                     "final_ppl": ppl(s.get("final_valid_loss")), "best_valid_loss": s.get("best_valid_loss"),
                     "best_valid_step": s.get("best_valid_step"), "best_ppl": ppl(s.get("best_valid_loss")),
                     "loss_spike_score": spikes.get("train/loss", {}).get("score"),
                     "grad_norm_spike_score": spikes.get("train/grad_norm", {}).get("score"),
                     "act_rms_last_over_first": growth[0], "act_rms_growth_per_block": growth[1],
                     "tokens_per_sec": s.get("tokens_per_sec"), "run_dir": str(r.run_dir),
                     **{f"eval:{m}": v for m, v in r.evals.items() if r.completed}})
    return rows


def _figure(panels: int) -> tuple[Figure, list]:
    panels = max(panels, 1)  # an empty panel says there is nothing to show
    cols = min(panels, 3)
    rows = -(-panels // cols)
    fig = Figure(figsize=(5.5 * cols, 4.2 * rows), dpi=100)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(panels)]


def cell_label(grid: dict, skip: tuple = (DEPTH,)) -> str:
    return ", ".join(f"{v}" for k, v in grid.items() if k not in skip) or "run"


def plot_ppl_vs_depth(runs: list[Run], keys: list[str]) -> Figure:
    fig, (ax,) = _figure(1)
    lines: dict[str, dict[int, list[float]]] = {}
    for r in runs:
        line = lines.setdefault(cell_label(r.grid), {})
        if r.completed:
            line.setdefault(r.depth, []).append(ppl(r.summary["final_valid_loss"]))
    for label, points in sorted(lines.items()):
        depths = sorted(points)
        if depths:
            means = [statistics.fmean(points[d]) for d in depths]
            errors = [statistics.stdev(points[d]) if len(points[d]) > 1 else 0.0 for d in depths]
            ax.errorbar(depths, means, yerr=errors, marker="o", capsize=3, label=label)
    ax.set_xticks(sorted({r.depth for r in runs if r.depth is not None}))
    failed = sorted({r.depth for r in runs if r.state in ("diverged", "failed") and r.depth is not None})
    for depth in failed:
        ax.axvline(depth, color="red", alpha=0.15)
    ax.set_xlabel("depth (blocks)")
    ax.set_ylabel("final validation ppl")
    ax.set_title("final validation ppl" + (" (red: a cell diverged or failed)" if failed else ""))
    ax.legend(fontsize=LEGEND)
    fig.tight_layout()
    return fig


def _by_depth(runs: list[Run]) -> dict[int, list[Run]]:
    out: dict[int, list[Run]] = {}
    for r in runs:
        if r.depth is not None:
            out.setdefault(r.depth, []).append(r)
    return dict(sorted(out.items()))


def _panels_per_depth(runs: list[Run], series, title: str, xlabel: str, ylabel: str, log: bool = False) -> Figure:
    """A panel per depth, a line per run: ``series(run)`` is ``{x: y}``."""
    depths = _by_depth(runs)
    fig, axes = _figure(len(depths))
    for ax, (depth, group) in zip(axes, depths.items()):
        for r in group:
            points = series(r)
            if points:
                xs = sorted(points)
                (ax.semilogy if log else ax.plot)(xs, [points[x] for x in xs], marker=".",
                                                  label=f"{cell_label(r.grid)} s{r.seed}"
                                                  + ("" if r.completed else f" ({r.state})"))
        ax.set_title(title.format(depth=depth))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers and steps are whole numbers
        ax.legend(fontsize=LEGEND)
    fig.tight_layout()
    return fig


def plot_valid_curves(runs: list[Run]) -> Figure:
    return _panels_per_depth(runs, lambda r: r.scalars.get("valid/loss", {}), "{depth} blocks", "step",
                             "validation loss")


def plot_act_rms(runs: list[Run]) -> Figure:
    return _panels_per_depth(runs, lambda r: r.last("layers/act_rms"), "{depth} blocks: final activation RMS",
                             "layer", "act RMS", log=True)


def alpha_figures(runs: list[Run]) -> dict[str, Figure]:
    """Per schedule, its alpha (layer × step) in the deepest run that logged one."""
    figures = {}
    for r in sorted(runs, key=lambda r: -(r.depth or 0)):
        schedule = r.config.get("prores.schedule")
        alpha = {tag: v for tag, v in r.scalars.items() if tag.startswith("prores/alpha/")}
        if schedule in figures or schedule in (None, "none") or not alpha:
            continue
        series: dict[int, dict[int, float]] = {}
        for tag, values in alpha.items():
            for step, v in values.items():
                series.setdefault(step, {})[int(tag.rsplit("_", 1)[1])] = v
        matrix, steps = series_matrix(series, r.depth)
        figures[schedule] = heatmap(matrix, steps, title=f"alpha, {schedule} (T={r.config['prores.T']}), {r.name}",
                                    xlabel="step", label="alpha")
    return figures


def report(targets: list[Path], out_dir: Optional[Path] = None) -> Path:
    targets = [Path(t) for t in targets]
    runs, keys, note = collect(targets)
    out_dir = Path(out_dir or (targets[0] if len(targets) == 1 and (targets[0] / "cells.jsonl").is_file()
                               else "report"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = csv_rows(runs, keys)
    with open(out_dir / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys + CSV_FIELDS + [f"eval:{m}" for m in eval_metrics(runs)])
        writer.writeheader()
        writer.writerows(rows)
    plots = {"ppl_vs_depth.png": ("Final validation ppl against depth", plot_ppl_vs_depth(runs, keys)),
             "valid_curves.png": ("Validation loss, one panel per depth", plot_valid_curves(runs)),
             "act_rms_by_layer.png": ("Final activation RMS per layer (the paper's Fig. 3 view)", plot_act_rms(runs))}
    for schedule, fig in alpha_figures(runs).items():
        plots[f"alpha-{schedule}.png"] = (f"The alpha schedule used: {schedule}", fig)
    for name, (_, fig) in plots.items():
        (out_dir / name).write_bytes(png(fig))
    lines = [f"# Report: {', '.join(str(t) for t in targets)}", ""]
    if note:
        lines += [note, ""]
    lines += markdown_table(table(runs, keys))
    lines += ["", "Losses, ppl and spike scores are means ± standard deviation over the completed seeds; a cell"
              " without one shows its state instead. Per run: [results.csv](results.csv).", "",
              "## Activation growth", ""] + markdown_table(growth_table(runs, keys))
    lines += ["", "The last block's activation RMS over the first's, and the per-block growth factor"
              " (last / first)^(1/(L - 1)), from each block's last logged `layers/act_rms`; mean ± standard"
              " deviation over the completed seeds.", ""]
    effect = effect_table(runs)
    if effect:
        lines += ["## ProRes on − off", "", "Runs that differ only in ProRes (`prores.*`, and in keys that change no"
                  " numbers: checkpointing, watchdogs, monitors), paired by seed: the final"
                  " validation loss with ProRes minus without, the mean over the seeds with its 95% t-interval"
                  " [low, high]; ProRes helps or hurts when the whole interval lies below or above 0, and"
                  " otherwise its effect is not shown.", ""] + markdown_table(effect) + [""]
    analyze_kept_checkpoints(runs)  # each finished run at once: a sweep in progress keeps its cells analysed
    study = Study(runs, lambda r: cell_label(r.grid))
    if any(c.role == "prores" for c in study.cells.values()) and len(study.depths) > 1:
        claims = study.claims()
        (out_dir / "claims.json").write_text(json.dumps(claims_json(claims), indent=1))
        lines += claims_markdown(claims)
    for name, (title, _) in plots.items():
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return out_dir


def analyze_kept_checkpoints(runs: list[Run]) -> None:
    """`prores analyze` (in this process) of every completed Pre-LN and ProRes run that kept checkpoints
    along the way and has no analysis yet: the representation-evolution claim reads it."""
    for r in runs:
        if (r.completed and role(r.config) in ("pre", "prores") and not (r.run_dir / "analysis" / "cosine.csv").is_file()
                and len(Checkpoints(r.run_dir).complete()) > 1):
            from prores.study.analyze import analyze

            analyze(r.run_dir)

