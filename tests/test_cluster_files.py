"""The Docker and Slurm files: lint, agreement with the README, the sweep array script."""

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import NO_PODMAN, child_env, need, run_cli
from test_readme import readme_commands

ROOT = Path(__file__).resolve().parent.parent


def test_hadolint_passes():
    proc = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_installs_prores_with_the_readme_steps():
    """Every README install step except the CPU torch pin (the NGC base brings a CUDA torch)."""
    readme = readme_commands()[0].split(" && ")
    assert readme[0] == "pip install torch==2.13.0" and readme[-1] == "prores train"
    runs = re.findall(r"^RUN (.*)$", (ROOT / "Dockerfile").read_text(), re.M)
    installs = [r.split(" && ") for r in runs if r.startswith("pip install")]
    assert installs == [readme[1:-1]]


def test_dockerfile_base_is_a_pinned_argument():
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", base.group(1))
    assert "FROM ${BASE_IMAGE}" in text


def test_multinode_entrypoint_names_what_is_missing():
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "MASTER_ADDR")}
    proc = subprocess.run(["bash", str(ROOT / "docker" / "entrypoint.sh"), "train"], capture_output=True, text=True,
                          env=env | {"NNODES": "2"})
    assert proc.returncode != 0 and "set NODE_RANK (0..NNODES-1) for a multi-node launch" in proc.stderr


def test_the_sweep_array_script_says_how_it_is_submitted():
    """slurm/sweep.sbatch runs one line of a cells.jsonl; `prores sweep --runner slurm` submits it (test_sweep.py)."""
    proc = subprocess.run(["bash", str(ROOT / "slurm" / "sweep.sbatch")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "usage: sbatch --array=INDICES slurm/sweep.sbatch CELLS.jsonl" in proc.stderr


def readme_docker_run() -> list[str]:
    line = next(l for l in (ROOT / "README.md").read_text().splitlines() if l.startswith("docker run "))
    return shlex.split(line.split("#")[0])


def test_readme_docker_run_keeps_the_results_on_the_host():
    """The working directory is mounted and is the container's: runs/ lands next to the user."""
    args = readme_docker_run()
    mount = args[args.index("-v") + 1].split(":")
    assert mount == ["$PWD", args[args.index("-w") + 1]] and args[-1] == "train"


@pytest.mark.slow
def test_the_image_builds_and_trains_like_the_host(tmp_path):
    """podman builds the Dockerfile on a debootstrap stand-in for the NGC base (no registry here);
    a tiny run inside the container, started as the README says, leaves its run directory on the host
    and ends at the host's loss, bit for bit (same CPU torch)."""
    need(bool(shutil.which("podman") and shutil.which("debootstrap")), NO_PODMAN)
    env = os.environ | {"CONTAINERS_CONF": str(ROOT / "docker" / "containers.conf")}
    tag = "localhost/prores:test"
    build = subprocess.run(["bash", str(ROOT / "docker" / "standin-build.sh"), tag], capture_output=True,
                           text=True, env=env, timeout=1800)
    assert build.returncode == 0, build.stderr[-3000:]
    help_text = subprocess.run(["podman", "run", "--rm", tag, "train", "--help"], capture_output=True, text=True,
                               env=env, timeout=300)
    assert help_text.returncode == 0 and "--no-resume" in help_text.stdout
    args = ["--set", "model.num_layers=2", "--set", "model.seq_length=32", "--set", "train.micro_batch_size=4",
            "--set", "train.steps=4", "--set", "data.eval_samples=4", "--set", "kernels.backend=eager"]
    image_dir, host_dir = tmp_path / "image", tmp_path / "host"
    image_dir.mkdir()
    host_dir.mkdir()
    run = readme_docker_run()  # docker run FLAGS... IMAGE train
    gpus = run.index("--gpus")  # no GPU here
    flags = [f.replace("$PWD", str(image_dir)) for f in run[2:gpus] + run[gpus + 2:-2]]
    inside = subprocess.run(["podman", "run", "--rm", *flags, tag, "train", *args], capture_output=True, text=True,
                            env=env, timeout=600)
    assert inside.returncode == 0, inside.stderr[-3000:]
    host = run_cli("train", *args, cwd=host_dir)
    assert host.returncode == 0, host.stderr[-3000:]
    def summaries(d):
        return [p.relative_to(d) for p in d.glob("runs/*/summary.json")]

    assert summaries(image_dir) == summaries(host_dir) and len(summaries(host_dir)) == 1  # on the host, same name
    losses = [json.loads((d / summaries(d)[0]).read_text())["final_valid_loss"] for d in (image_dir, host_dir)]
    assert losses[0] == losses[1]


def test_the_files_the_dockerfile_cites_exist():
    cited = re.findall(r"\b(?:tests|docker|slurm|prores)/[\w/.-]+\.(?:py|sh)\b", (ROOT / "Dockerfile").read_text())
    assert cited and [c for c in cited if not (ROOT / c).is_file()] == []


def test_the_containers_train_is_one_process_a_gpu(tmp_path):
    """On one node the entrypoint starts `prores train` under torchrun, one rank a visible GPU (GPUS_PER_NODE
    stands in for two GPUs here: gloo ranks on the CPU): the checkpoint is cut by two data-parallel ranks."""
    run_dir = tmp_path / "run"
    args = ["train", "--run-dir", str(run_dir)]
    for o in ("model.num_layers=2", "model.hidden_size=32", "model.ffn_hidden_size=64", "model.num_heads=2",
              "model.seq_length=32", "train.micro_batch_size=2", "train.steps=2", "train.eval_interval=2",
              "data.eval_samples=4", "kernels.backend=eager", "logging.progress_bar=false"):
        args += ["--set", o]
    proc = subprocess.run(["bash", str(ROOT / "docker" / "entrypoint.sh"), *args], capture_output=True, text=True,
                          env=child_env(GPUS_PER_NODE="2"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads(next((run_dir / "checkpoints").glob("global_step*/manifest.json")).read_text())
    assert manifest["parallel"]["dp"] == 2, manifest["parallel"]
