"""`prores sweep` and `prores report`: specs, cell names, the local and Slurm runners, status, the report."""

import csv
import fcntl
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import termios
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import shutil
import yaml
from PIL import Image
from tensorboard.backend.event_processing import event_accumulator

from conftest import NO_SLURM, child_env, cli_command, need, run_cli, slurm_available
from prores.config import load_config
from prores.errors import UsageError
from prores.study.runners import sbatch_commands
from prores.monitor.tensorboard import read_scalars
from prores.study.sweep import SpecError, expand, read_cells, write_cells

ROOT = Path(__file__).resolve().parent.parent
TINY = {"model.seq_length": 32, "train.micro_batch_size": 4, "data.eval_samples": 8, "kernels.backend": "eager",
        "train.steps": 6, "train.eval_interval": 3, "train.log_interval": 1, "logging.stats_interval": 2}


def spec(tmp_path, name="s", **entries) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"base": "tiny.yaml", "set": TINY} | entries, sort_keys=False))
    return str(path)


# ------------------------------------------------------------------ specs and cells


def test_cells_are_the_grid_product_named_by_their_values(tmp_path):
    sweep_dir, cells = expand(spec(tmp_path, grid={"model.num_layers": [48, 6], "model.norm_layout": ["post", "pre"],
                                                   "optim.lr": [1.0e-3]}, seeds=[1, 2]), root=str(tmp_path / "runs"))
    assert sweep_dir == tmp_path / "runs" / "s"
    assert [c.name for c in cells[:3]] == ["L048-post-lr0.001-s1", "L048-post-lr0.001-s2", "L048-pre-lr0.001-s1"]
    assert len(cells) == 8 and len({c.name for c in cells}) == 8 and [c.index for c in cells] == list(range(8))
    first = cells[0]
    assert first.run_dir == str(sweep_dir / first.name)
    assert first.grid == {"model.num_layers": 48, "model.norm_layout": "post", "optim.lr": 1.0e-3, "train.seed": 1}
    assert first.train_args()[:1] == ["tiny.yaml"] and "model.num_layers=48" in first.overrides
    assert "train.seed=1" in first.overrides and first.train_args()[-2:] == ["--run-dir", first.run_dir]
    again = expand(spec(tmp_path, grid={"model.num_layers": [48, 6], "model.norm_layout": ["post", "pre"],
                                        "optim.lr": [1.0e-3]}, seeds=[1, 2]), root=str(tmp_path / "runs"))[1]
    assert again == cells  # stable


def test_where_rules_set_keys_and_slurm_resources_per_cell(tmp_path):
    _, cells = expand(spec(tmp_path, grid={"model.num_layers": [12, 96]},
                           where=[{"when": {"model.num_layers": [96, 120]}, "set": {"prores.T": 500},
                                   "slurm": {"nodes": 2}}],
                           slurm={"ntasks_per_node": 4, "gpus_per_node": 4}))
    shallow, deep = cells
    assert "prores.T=500" in deep.overrides and not any(o.startswith("prores.T=") for o in shallow.overrides)
    assert (shallow.slurm["nodes"], deep.slurm["nodes"]) == (1, 2)
    assert shallow.slurm["ntasks_per_node"] == deep.slurm["ntasks_per_node"] == 4


def test_named_axes_per_rule_seeds_and_skipped_cells(tmp_path):
    """A named axis labels sets of overrides; a rule may give its cells their own seeds, or drop them."""
    _, cells = expand(spec(tmp_path, grid={"model.num_layers": [2, 3],
                                           "method": {"A": {}, "B + post": {"model.norm_layout": "post"}}},
                           seeds=[1], where=[{"when": {"method": "A"}, "seeds": [1, 2]},
                                             {"when": {"method": "B + post", "model.num_layers": 3}, "skip": True}]))
    assert [c.name for c in cells] == ["L002-A-s1", "L002-A-s2", "L002-B_+_post-s1", "L003-A-s1", "L003-A-s2"]
    assert "model.norm_layout=post" in cells[2].overrides and cells[2].grid["method"] == "B + post"
    assert not any(o.startswith("model.norm_layout") for o in cells[0].overrides)


def test_the_packaged_cpu_studies_validate_every_cell(tmp_path):
    """`prores sweep SPEC --dry-run` expands these (every cell's config loads)."""
    _, depth = expand("cpu-depth.yaml", root=str(tmp_path))
    # Pre-LN and ProRes three seeds; Post-LN ±ProRes to 48 blocks; LNS and Scaled Init three at the horizon's depths
    assert len(depth) == 6 * (3 + 5 + 3) + 3 * 2 + 3 * 2 * 2
    third = [c.name for c in depth if c.grid["train.seed"] == 3 and c.grid["method"] in ("LNS", "Pre-LN + Scaled Init")]
    assert sorted(third) == sorted(f"L{d:03d}-{m}-s3" for d in (12, 48, 120) for m in ("LNS", "Pre_LN_+_Scaled_Init"))
    _, zoo = expand("cpu-zoo.yaml", root=str(tmp_path))
    assert len(zoo) == 2 * 9 * 2 * 2  # depths × methods × ProRes off/on × seeds
    cell = next(c for c in zoo if c.name == "L048-CompleteP-on-s2")
    assert {"model.depth_mup_alpha=1", "prores.schedule=linear", "train.steps=150"} <= set(cell.overrides)
    _, dyt = expand("cpu-zoo-dyt.yaml", root=str(tmp_path))
    assert [c.name for c in dyt] == ["a0_1_lr_1.5e_3-s1", "a0_2_lr_1.5e_3-s1", "a0_0.5_lr_5e_4-s1", "a0_0.5_lr_4e_3-s1"]


def test_the_depth_pages_command_trains_the_kept_cells_on_eager_kernels(tmp_path):
    """docs/results/cpu-depth.md's command for training its kept results again: every cell on eager kernels,
    where the spec alone takes `auto` (block on a CPU with a C++ compiler)."""
    page = (ROOT / "docs" / "results" / "cpu-depth.md").read_text()
    command = re.search(r"`(prores sweep cpu-depth\.yaml [^`]*--set kernels\.backend=eager)` trains as they were",
                        page).group(1)
    proc = run_cli(*shlex.split(command)[1:], "--root", str(tmp_path), "--dry-run", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trains = [line for line in proc.stdout.splitlines() if line.startswith("prores train ")]
    _, cells = expand("cpu-depth.yaml")
    assert len(trains) == len(cells) and all(" --set kernels.backend=eager --run-dir " in t for t in trains)
    assert load_config(cells[0].base, tuple(cells[0].overrides)).kernels.backend == "auto"


def test_one_sbatch_array_per_resource_group(tmp_path):
    sweep_dir, cells = expand(spec(tmp_path, grid={"model.num_layers": [12, 96, 24]},
                                   where=[{"when": {"model.num_layers": 96}, "slurm": {"nodes": 2, "time": "48:00:00"}}]))
    commands = sbatch_commands(sweep_dir, cells, sweep_dir / "cells.jsonl")
    commands = [c for c, _ in commands]
    assert [c[2] for c in commands] == ["--array=0,2", "--array=1"]
    assert "--nodes=2" in commands[1] and "--time=48:00:00" in commands[1] and "--nodes=1" in commands[0]
    assert all(c[-2].endswith("slurm/sweep.sbatch") for c in commands)
    cache = f"TORCHINDUCTOR_CACHE_DIR={sweep_dir.resolve() / 'inductor-cache'}"  # the sweep's compiled kernels
    assert all(c[-3].startswith("--export=ALL,") and c[-3].endswith("," + cache) for c in commands)


def test_a_sweeps_cells_share_one_inductor_cache_in_its_directory(tmp_path):
    """Compiled cells keep Inductor's graphs and kernels in RUNS/SWEEP/inductor-cache (not /tmp), where every
    later cell of the sweep, on any node that shares the directory, finds them."""
    path = spec(tmp_path, "compiled", grid={"train.seed": [1, 2]},
                set=TINY | {"kernels.backend": "compile", "train.steps": 2, "model.num_layers": 2})
    proc = sweep_cli(path, "--root", str(tmp_path / "runs"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cache = tmp_path / "runs" / "compiled" / "inductor-cache"
    assert any((cache / "fxgraph").rglob("*")), sorted(p.name for p in cache.iterdir()) if cache.exists() else None


@pytest.mark.parametrize("entries,message", [
    ({"grid": {"model.num_layers": 12}}, "grid entry 'model.num_layers' must be a non-empty list"),
    ({"gird": {}}, "unknown entry gird"),
    ({"seeds": [1, "x"]}, "'seeds' must be a non-empty list of integers"),
    ({"where": [{"set": {}}]}, "'where' is a list of rules"),
    ({"slurm": {"gpus": 8}}, "unknown Slurm resource gpus"),
    ({"presets": "paper-setup"}, "'presets' is a list of preset names"),
    ({"presets": ["no-such-preset"]}, "no-such-preset"),
    ({"grid": {"model.num_heads": [4, 3]}},
     "cell num_heads3 (model.seq_length=32, ") ,
    ({"grid": {"parallel.tp": [1, 2]}}, "cell tp2 ("),
])
def test_a_bad_spec_or_cell_is_one_error_and_nothing_starts(tmp_path, entries, message):
    path = spec(tmp_path, **entries)
    with pytest.raises(SpecError, match=None) as err:
        expand(path, root=str(tmp_path / "runs"), processes=1)
    assert message in str(err.value) and path in str(err.value)
    proc = run_cli("sweep", path, "--root", str(tmp_path / "runs"), timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and message in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_set_on_the_command_line_overrides_every_cell_after_the_spec(tmp_path):
    """`prores sweep SPEC --set KEY=VALUE`: last in every cell's overrides, so it wins over `set:` and a
    `where` rule alike; the cells keep their names."""
    path = spec(tmp_path, grid={"model.num_layers": [2, 3]},
                where=[{"when": {"model.num_layers": 3}, "set": {"optim.lr": 0.5}}])
    _, plain = expand(path)
    _, cells = expand(path, overrides=["optim.lr=0.25", "kernels.backend=block"])
    assert [c.name for c in cells] == [c.name for c in plain] == ["L002", "L003"]
    for was, now in zip(plain, cells):
        assert now.overrides == was.overrides + ["optim.lr=0.25", "kernels.backend=block"]
        cfg = load_config(now.base, tuple(now.overrides))
        assert (cfg.optim.lr, cfg.kernels.backend) == (0.25, "block")
    assert load_config(plain[1].base, tuple(plain[1].overrides)).optim.lr == 0.5


@pytest.mark.parametrize("override,message", [
    ("model.num_layers=4", "the spec's 'model.num_layers' sets model.num_layers to tell its cells apart"),
    ("model.norm_layout=pre", "the spec's 'method' sets model.norm_layout to tell its cells apart"),
    ("train.seed=3", "the spec's 'seeds' sets train.seed to tell its cells apart"),
    ("@paper-setup", "give KEY=VALUE (a preset goes in the spec's presets: list)"),
    ("kernels.backend", "give KEY=VALUE"),
])
def test_set_refuses_a_key_that_tells_the_cells_apart(tmp_path, override, message):
    path = spec(tmp_path, grid={"model.num_layers": [2, 3], "method": {"A": {}, "B": {"model.norm_layout": "post"}}},
                seeds=[1])
    with pytest.raises(SpecError) as err:
        expand(path, overrides=[override])
    assert str(err.value).startswith(f"--set {override!r}: ") and message in str(err.value)


def test_a_bad_cell_names_the_config_problem(tmp_path):
    with pytest.raises(SpecError, match=r"cell num_heads3 .*model.hidden_size=128 is not divisible by model.num_heads=3"):
        expand(spec(tmp_path, grid={"model.num_heads": [4, 3]}), processes=1)
    with pytest.raises(SpecError, match=r"cell tp2 .*world size 1 is not divisible by parallel.tp × parallel.pp"):
        expand(spec(tmp_path, grid={"parallel.tp": [1, 2]}), processes=1)


def test_a_missing_spec_or_sweep_directory_is_a_clear_error(tmp_path):
    with pytest.raises(SpecError, match="sweep spec 'nope.yaml' does not exist"):
        expand("nope.yaml")
    with pytest.raises(UsageError, match="is not a sweep directory"):
        read_cells(tmp_path)


def test_the_packaged_paper_grid(tmp_path):
    _, cells = expand("paper-depth.yaml", root=str(tmp_path))
    assert len(cells) == 6 * 5 * 2
    depths = {c.grid["model.num_layers"] for c in cells}
    assert depths == {12, 24, 48, 72, 96, 120}
    for c in cells:
        deep = c.grid["model.num_layers"] >= 96
        assert ("prores.T=500" in c.overrides) == deep
        assert ("model.init=deepnorm" in c.overrides) == (c.grid["model.norm_layout"] == "deepnorm")
        assert c.slurm["gpus_per_node"] == 8 and c.slurm["ntasks_per_node"] == 8


# ------------------------------------------------------------------ the local runner, status and report


def sweep_cli(*args, **kwargs):
    return run_cli("sweep", *args, **kwargs)


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """Four cells, two at a time; one diverges on purpose (a learning rate that overflows the weights)."""
    tmp = tmp_path_factory.mktemp("local")
    path = spec(tmp, "four", grid={"model.num_layers": [2, 3], "prores.schedule": ["linear", "none"]}, seeds=[1],
                where=[{"when": {"model.num_layers": 3, "prores.schedule": "none"}, "set": {"optim.lr": 1.0e30}}])
    proc = sweep_cli(path, "--root", str(tmp / "runs"), "--jobs", "2")
    return tmp, path, tmp / "runs" / "four", proc


def test_the_local_runner_runs_every_cell(local_sweep):
    _, _, sweep_dir, proc = local_sweep
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]  # a divergence is a result
    assert "prores sweep: 3 completed, 1 diverged" in proc.stdout
    cells = read_cells(sweep_dir)
    assert [c.name for c in cells] == ["L002-linear-s1", "L002-none-s1", "L003-linear-s1", "L003-none-s1"]
    for c in cells:
        status = json.loads((Path(c.run_dir) / "summary.json").read_text())["status"]
        assert status == ("diverged" if c.name == "L003-none-s1" else "completed")
        assert (sweep_dir / "logs" / f"{c.name}.log").is_file()


def test_status_lists_every_cell_with_its_state_step_restarts_and_loss(local_sweep, tmp_path):
    _, _, sweep_dir, _ = local_sweep
    attempts = sweep_dir / "L002-linear-s1" / "attempts.jsonl"
    kept = attempts.read_text()
    attempts.write_text(kept + "".join(json.dumps({"event": "start", "time": 1e10 + r, "step": 3, "restart": r,
                                                   "job": "x", "host": "h"}) + "\n" for r in (1, 2)))
    try:
        proc = sweep_cli("status", str(sweep_dir), timeout=300)
    finally:
        attempts.write_text(kept)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[1:-1]}
    assert rows["L002-linear-s1"][:3] == ["completed", "6", "2"] and rows["L003-none-s1"][0] == "diverged"
    assert rows["L002-none-s1"][2] == "0"
    acc = event_accumulator.EventAccumulator(str(sweep_dir / "L002-none-s1"))
    acc.Reload()
    assert float(rows["L002-none-s1"][3]) == pytest.approx(acc.Scalars("train/loss")[-1].value, abs=5e-5)
    assert proc.stdout.splitlines()[-1] == "3 completed, 1 diverged"


def test_a_rerun_skips_finished_cells(local_sweep):
    _, path, sweep_dir, _ = local_sweep
    proc = sweep_cli(path, "--root", str(sweep_dir.parent))
    assert proc.returncode == 0 and "4 of 4 cells finished already; skipping them" in proc.stdout
    assert "prores sweep: nothing to run" in proc.stdout


def test_kept_cells_restore_to_the_same_report_and_the_sweep_skips_them(local_sweep, tmp_path):
    """scripts/keep_cells.py packs each finished cell without its checkpoints (one tar.xz a cell); unpacked where
    the sweep was, `prores sweep` skips them all and `prores report` writes the same results.csv."""
    import sys

    _, path, sweep_dir, _ = local_sweep
    script = Path(__file__).resolve().parents[1] / "scripts" / "keep_cells.py"
    kept, aside = tmp_path / "kept", sweep_dir.with_name("four-aside")
    assert run_cli("report", str(sweep_dir), "--out", str(tmp_path / "before"), timeout=300).returncode == 0
    proc = subprocess.run([sys.executable, str(script), str(sweep_dir), str(kept)], capture_output=True, text=True,
                          env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in kept.glob("*.tar.xz")) == [f"{c.name}.tar.xz" for c in read_cells(sweep_dir)]
    sweep_dir.rename(aside)
    try:
        proc = subprocess.run([sys.executable, str(script), "--restore", str(kept), str(sweep_dir)],
                              capture_output=True, text=True, env=child_env(), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not any(sweep_dir.glob("*/checkpoints"))
        rerun = sweep_cli(path, "--root", str(sweep_dir.parent))
        assert "4 of 4 cells finished already; skipping them" in rerun.stdout, rerun.stdout[-2000:]
        assert run_cli("report", str(sweep_dir), "--out", str(tmp_path / "after"), timeout=300).returncode == 0
        assert (tmp_path / "after" / "results.csv").read_text() == (tmp_path / "before" / "results.csv").read_text()
    finally:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        aside.rename(sweep_dir)


def test_a_kept_results_csv_takes_a_later_reports_rows_in_the_sweeps_order(local_sweep, tmp_path):
    """scripts/merge_results.py: the kept rows of two cells and a later report's of three (one of them again)
    give the whole sweep's results.csv, row for row; a later run that ended elsewhere is refused, nothing written."""
    import sys

    _, path, sweep_dir, _ = local_sweep
    assert run_cli("report", str(sweep_dir), "--out", str(tmp_path / "all"), timeout=300).returncode == 0
    whole = (tmp_path / "all" / "results.csv").read_text().splitlines(keepends=True)
    head, rows = whole[0], whole[1:]
    kept, later = tmp_path / "kept.csv", tmp_path / "later.csv"
    kept.write_text(head + rows[2] + rows[0])
    pending = rows[0].replace(",completed,", ",pending,", 1)  # a cell the later sweep did not run: no run
    later.write_text(head + pending + "".join(rows[1:]))
    script = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "merge_results.py")]
    proc = subprocess.run([*script, str(kept), str(later), "--spec", str(path)], capture_output=True, text=True,
                          env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert kept.read_text() == "".join(whole)
    loss = next(r for r in csv.DictReader(open(later)) if r["status"] == "completed")["final_valid_loss"]
    later.write_text(later.read_text().replace(loss, f"{float(loss) + 1e-4:.6f}", 1))
    proc = subprocess.run([*script, str(kept), str(later), "--spec", str(path)], capture_output=True, text=True,
                          env=child_env(), timeout=300)
    assert proc.returncode == 2 and "not the same run" in proc.stderr and kept.read_text() == "".join(whole)


def events(run_dir) -> dict:
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"]}


def test_the_report_agrees_with_the_event_files(local_sweep):
    _, _, sweep_dir, _ = local_sweep
    proc = run_cli("report", str(sweep_dir), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in csv.DictReader(open(sweep_dir / "results.csv"))}
    assert sorted(rows) == [c.name for c in read_cells(sweep_dir)]
    for name, row in rows.items():
        if row["status"] == "diverged":
            assert row["final_valid_loss"] == row["best_valid_loss"] == row["final_ppl"] == ""  # never a number
            assert row["diverged_at"] == "1"
            continue
        scalars = events(sweep_dir / name)
        valid = scalars["valid/loss"]
        assert float(row["final_valid_loss"]) == pytest.approx(valid[max(valid)], rel=1e-6)
        depth = int(name[3])
        act = {l: scalars[f"layers/act_rms/layer_{l:03d}"] for l in range(1, depth + 1)}
        ratio = act[depth][max(act[depth])] / act[1][max(act[1])]
        assert float(row["act_rms_last_over_first"]) == pytest.approx(ratio, rel=1e-9)
        assert float(row["act_rms_growth_per_block"]) == pytest.approx(ratio ** (1 / (depth - 1)), rel=1e-9)
        best = min(valid, key=valid.get)
        assert (int(row["best_valid_step"]), float(row["best_valid_loss"])) == (best, pytest.approx(valid[best]))
        assert float(row["final_ppl"]) == pytest.approx(math.exp(valid[max(valid)]), rel=1e-6)
        assert row["model.num_layers"] == name[3] and row["prores.schedule"] == name.split("-")[1]
    report = (sweep_dir / "report.md").read_text()
    assert "In progress" not in report
    table = [line for line in report.splitlines() if line.startswith("| 3 | none |")]
    assert len(table) == 2 and "| — | — |" in table[0] and "diverged 1 (at step 1)" in table[0]
    assert table[1] == "| 3 | none | — | — | 0 |"  # the growth table: no finished run to measure
    one = [line for line in report.splitlines() if line.startswith("| 2 | linear |")]
    assert f"| {float(rows['L002-linear-s1']['final_valid_loss']):.4f} |" in one[0]
    growth = float(rows["L002-linear-s1"]["act_rms_last_over_first"])
    assert one[1] == f"| 2 | linear | {growth:.3f} | {growth:.4f} | 1 |"  # the growth table (L = 2: factor = ratio)
    for image in ("ppl_vs_depth.png", "valid_curves.png", "act_rms_by_layer.png", "alpha-linear.png"):
        assert f"]({image})" in report
        picture = Image.open(sweep_dir / image)
        picture.verify()
        assert picture.format == "PNG" and min(picture.size) > 200


def test_seeds_are_averaged_with_their_spread_and_plain_run_directories_work(local_sweep, tmp_path):
    """Two "seeds" of one cell from plain run directories: the table shows mean ± sample std."""
    _, _, sweep_dir, _ = local_sweep
    a, b = sweep_dir / "L002-linear-s1", sweep_dir / "L002-none-s1"
    proc = run_cli("report", str(a), str(b), "--out", str(tmp_path / "r"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "r" / "results.csv")))
    assert [r["prores.schedule"] for r in rows] == ["linear", "none"]  # the keys that differ are the grid
    assert "model.num_layers" not in rows[0]


def test_a_sweep_in_progress_says_so(local_sweep, tmp_path):
    """Six cells of which the four of the finished sweep have run: the other two are pending."""
    tmp, _, sweep_dir, _ = local_sweep
    bigger = spec(tmp_path, "four", grid={"model.num_layers": [2, 3, 4], "prores.schedule": ["linear", "none"]},
                  seeds=[1], where=[{"when": {"model.num_layers": 3, "prores.schedule": "none"}, "set": {"optim.lr": 1.0e30}}])
    grown, cells = expand(bigger, root=str(tmp_path / "runs"))
    write_cells(grown, cells)
    for cell in read_cells(sweep_dir):
        shutil.copytree(cell.run_dir, grown / cell.name)
    report = run_cli("report", str(grown), timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    text = (grown / "report.md").read_text()
    assert "**In progress**: 3 completed, 1 diverged, 2 pending of 6 cells" in text
    assert "| 4 | linear |" in text and "pending 1" in text


def test_a_dry_run_writes_nothing_and_a_changed_spec_is_refused(local_sweep, tmp_path):
    tmp, path, sweep_dir, _ = local_sweep
    before = (sweep_dir / "cells.jsonl").read_bytes()
    dry = sweep_cli(path, "--root", str(sweep_dir.parent), "--dry-run")
    assert dry.returncode == 0 and "4 of 4 cells finished already" in dry.stdout and "prores train" not in dry.stdout
    assert (sweep_dir / "cells.jsonl").read_bytes() == before
    fresh = sweep_cli(path, "--root", str(tmp_path / "elsewhere"), "--dry-run")
    assert fresh.returncode == 0 and fresh.stdout.count("prores train tiny.yaml") == 4
    assert not (tmp_path / "elsewhere").exists()  # not even a directory
    # --set is part of the cells: the finished sweep, started without it, refuses it too
    proc = sweep_cli(path, "--root", str(sweep_dir.parent), "--set", "kernels.backend=block", "--dry-run")
    assert proc.returncode == 2 and "(changed: L002-linear-s1, L002-none-s1, L003-linear-s1, L003-none-s1)" in proc.stderr
    with_set = sweep_cli(path, "--root", str(tmp_path / "elsewhere"), "--set", "kernels.backend=block", "--dry-run")
    assert with_set.returncode == 0 and with_set.stdout.count(" --set kernels.backend=block --run-dir ") == 4
    changed = spec(tmp, "four", grid={"model.num_layers": [2, 4], "prores.schedule": ["linear", "none"]}, seeds=[1],
                   where=[{"when": {"model.num_layers": 3, "prores.schedule": "none"}, "set": {"optim.lr": 1.0e30}}])
    for extra in ((), ("--dry-run",)):
        proc = sweep_cli(changed, "--root", str(sweep_dir.parent), *extra)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"prores: error: {sweep_dir} holds another sweep than {changed} now describes (cells added:"
            f" L004-linear-s1, L004-none-s1; removed: L003-linear-s1, L003-none-s1): run the spec it was started"
            " from (with its --set, if any), or start a new sweep beside it with --name NAME."]
    assert (sweep_dir / "cells.jsonl").read_bytes() == before
    other = sweep_cli(changed, "--root", str(sweep_dir.parent), "--name", "four-deeper", "--dry-run")
    assert other.returncode == 0 and f"{sweep_dir.parent / 'four-deeper'}" in other.stdout


def test_an_eval_block_evaluates_the_completed_cells_and_the_report_shows_them(local_sweep):
    """Added to a finished sweep (its cells train nothing new), the evaluation runs on every completed cell."""
    tmp, _, sweep_dir, _ = local_sweep
    evaluated = spec(tmp, "four", grid={"model.num_layers": [2, 3], "prores.schedule": ["linear", "none"]},
                     seeds=[1], eval={"tasks": ["prores_lastword"], "limit": 3, "batch_size": 3},
                     where=[{"when": {"model.num_layers": 3, "prores.schedule": "none"}, "set": {"optim.lr": 1.0e30}}])
    proc = sweep_cli(evaluated, "--root", str(sweep_dir.parent), timeout=1800)
    assert proc.returncode == 0 and "prores sweep: 3 evaluated" in proc.stdout, proc.stdout[-3000:]
    assert "3 completed cells still to evaluate" in proc.stdout
    again = sweep_cli(evaluated, "--root", str(sweep_dir.parent))
    assert "prores sweep: nothing to run" in again.stdout
    report = run_cli("report", str(sweep_dir), timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    rows = {r["name"]: r for r in csv.DictReader(open(sweep_dir / "results.csv"))}
    for cell in read_cells(sweep_dir):
        results = Path(cell.run_dir) / "eval" / "6" / "results.json"
        if cell.name == "L003-none-s1":  # diverged: nothing to evaluate
            assert not results.exists() and rows[cell.name]["eval:prores_lastword/acc"] == ""
            continue
        acc = json.loads(results.read_text())["results"]["prores_lastword"]["acc,none"]
        assert float(rows[cell.name]["eval:prores_lastword/acc"]) == acc
    assert "prores_lastword/perplexity" in (sweep_dir / "report.md").read_text()


def test_cells_record_absolute_run_directories(local_sweep, tmp_path):
    """status and report work from any directory."""
    _, _, sweep_dir, _ = local_sweep
    assert all(Path(c.run_dir).is_absolute() for c in read_cells(sweep_dir))
    proc = sweep_cli("status", str(sweep_dir), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "3 completed, 1 diverged"


def test_a_cell_that_failed_before_its_config_shows_in_the_report(tmp_path):
    path = spec(tmp_path, "broken", grid={"data.corpus": ["shakespeare", str(tmp_path / "missing.txt")]})
    proc = sweep_cli(path, "--root", str(tmp_path / "runs"), timeout=600)
    assert proc.returncode == 1 and "1 completed, 1 failed" in proc.stdout, proc.stdout[-3000:]
    sweep_dir = tmp_path / "runs" / "broken"
    report = run_cli("report", str(sweep_dir), timeout=300)
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr[-3000:]
    rows = {r["name"]: r for r in csv.DictReader(open(sweep_dir / "results.csv"))}
    failed = rows[next(n for n in rows if "missing" in n)]
    assert failed["status"] == "failed" and failed["data.corpus"] == str(tmp_path / "missing.txt")
    assert failed["final_valid_loss"] == ""
    assert f"| {tmp_path / 'missing.txt'} |" in (sweep_dir / "report.md").read_text()


@pytest.mark.parametrize("resources, message", [
    ({"extra": "--qos=high"}, "slurm.extra: '--qos=high' is a string; give a list of sbatch options, e.g."
                              " extra: [\"--qos=high\"]"),
    ({"extra": ["--qos=high", 3]}, "slurm.extra: ['--qos=high', 3]: every entry must be a string (one sbatch"
                                   " option each)"),
    ({"nodes": "2"}, "slurm.nodes: '2' must be a whole number of at least 1"),
    ({"gpus_per_node": -1}, "slurm.gpus_per_node: -1 must be a whole number of at least 0"),
    ({"time": 60}, "slurm.time: 60 must be a string such as \"24:00:00\""),
    ({"partition": ["a"]}, "slurm.partition: ['a'] must be a string (or absent)"),
])
def test_slurm_resources_are_type_checked(tmp_path, resources, message):
    path = spec(tmp_path, slurm=resources)
    proc = sweep_cli(path, "--root", str(tmp_path / "runs"), "--runner", "slurm", "--dry-run", timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"prores: error: {path}: {message}"]


def runner_pids(sweep_dir) -> list[int]:
    return [json.loads(p.read_text())["pid"] for p in (sweep_dir / "state").glob("*.json")]


SLOW = TINY | {"train.steps": 200, "checkpoint.interval": 5}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The two cells of the signal tests, run straight through: what a stopped and resumed sweep must equal."""
    tmp = tmp_path_factory.mktemp("straight")
    path = spec(tmp, "slow", grid={"model.num_layers": [2]}, seeds=[1, 2], set=SLOW)
    proc = sweep_cli(path, "--root", str(tmp / "runs"), "--jobs", "2")
    assert proc.returncode == 0, proc.stdout[-3000:]
    return {c.name: read_scalars(c.run_dir, lambda t: t == "train/loss")["train/loss"]
            for c in read_cells(tmp / "runs" / "slow")}


def default_signals(ignore=()):
    """What a foreground job starts with (a shell started in the background ignores SIGINT), then
    ``ignore`` ignored, as `nohup` and a background job have them."""
    def preexec():
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN if sig in ignore else signal.SIG_DFL)
    return preexec


def stop_a_sweep(tmp_path, sig, ignored=(), terminal=False):
    """Start the two-cell sweep with a foreground job's signal dispositions (``ignored`` ignored), and once its
    first cell has checkpointed send it each ignored signal, then ``sig``: (spec path, sweep dir, runner).
    ``terminal``: the runner's stdin, stdout and stderr are a real pty whose controlling process it is, and the
    stop is a real hang-up, the pty's master side closed (the kernel's SIGHUP, then EIO on every write)."""
    path = spec(tmp_path, "slow", grid={"model.num_layers": [2]}, seeds=[1, 2], set=SLOW)
    sweep_dir = tmp_path / "runs" / "slow"
    command = cli_command("sweep", path, "--root", str(tmp_path / "runs"))
    if terminal:
        master, slave = os.openpty()

        def preexec():
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # stdin, the pty, becomes the new session's terminal
            default_signals(ignored)()

        runner = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=child_env(),
                                  start_new_session=True, preexec_fn=preexec)
        os.close(slave)
    else:
        runner = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=child_env(), preexec_fn=default_signals(ignored))
    first = sweep_dir / "L002-s1" / "checkpoints" / "global_step5" / "manifest.json"
    deadline = time.monotonic() + 300
    while not first.exists():
        assert runner.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    for quiet in ignored:  # ignored at the runner's start: ignored, as a background job's Ctrl-C is
        runner.send_signal(quiet)
        time.sleep(1)
        assert runner.poll() is None
    if terminal:
        said = os.read(master, 65536).decode()  # the few lines said so far (a pty buffers far more)
        assert "prores sweep: 2 cells" in said, said
        os.close(master)
    else:
        runner.send_signal(sig)
    return path, sweep_dir, runner


@pytest.mark.slow
@pytest.mark.parametrize("sig, ignored, terminal", [(signal.SIGINT, (), False), (signal.SIGHUP, (), True),
                                                    (signal.SIGTERM, (signal.SIGINT, signal.SIGHUP), False)],
                         ids=["ctrl-c", "hangup-of-a-real-terminal", "term-under-nohup"])
def test_a_signal_stops_the_runner_and_its_cells_cleanly(tmp_path, sig, ignored, terminal):
    _, sweep_dir, runner = stop_a_sweep(tmp_path, sig, ignored, terminal)
    out, _ = runner.communicate(timeout=300)
    assert runner.returncode == 128 + sig, out
    if not terminal:  # a hung-up terminal shows nobody what the runner says
        assert f"prores sweep: {signal.Signals(sig).name}: stopping 1 running cell" in out
        assert "run the same command again to resume" in out
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
               for pid in runner_pids(sweep_dir)), "a cell outlived its runner"
    status = sweep_cli("status", str(sweep_dir)).stdout
    assert "L002-s1  stopped" in status and "L002-s2  pending" in status
    summary = json.loads((sweep_dir / "L002-s1" / "summary.json").read_text())
    assert summary["status"] == "stopped" and 5 <= summary["steps"] < 200


@pytest.mark.slow
def test_a_rerun_after_a_stop_resumes_every_cell_to_a_straight_runs_losses(tmp_path, straight):
    """Whichever signal stopped the runner, its cells got the same stop (the test above): one re-run shows
    that stop resumable, bit for bit."""
    path, sweep_dir, runner = stop_a_sweep(tmp_path, signal.SIGTERM)
    runner.communicate(timeout=300)
    summary = json.loads((sweep_dir / "L002-s1" / "summary.json").read_text())
    assert summary["status"] == "stopped"
    rerun = sweep_cli(path, "--root", str(tmp_path / "runs"), "--jobs", "2")
    assert rerun.returncode == 0 and "prores sweep: 2 completed" in rerun.stdout, rerun.stdout[-3000:]
    assert f"resuming from step {summary['steps']}" in (sweep_dir / "logs" / "L002-s1.log").read_text()
    for cell in read_cells(sweep_dir):
        assert read_scalars(cell.run_dir, lambda t: t == "train/loss")["train/loss"] == straight[cell.name]


@pytest.mark.slow
def test_a_rerun_never_starts_a_cell_whose_trainer_is_alive(tmp_path):
    """The runner died (SIGKILL) and left its cell training: a re-run leaves that cell to its trainer."""
    path = spec(tmp_path, "alive", grid={"model.num_layers": [2]}, seeds=[1, 2], set=SLOW | {"train.steps": 2000})
    sweep_dir = tmp_path / "runs" / "alive"
    runner = subprocess.Popen(cli_command("sweep", path, "--root", str(tmp_path / "runs")), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=child_env(), preexec_fn=default_signals())
    lock = sweep_dir / "L002-s1" / "lock"
    deadline = time.monotonic() + 300
    while not lock.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    runner.kill()
    runner.wait()
    trainer = json.loads(lock.read_text())["pid"]
    try:
        assert psutil.pid_exists(trainer)
        status = sweep_cli("status", str(sweep_dir)).stdout
        assert "L002-s1  running" in status
        rerun = sweep_cli(path, "--root", str(tmp_path / "runs"), "--dry-run")
        assert "1 cell is running already (L002-s1); it is not started again" in rerun.stdout
        assert rerun.stdout.count("prores train ") == 1 and "L002-s2" in rerun.stdout
    finally:
        os.kill(trainer, signal.SIGKILL)


# ------------------------------------------------------------------ the Slurm runner, on the real Slurm


@pytest.mark.slow
def test_a_four_cell_sweep_runs_as_a_slurm_array(tmp_path):
    need(slurm_available(), NO_SLURM)
    path = spec(tmp_path, "array", grid={"model.num_layers": [2, 3], "prores.schedule": ["linear", "none"]},
                slurm={"nodes": 1, "ntasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1, "time": "00:20:00"})
    sweep_dir = tmp_path / "runs" / "array"
    dry = sweep_cli(path, "--root", str(tmp_path / "runs"), "--runner", "slurm", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.count("sbatch --parsable --array=0,1,2,3 ") == 1
    evaluated = spec(tmp_path, "array", grid={"model.num_layers": [2, 3], "prores.schedule": ["linear", "none"]},
                     slurm={"nodes": 1, "ntasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 1,
                            "time": "00:20:00"}, eval={"tasks": ["prores_lastword"], "limit": 2})
    dry = sweep_cli(evaluated, "--root", str(tmp_path / "runs"), "--runner", "slurm", "--dry-run").stdout
    after = [line for line in dry.splitlines() if "sweep-eval.sbatch" in line]
    assert len(after) == 1 and "--dependency=aftercorr:JOB" in after[0] and after[0].endswith(
        "cells.jsonl --tasks prores_lastword --limit 2")
    proc = sweep_cli(path, "--root", str(tmp_path / "runs"), "--runner", "slurm", cwd=tmp_path)
    assert proc.returncode == 0 and "submitted job" in proc.stdout, proc.stderr[-3000:]
    job = proc.stdout.split("submitted job ")[1].split()[0]
    try:
        deadline = time.monotonic() + 900
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, "the array did not finish"
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job])
    status = sweep_cli("status", str(sweep_dir)).stdout
    assert status.splitlines()[-1] == "4 completed", status + "".join(
        p.read_text()[-2000:] for p in (sweep_dir / "logs").glob("*.out"))
    assert all(json.loads((sweep_dir / c.name / "summary.json").read_text())["steps"] == 6 for c in read_cells(sweep_dir))
    assert len(list((sweep_dir / "logs").glob("prores-array-*_*.out"))) == 4


def test_signal_cells_reaches_each_cells_whole_process_group():
    """A cell's launcher and its workers share the cell's session: a kill reaches the grandchild too, where
    proc.kill() reached only the launcher."""
    from prores.study.runners import signal_cells

    cell = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    worker = psutil.Process(int(cell.stdout.readline()))
    signal_cells([cell], signal.SIGKILL)
    assert cell.wait(timeout=10) == -signal.SIGKILL
    worker.wait(timeout=10)  # gone (psutil.TimeoutExpired otherwise)
    signal_cells([cell], signal.SIGKILL)  # a cell that ended already is left alone


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling on this kernel")
def test_a_niced_runners_cells_stay_niced_in_their_own_sessions():
    """Under autogroup scheduling a cell's session is a scheduling group of its own, of nice 0 unless the
    runner passes its niceness on: `nice prores sweep` would otherwise take a full share from other sessions."""
    probe = textwrap.dedent("""
        import os, subprocess
        from prores.study.runners import keep_niceness
        os.nice(7)
        cell = subprocess.Popen(["sleep", "30"], start_new_session=True)
        keep_niceness(cell.pid)
        print(open(f"/proc/{cell.pid}/autogroup").read().split()[-1])
        cell.kill()
    """)
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip() == "7"


def test_the_horizon_study_is_the_depth_studys_leaders_at_four_times_the_steps():
    """configs/sweeps/cpu-horizon.yaml (issues 30 and 41): 54 cells of 1,000 steps, depths 12, 48 and 120, six
    methods (LayerScale + ProRes since issue 41), three seeds, and every ProRes cell's deepest block saturated
    (linear: at t = T·L) by 75% of training."""
    from prores.config import load_config

    _, cells = expand("cpu-horizon.yaml")
    configs = [load_config("cpu-depth.yaml", c.overrides) for c in cells]
    assert len(cells) == 54 and {c.train.steps for c in configs} == {1000}
    assert sorted({c.model.num_layers for c in configs}) == [12, 48, 120]
    assert sorted({c.grid["method"] for c in cells}) == ["LNS", "LayerScale", "LayerScale + ProRes", "Pre-LN",
                                                         "Pre-LN + ProRes", "Pre-LN + Scaled Init"]
    assert sorted({c.grid["train.seed"] for c in cells}) == [1, 2, 3]
    prores = [c for c in configs if c.prores.schedule == "linear"]
    assert len(prores) == 18 and all(c.prores.T * c.model.num_layers <= 0.75 * c.train.steps for c in prores)
    assert {(c.model.num_layers, c.prores.T * c.model.num_layers / c.train.steps) for c in prores} == {
        (12, 0.12), (48, 0.48), (120, 0.6)}


def test_only_runs_the_cells_with_those_grid_values():
    """`prores sweep --only KEY=VALUE[,VALUE]` (repeatable, all must match): the part of a sweep to run now."""
    from prores.study.sweep import SpecError, select

    _, cells = expand("cpu-horizon.yaml")
    assert [c.name for c in select(cells, ["train.seed=3", "model.num_layers=12,120"])] == [
        c.name for c in cells if c.grid["train.seed"] == 3 and c.grid["model.num_layers"] in (12, 120)]
    assert len(select(cells, ["method=LayerScale + ProRes"])) == 9 and select(cells, []) == cells
    with pytest.raises(SpecError, match=r"^--only 'seed=3': give KEY=VALUE\[,VALUE...\] with KEY one of the grid's"
                                        r" method, model.num_layers, train.seed\.$"):
        select(cells, ["seed=3"])
    with pytest.raises(SpecError, match="no cell matches"):
        select(cells, ["train.seed=9"])


def test_the_runner_starts_the_longest_cells_first(local_sweep):
    """Two jobs, four cells in grid order L002, L002, L003, L003: the two 3-block cells start first."""
    _, _, sweep_dir, _ = local_sweep
    start = {c.name: int(json.loads((sweep_dir / "state" / f"{c.name}.json").read_text())["start"])
             for c in read_cells(sweep_dir)}  # the process's start, in clock ticks since boot
    assert max(start["L003-linear-s1"], start["L003-none-s1"]) <= min(start["L002-linear-s1"], start["L002-none-s1"])


def test_longest_first_orders_by_the_blocks_flops_times_the_tokens(tmp_path):
    from prores.config import load_config
    from prores.model.size import block_flops_per_token
    from prores.study.runners import longest_first

    _, cells = expand(spec(tmp_path, grid={"train.steps": [6, 30], "model.num_layers": [2, 6, 4]}),
                      root=str(tmp_path / "runs"))
    # cost ∝ blocks × steps at one width: 180, 120, 60, 36, 24, 12
    assert [(c.grid["model.num_layers"], c.grid["train.steps"]) for c in longest_first(cells)] == [
        (6, 30), (4, 30), (2, 30), (6, 6), (4, 6), (2, 6)]
    m = load_config(None, ["model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_heads=2",
                           "model.seq_length=16", "model.mlp=swiglu", "model.norm=rmsnorm"]).model
    matrices = 4 * 32 * 32 + 32 * 2 * 64 + 64 * 32  # QKV and out, fc1 (gate and up), fc2
    assert block_flops_per_token(m) == 3 * (2 * (matrices + 2 * 32) + 2 * 2 * 16 * 32)  # + two norms' gains
