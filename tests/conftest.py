import os
import warnings

import pytest

warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")


@pytest.fixture(scope="session")
def world_of_one():
    """torch.distributed + Megatron parallel_state for one process, as `prores train` sets them up."""
    from prores.parallel import topology

    return topology.init(tp=1, pp=1)
