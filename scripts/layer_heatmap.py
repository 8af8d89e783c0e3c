"""A run's per-layer family as the layer × step heatmap TensorBoard shows, saved as a PNG (the manual's figures).

    python scripts/layer_heatmap.py RUN_DIR layers/grad_norm OUT.png [--title TITLE] [--vmin V --vmax V]

Same picture as the run's ``heatmaps/*`` images (prores.monitor.heatmaps), drawn from its event files, with
a colour range that can be shared between runs so that two pictures compare.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prores.monitor.heatmaps import heatmap, png, series_matrix
from prores.monitor.tensorboard import read_scalars


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("family", help="layers/grad_norm, layers/act_rms, layers/update_ratio, prores/alpha, ...")
    p.add_argument("out", type=Path)
    p.add_argument("--title", default=None)
    p.add_argument("--vmin", type=float, default=None)
    p.add_argument("--vmax", type=float, default=None)
    args = p.parse_args()
    prefix = args.family.rstrip("/") + "/layer_"
    scalars = read_scalars(args.run_dir, lambda tag: tag.startswith(prefix))
    if not scalars:
        raise SystemExit(f"{args.run_dir}: no {prefix}XXX scalars in its event files")
    series: dict[int, dict[int, float]] = {}
    for tag, values in scalars.items():
        for step, value in values.items():
            series.setdefault(step, {})[int(tag[len(prefix):])] = value
    matrix, steps = series_matrix(series, max(int(t[len(prefix):]) for t in scalars))
    fig = heatmap(matrix, steps, title=args.title or f"{args.run_dir.name}: {args.family}", xlabel="step",
                  label=args.family.split("/")[-1], vmin=args.vmin, vmax=args.vmax)
    args.out.write_bytes(png(fig))


if __name__ == "__main__":
    main()
