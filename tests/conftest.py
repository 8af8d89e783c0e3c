import os
import shutil
import subprocess
import warnings

import pytest

warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")

# Set by the in-process world_of_one fixture; a child process must pick its own.
RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_VARS}
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), **extra)
    return env


def run_cli(*args, launcher=(), timeout=900, **extra_env) -> subprocess.CompletedProcess:
    """Run the installed `prores` console script, optionally under a launcher such as torchrun."""
    exe = shutil.which("prores")
    assert exe, "the `prores` console script is not installed"
    return subprocess.run([*launcher, exe, *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(**extra_env))


@pytest.fixture(scope="session")
def world_of_one():
    """torch.distributed + Megatron parallel_state for one process, as `prores train` sets them up."""
    from prores.parallel import topology

    return topology.init(tp=1, pp=1)
