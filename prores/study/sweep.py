"""Sweep specs: a YAML file that names a grid of runs ("cells"), each one `prores train`.

```yaml
name: cpu-depth               # default: the spec file's name
base: tiny.yaml               # a config file or a packaged name
presets: [paper-setup]        # --set @PRESET for every cell, before the rest (configs/presets/)
set: {train.steps: 300}       # fixed overrides
grid:                         # the product of the lists is the set of cells
  model.num_layers: [6, 12, 24]
  method:                     # a named axis: each name stands for the overrides under it
    Pre-LN: {prores.schedule: none}
    Pre-LN + ProRes: {prores.schedule: linear}
seeds: [1, 2]                 # each cell once per seed (train.seed)
where:                        # overrides (and Slurm resources, and seeds) for the cells that match
  - when: {model.num_layers: [96, 120]}    # a value, or a list of values
    set: {prores.T: 500, parallel.pp: 4}
    slurm: {nodes: 2}
  - when: {method: Pre-LN}
    seeds: [1, 2, 3]          # these cells once per seed of this list instead
  - when: {method: Pre-LN + ProRes, model.num_layers: 6}
    skip: true                # no such cell
slurm: {nodes: 1, ntasks_per_node: 8, gpus_per_node: 8, cpus_per_task: 8, time: "24:00:00"}
eval: {tasks: [prores_lastword, prores_rolling_ppl], limit: 100, batch_size: 16}   # after each cell
```

Every cell is validated as `prores train` would validate it before anything
runs; a bad cell is one error naming it. A cell's run directory is
``<root>/<name>/<cell>`` (absolute in ``cells.jsonl``), its name made of the
grid values (``L048-post-linear-s1``). The resolved cells go to
``<root>/<name>/cells.jsonl`` when the sweep first runs, and never change
after: Slurm array tasks find their cell by its line there, so a spec whose
cells differ from a sweep directory's is refused (:func:`check_unchanged`).
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from prores.config import PACKAGED_CONFIGS, find_file, load_config, yaml_value
from prores.errors import UsageError
from prores.parallel.rendezvous import check_divisible
from prores.run.files import write_atomic

SPEC_KEYS = ("name", "base", "presets", "set", "grid", "seeds", "where", "slurm", "eval")
EVAL_KEYS = {"tasks": list, "limit": int, "batch_size": int}  # `prores eval`'s options, each cell's checkpoint
SLURM_KEYS = {"nodes": 1, "ntasks_per_node": 8, "gpus_per_node": 8, "cpus_per_task": 8, "time": "24:00:00",
              "partition": None, "extra": []}


def _whole(least: int):
    def check(v) -> Optional[str]:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= least
        return None if ok else f"{v!r} must be a whole number of at least {least}"
    return check


def _extra(v) -> Optional[str]:
    if isinstance(v, str):
        return f"{v!r} is a string; give a list of sbatch options, e.g. extra: [{json.dumps(v)}]"
    if not isinstance(v, list) or not all(isinstance(o, str) for o in v):
        return f"{v!r}: every entry must be a string (one sbatch option each)"
    return None


SLURM_CHECKS = {
    "nodes": _whole(1), "ntasks_per_node": _whole(1), "gpus_per_node": _whole(0), "cpus_per_task": _whole(1),
    "time": lambda v: None if isinstance(v, str) else f'{v!r} must be a string such as "24:00:00"',
    "partition": lambda v: None if v is None or isinstance(v, str) else f"{v!r} must be a string (or absent)",
    "extra": _extra,
}
# short labels for numeric grid values in cell names; other keys use their last part
LABELS = {"model.num_layers": "L", "model.hidden_size": "H", "model.ffn_hidden_size": "F", "prores.T": "T",
          "optim.lr": "lr", "train.steps": "steps", "train.seed": "s"}
PACKAGED_SWEEPS = PACKAGED_CONFIGS / "sweeps"


class SpecError(UsageError):
    """A bad sweep spec; the message names the spec, the entry and the fix."""


@dataclass
class Cell:
    index: int
    name: str
    run_dir: str
    base: str
    overrides: list[str]  # KEY=VALUE, as `prores train --set` takes them
    grid: dict[str, Any]  # the grid values (and the seed) that make this cell
    slurm: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)  # `prores eval` once the cell completes (EVAL_KEYS)

    def train_args(self) -> list[str]:
        return [self.base, *[a for o in self.overrides for a in ("--set", o)], "--run-dir", self.run_dir]

    def eval_args(self) -> list[str]:
        e = self.eval
        return [self.run_dir, "--tasks", ",".join(e["tasks"])] + [
            a for key, flag in (("limit", "--limit"), ("batch_size", "--batch-size")) if key in e
            for a in (flag, str(e[key]))]


def _token(key: str, value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        text = str(value)
    elif key == "model.num_layers":
        text = f"L{value:03d}"
    else:
        text = f"{LABELS.get(key, key.rsplit('.', 1)[-1])}{value:g}"
    return re.sub(r"[^A-Za-z0-9._+]+", "_", text)


def _matches(when: dict, values: dict) -> bool:
    return all(values.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items())


def _read(path: Path) -> dict:
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({exc}).") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path}: a sweep spec is a mapping with {', '.join(SPEC_KEYS)}.")
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise SpecError(f"{path}: unknown entr{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)};"
                        f" a sweep spec has {', '.join(SPEC_KEYS)}.")
    if "base" not in spec:
        raise SpecError(f"{path}: 'base' is missing: the config every cell starts from (a file or a packaged name).")
    presets = spec.get("presets")
    if presets is not None and (not isinstance(presets, list) or not all(isinstance(p, str) and p for p in presets)):
        raise SpecError(f"{path}: 'presets' is a list of preset names (configs/presets/) or files, got {presets!r}.")
    for entry in ("set", "grid", "slurm"):
        if not isinstance(spec.get(entry) or {}, dict):
            raise SpecError(f"{path}: '{entry}' must be a mapping of KEY: VALUE.")
    for key, values in (spec.get("grid") or {}).items():
        named = isinstance(values, dict) and all(isinstance(v, dict) or v is None for v in values.values())
        if not (named or isinstance(values, list)) or not values:
            raise SpecError(f"{path}: grid entry {key!r} must be a non-empty list of values, or a mapping of names"
                            f" to the overrides each stands for, got {values!r}.")
    where = spec.get("where") or []
    if not isinstance(where, list) or not all(isinstance(r, dict) and isinstance(r.get("when"), dict)
                                              and set(r) <= {"when", "set", "slurm", "seeds", "skip"}
                                              and isinstance(r.get("skip", False), bool) for r in where):
        raise SpecError(f"{path}: 'where' is a list of rules, each {{when: {{KEY: VALUE or [VALUES]}},"
                        " set: {...}, slurm: {...}, seeds: [...], skip: true|false}.")
    for seeds in [spec.get("seeds")] + [r.get("seeds") for r in where]:
        if seeds is not None and (not isinstance(seeds, list) or not seeds or
                                  not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
            raise SpecError(f"{path}: 'seeds' must be a non-empty list of integers, got {seeds!r}.")
    evaluation = spec.get("eval")
    if evaluation is not None and (not isinstance(evaluation, dict) or not isinstance(evaluation.get("tasks"), list)
                                   or not evaluation["tasks"] or set(evaluation) - set(EVAL_KEYS)
                                   or not all(isinstance(evaluation.get(k, t()), t) for k, t in EVAL_KEYS.items())):
        raise SpecError(f"{path}: 'eval' is {{tasks: [TASK, ...], limit: N, batch_size: B}} (`prores eval`'s"
                        f" options), got {evaluation!r}.")
    for resources in [spec.get("slurm") or {}] + [r.get("slurm") or {} for r in where]:
        unknown = sorted(set(resources) - set(SLURM_KEYS))
        if unknown:
            raise SpecError(f"{path}: unknown Slurm resource {', '.join(unknown)}; known: {', '.join(SLURM_KEYS)}.")
        for key, value in resources.items():
            problem = SLURM_CHECKS[key](value)
            if problem:
                raise SpecError(f"{path}: slurm.{key}: {problem}")
    return spec


def spec_path(spec: str) -> Path:
    try:
        return find_file(spec, PACKAGED_SWEEPS, "sweep spec")
    except UsageError as exc:
        raise SpecError(str(exc)) from None


def expand(spec_file: str, root: str = "runs", processes: Optional[int] = None,
           name: Optional[str] = None, overrides: Sequence[str] = ()) -> tuple[Path, list[Cell]]:
    """The sweep's directory and its validated cells. ``processes``: the world size each cell gets (the
    local runner: 1), checked against the cell's tp × pp; None: taken from its Slurm resources. ``name``
    replaces the spec's (a new sweep directory). ``overrides``: ``KEY=VALUE`` for every cell, after all of
    the spec's (the command line's ``--set``)."""
    path = spec_path(spec_file)
    spec = _read(path)
    extra = _every_cell(spec, overrides)
    name = name or spec.get("name") or path.stem
    sweep_dir = Path(root).absolute() / name
    grid = spec.get("grid") or {}
    cells = []
    for combo in itertools.product(*[list(values) for values in grid.values()]):
        values = dict(zip(grid, combo))
        settings = dict(spec.get("set") or {})
        for key, value in values.items():
            settings |= (grid[key][value] or {}) if isinstance(grid[key], dict) else {key: value}
        slurm, seeds, skip = SLURM_KEYS | (spec.get("slurm") or {}), spec.get("seeds"), False
        for rule in spec.get("where") or []:
            if _matches(rule["when"], values):
                settings |= rule.get("set") or {}
                slurm |= rule.get("slurm") or {}
                seeds, skip = rule.get("seeds", seeds), rule.get("skip", skip)
        for seed in [] if skip else seeds or [None]:
            cell_values = values | ({} if seed is None else {"train.seed": seed})
            cell_settings = settings | ({} if seed is None else {"train.seed": seed})
            cells.append(_cell(path, len(cells), sweep_dir, spec, cell_values, cell_settings, extra, slurm,
                               processes))
    names = [c.name for c in cells]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise SpecError(f"{path}: cells would share the run directories {', '.join(clashes)}; give the grid values"
                        " that differ only in punctuation distinct names.")
    return sweep_dir, cells


def _every_cell(spec: dict, overrides: Sequence[str]) -> list[str]:
    """The command line's ``--set KEY=VALUE`` for every cell, refused for a key that tells the cells apart (a
    grid key, one a named axis sets, the seed): the cells' names would say one thing and their configs another."""
    grid = spec.get("grid") or {}
    apart = {key: key for key, values in grid.items() if not isinstance(values, dict)}
    apart |= {k: axis for axis, values in grid.items() if isinstance(values, dict) for v in values.values()
              for k in v or {}}
    if spec.get("seeds") or any(r.get("seeds") for r in spec.get("where") or []):
        apart["train.seed"] = "seeds"
    for override in overrides:
        key, eq, _ = override.partition("=")
        key = key.strip()
        if not eq or not key or key.startswith("@"):
            raise SpecError(f"--set {override!r}: give KEY=VALUE (a preset goes in the spec's presets: list).")
        if key in apart:
            raise SpecError(f"--set {override!r}: the spec's {apart[key]!r} sets {key} to tell its cells apart;"
                            " choose among them with --only, or change the spec.")
    return list(overrides)


def check_unchanged(sweep_dir: Path, cells: list[Cell], spec_file: str) -> None:
    """A sweep directory keeps the cells it was started with: a spec that now describes others is refused,
    with the difference."""
    if not (Path(sweep_dir) / "cells.jsonl").is_file():
        return
    was = {c.name: c for c in read_cells(sweep_dir)}
    now = {c.name: c for c in cells}
    if list(was) == list(now) and all(_same(was[n], now[n]) for n in now):
        return
    added, removed = [n for n in now if n not in was], [n for n in was if n not in now]
    changed = [n for n in now if n in was and not _same(was[n], now[n])]
    parts = [f"{what}: {', '.join(names)}" for what, names in
             (("cells added", added), ("removed", removed), ("changed", changed)) if names]
    difference = "; ".join(parts) or "the same cells in another order"
    raise SpecError(f"{sweep_dir} holds another sweep than {spec_file} now describes ({difference}): run the spec"
                    " it was started from (with its --set, if any), or start a new sweep beside it with --name NAME.")


def _same(a: Cell, b: Cell) -> bool:
    """The same cell, wherever the sweep directory was reached from (older sweeps stored relative paths); its
    evaluation may change (it trains nothing)."""
    def key(c: Cell) -> dict:
        return asdict(c) | {"run_dir": Path(c.run_dir).name, "eval": None}
    return key(a) == key(b)


def _cell(path: Path, index: int, sweep_dir: Path, spec: dict, values: dict, settings: dict, extra: list[str],
          slurm: dict, processes: Optional[int]) -> Cell:
    """One validated cell: its name from its grid values, its overrides from the spec's settings, then
    ``extra`` (the command line's)."""
    cell_name = "-".join(_token(k, v) for k, v in values.items()) or "cell"
    overrides = ([f"@{p}" for p in spec.get("presets") or []] + [f"{k}={yaml_value(v)}" for k, v in settings.items()]
                 + extra)
    cell = Cell(index, cell_name, str(sweep_dir / cell_name), str(spec["base"]), overrides, values, slurm,
                spec.get("eval") or {})
    try:
        cfg = load_config(cell.base, tuple(overrides))
        check_divisible(processes or slurm["nodes"] * slurm["ntasks_per_node"], cfg.parallel.tp, cfg.parallel.pp)
    except UsageError as exc:
        raise SpecError(f"{path}: cell {cell_name} ({', '.join(overrides)}): {exc}") from None
    return cell


def select(cells: list[Cell], only: list[str]) -> list[Cell]:
    """The cells whose grid values match every ``KEY=VALUE[,VALUE...]`` of ``only`` (a seed is
    ``train.seed``): the part of a sweep to run now. The sweep directory still holds them all."""
    chosen = cells
    for entry in only:
        key, sep, values = entry.partition("=")
        keys = sorted({k for c in cells for k in c.grid})
        if not sep or key not in keys:
            raise SpecError(f"--only {entry!r}: give KEY=VALUE[,VALUE...] with KEY one of the grid's"
                            f" {', '.join(keys)}.")
        wanted = set(values.split(","))
        chosen = [c for c in chosen if str(c.grid.get(key)) in wanted]
    if only and not chosen:
        raise SpecError(f"--only {' '.join(only)}: no cell matches; `prores sweep status DIR` lists them.")
    return chosen


def write_cells(sweep_dir: Path, cells: list[Cell]) -> Path:
    """``cells.jsonl``, written once (the same cells again leave the file as it is)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / "cells.jsonl"
    if not path.is_file():
        write_atomic(path, "".join(json.dumps(asdict(c)) + "\n" for c in cells))
    return path


def read_cells(sweep_dir: Path) -> list[Cell]:
    path = Path(sweep_dir) / "cells.jsonl"
    if not path.is_file():
        raise UsageError(f"{sweep_dir} is not a sweep directory (no cells.jsonl); `prores sweep SPEC` writes one.")
    return [Cell(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]

