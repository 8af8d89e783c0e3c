import os
import shutil
import subprocess
import sys
import warnings

import pytest

from prores.parallel.rendezvous import free_port

pytest_plugins = ["suite_time"]  # seconds per file and worker, after --durations

warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")

# Triton kernels run on CPU tensors through the interpreter; must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

def child_env(**extra) -> dict:
    """The environment of a child process: the in-process world_of_one fixture set rendezvous variables,
    and a child must pick its own."""
    from prores.parallel.rendezvous import own_world

    env = own_world(os.environ)
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), **extra)
    return env


# A launcher's rendezvous port, drawn when it launches (cli_command): drawn at import, minutes before the
# launch, another run may have taken it by then.
PORT = "{port}"


def torchrun(n: int) -> list[str]:
    return ["torchrun", "--standalone", f"--nproc_per_node={n}", "-m", "prores"]


def deepspeed_launcher(n: int) -> list[str]:
    return ["deepspeed", f"--num_gpus={n}", f"--master_port={PORT}", "--module", "prores"]


def srun(n: int, nodes: int = 1) -> list[str]:
    return ["srun", f"--nodes={nodes}", f"--ntasks={n}", "--overcommit", "--kill-on-bad-exit=1",
            sys.executable, "-m", "prores"]


def slurm_available() -> bool:
    """A Slurm controller answers (`bash scripts/test.sh` starts one as root)."""
    if not shutil.which("srun"):
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


NO_SLURM = ("no Slurm cluster answers: `bash scripts/test.sh` run as root starts a local one"
            " (slurm/local-cluster.sh)")
NO_PODMAN = ("podman or debootstrap is not installed: `bash scripts/test.sh` run as root installs them"
             " (apt-get install podman buildah runc debootstrap)")


def need(available: bool, reason: str) -> None:
    """Skip a test whose service is missing, with its reason; with PRORES_REQUIRE_SERVICES=1
    (CI) a missing service fails the test instead."""
    if available:
        return
    if os.environ.get("PRORES_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (PRORES_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


def train_args(run_dir, overrides) -> list[str]:
    """`train --run-dir RUN_DIR --set KEY=VALUE ...`"""
    args = ["train", "--run-dir", str(run_dir)]
    for o in overrides:
        args += ["--set", o]
    return args


def cli_command(*args, launcher=None) -> list[str]:
    """`prores ARGS`: the installed console script, or `-m prores` under a launcher."""
    prefix = launcher or [shutil.which("prores")]
    assert prefix[0], "the `prores` console script is not installed"
    if any(PORT in a for a in prefix):
        port = str(free_port())
        prefix = [a.replace(PORT, port) for a in prefix]
    return [*prefix, *args]


def run_cli(*args, launcher=None, timeout=900, cwd=None, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command(*args, launcher=launcher), capture_output=True, text=True, timeout=timeout,
                          env=child_env(**extra_env), cwd=cwd)


@pytest.fixture(scope="session")
def world_of_one():
    """torch.distributed + Megatron parallel_state for one process, as `prores train` sets them up."""
    from prores.parallel import topology

    return topology.init(tp=1, pp=1)


@pytest.fixture
def small_tmpfs(tmp_path):
    """``mount(size, inodes)``: a tmpfs of its own under ``tmp_path``, to fill up for real (ENOSPC); needs root."""
    mounted = []

    def mount(size: str = "1m", inodes: int = 64):
        need(os.geteuid() == 0 and shutil.which("mount") is not None, "mounting a tmpfs needs root")
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},nr_inodes={inodes}", "tmpfs", str(where)],
                       check=True)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def t_interval(d: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval ends of per-seed differences, restated with scipy's t (independent of prores's
    table), for the tests that hold the pages' and the claims' intervals."""
    import math
    import statistics

    from scipy import stats

    half = stats.t.ppf(0.975, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    return statistics.fmean(d), statistics.fmean(d) - half, statistics.fmean(d) + half
