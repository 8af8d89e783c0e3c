"""The code's layers: every import points down (import-linter's contracts in pyproject.toml), the config
loads no torch, and the callbacks a run gets come from one registry in one order."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prores.config import ConfigError, load_config
from prores.monitor.registry import CALLBACKS, build_callbacks

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("lint-imports")], cwd=tree, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(tree)})


def test_the_contracts_hold():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("model/norm.py", "import prores.parallel.plan", "every import points down the layers"),
    ("model/norm.py", "import prores.data.corpus", "every import points down the layers"),  # siblings
    ("run/summary.py", "import prores.monitor.spikes", "every import points down the layers"),
    ("config.py", "import prores.launcher.train", "every import points down the layers"),
    ("model/layouts.py", "import prores.run.lr", "the model knows nothing of launching"),
    ("run/lr.py", "import torch", "the config loads no torch"),  # config -> run.lr -> torch
])
def test_a_back_edge_breaks_a_contract(tmp_path, module, line, contract):
    """A copy of the tree with one import that runs up a layer (or, through config's registries, into
    torch): lint-imports fails and names the broken contract."""
    shutil.copytree(ROOT / "prores", tmp_path / "prores", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / "prores" / module
    path.write_text(path.read_text() + f"\n{line}\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    broken = [ln for ln in done.stdout.splitlines() if ln.endswith("BROKEN")]
    assert any(ln.startswith(contract) for ln in broken), done.stdout


BLOCK_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "megatron", "deepspeed", "triton"):
            raise ImportError(f"{name} is blocked in this test")

sys.meta_path.insert(0, NoTorch())
from prores.cli import main
sys.exit(main(sys.argv[1:]))
"""


def no_torch_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH, *args], capture_output=True, text=True, timeout=120)


def test_import_config_loads_no_torch():
    code = "import sys, prores.config; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_config_commands_run_with_torch_unimportable():
    markdown = no_torch_cli("config", "--markdown")
    assert markdown.returncode == 0, markdown.stderr
    assert "| `model.num_layers` | `12` | blocks (L) |" in markdown.stdout
    shown = no_torch_cli("config", "--set", "model.num_layers=48")
    assert shown.returncode == 0 and "model.num_layers" in shown.stdout
    for command in ("config", "train"):
        bad = no_torch_cli(command, "--set", "model.num_layer=48")
        assert bad.returncode == 2
        assert bad.stderr.strip().splitlines() == [
            f"prores: error: unknown config key 'model.num_layer'. Did you mean 'model.num_layers'? Known keys"
            f" here: {', '.join(load_config().to_dict()['model'])}."]


def test_callbacks_run_in_the_registry_order_whatever_the_list_order():
    names = ["checkpoint", "spikes", "progress"]
    cfg = load_config(None, (f"train.callbacks={names}",))
    built = build_callbacks(cfg)
    classes = [CALLBACKS[n][0].split(":")[1] for n in CALLBACKS if n in names]
    assert [type(c).__name__ for c in built] == classes == ["SpikeScores", "ShowProgress", "SaveCheckpoints"]
    spikes = built[0].scores["train/loss"]
    assert (spikes.sigma, spikes.window) == (cfg.monitor.spike_sigma, cfg.monitor.spike_window)


def test_an_unknown_callback_is_one_error():
    with pytest.raises(ConfigError, match=r"^train.callbacks: 'heatmap' is not allowed; choose from lock_lapse, run_record, hang_watchdog,"
                                          r" scalars,"
                                          r" .*\. Did you mean 'heatmaps'\?$"):
        load_config(None, ("train.callbacks=[scalars, heatmap]",))
