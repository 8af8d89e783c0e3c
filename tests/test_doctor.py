"""`prores doctor` on this machine, and on one where training cannot start (a required package that fails to
import, made real by a stand-in package earlier on the path)."""

import importlib.metadata
import re
import shutil
import subprocess

import torch

from conftest import run_cli, slurm_available


def lines(out: str) -> dict[str, str]:
    """Each item's line, by item: ``{"torch": "✓ torch  2.13.0", ...}``."""
    return {m.group(2).strip(): m.group(0) for m in re.finditer(r"^  ([✓✗]) (.{25}) (.*)$", out, re.M)}


def test_the_doctor_prints_its_table_here_and_exits_0(tmp_path):
    proc = run_cli("doctor", "--run-root", str(tmp_path / "runs"), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    found = lines(proc.stdout)
    for dist in ("torch", "deepspeed", "megatron-core"):
        assert found[dist].startswith("  ✓") and found[dist].endswith(importlib.metadata.version(dist)), found[dist]
    for launcher in ("torchrun", "deepspeed", "srun", "sbatch"):
        where = shutil.which(launcher)
        line = found[f"launcher {launcher}"]
        assert line.endswith(where) if where else line.startswith("  ✗")
    assert found["kernels.backend=eager"].startswith("  ✓ kernels.backend=eager")
    assert found["CUDA"].startswith("  ✓" if torch.cuda.is_available() else "  ✗")
    assert f"free under {tmp_path}" in found["run root"]  # the nearest existing directory of the run root
    if slurm_available():
        partitions = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()
        line = found["Slurm partitions"]
        assert line.startswith("  ✓") and partitions and all(p.rstrip("*") in line for p in partitions)
    assert proc.stdout.strip().endswith("prores doctor: ready")


def test_the_doctor_exits_1_naming_what_stops_training(tmp_path):
    fake = tmp_path / "path" / "deepspeed"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    proc = run_cli("doctor", "--run-root", str(tmp_path), PYTHONPATH=str(tmp_path / "path"), timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    assert "✗ deepspeed" in out and "libcudart.so.12" in out and "pip install -e ." in out
    assert out.strip().endswith("prores doctor: training cannot start here: deepspeed")


def test_the_doctor_warns_of_a_deepspeed_or_megatron_other_than_the_suites(monkeypatch):
    """The pins come from prores's own metadata (pyproject.toml); another installed version is a ✗ that names
    both and the fix, and no reason to refuse training."""
    from prores.launcher import doctor

    assert doctor.pinned()["deepspeed"] == "0.19.8" and doctor.pinned()["megatron-core"] == "0.16.1"
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "0.19.9" if d == "deepspeed" else real(d))
    check = doctor.version_of("deepspeed", "deepspeed", True, "")
    assert (check.ok, check.required) == (False, False)
    assert check.detail == ("0.19.9, not 0.19.8, the version prores's suite ran with (prores relies on its"
                            " internals): pip install deepspeed==0.19.8")
    assert doctor.version_of("megatron.core", "megatron-core", True, "").ok


def test_the_doctor_weighs_the_gpus_a_node_shows_against_its_tasks():
    """Each launcher's way of saying the tasks a node starts, against the GPUs a process sees."""
    from prores.launcher.doctor import gpus_for_tasks, tasks_per_node

    assert [tasks_per_node(e) for e in ({"LOCAL_WORLD_SIZE": "8"}, {"SLURM_NTASKS_PER_NODE": "4"},
                                         {"SLURM_TASKS_PER_NODE": "4(x2),3"}, {})] == [8, 4, 4, None]
    verdicts = {(gpus, tasks): gpus_for_tasks(gpus, {} if tasks is None else {"LOCAL_WORLD_SIZE": str(tasks)}).ok
                for gpus, tasks in ((8, 8), (8, 4), (4, 8), (1, 8), (8, None))}
    assert verdicts == {(8, 8): True, (8, 4): False, (4, 8): False, (1, 8): True, (8, None): True}
    assert "srun --gpus-per-task=1" in gpus_for_tasks(4, {"SLURM_NTASKS_PER_NODE": "8"}).detail
    assert "4 idle" in gpus_for_tasks(8, {"LOCAL_WORLD_SIZE": "4"}).detail
