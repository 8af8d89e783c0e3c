"""Pure pieces of the parallel layout: srun rendezvous variables, stage boundaries, divisibility."""

import socket
from pathlib import Path

import pytest

from prores.parallel.pipeline import stage_bounds
from prores.parallel.plan import uniform_blocks
from prores.parallel.rendezvous import (TopologyError, check_divisible, free_port, launched_alone,
                                       slurm_rendezvous)

SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456",
         "SLURM_JOB_NODELIST": "gpu[07-08]"}


def test_srun_task_becomes_a_torch_distributed_rank():
    asked = []

    def hostnames(nodelist):
        asked.append(nodelist)
        return ["gpu07", "gpu08"]

    env = slurm_rendezvous(SLURM, hostnames)
    assert env == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07",
                   "MASTER_PORT": str(20000 + 123456 % 20000)}
    assert asked == ["gpu[07-08]"]


def test_srun_respects_explicit_master():
    env = slurm_rendezvous({**SLURM, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"},
                           lambda nodes: pytest.fail("must not expand the node list"))
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "6000")


@pytest.mark.parametrize("blocks,stages,expected", [(6, 2, [3, 3]), (5, 2, [3, 2]), (7, 3, [3, 2, 2]),
                                                     (4, 4, [1, 1, 1, 1])])
def test_uniform_blocks(blocks, stages, expected):
    assert uniform_blocks(blocks, stages) == expected


def test_stage_bounds_put_embedding_first_and_head_last():
    #          emb    b1    b2    b3    b4    b5    norm   head
    is_block = [False, True, True, True, True, True, False, False]
    assert stage_bounds(is_block, [2, 3]) == [0, 3, 8]  # stage 0: emb b1 b2; stage 1: b3 b4 b5 norm head
    assert stage_bounds(is_block, [1, 1, 3]) == [0, 2, 3, 8]
    assert stage_bounds(is_block, [5]) == [0, 8]
    with pytest.raises(ValueError):
        stage_bounds(is_block, [2, 2])


def test_world_size_must_divide():
    assert check_divisible(8, 2, 2) == 2
    with pytest.raises(TopologyError, match="world size 6 is not divisible by parallel.tp × parallel.pp = 2 × 2"):
        check_divisible(6, 2, 2)


def test_a_drawn_port_is_free_and_no_outgoing_connection_can_get_it():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low <= 11000:
        pytest.skip(f"this machine's ephemeral range starts at {low}: free_port takes the kernel's port")
    ports = [free_port() for _ in range(20)]
    assert all(10000 <= p < low for p in ports) and len(set(ports)) > 1  # drawn, not one fixed port
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))


@pytest.mark.parametrize("env,alone", [({}, True), ({"WORLD_SIZE": "1", "RANK": "0"}, True),
                                       ({"WORLD_SIZE": "4", "RANK": "0"}, False), ({"SLURM_NTASKS": "2"}, False),
                                       ({"SLURM_NTASKS": "1"}, True)])
def test_a_process_knows_whether_a_launcher_started_others_with_it(env, alone):
    assert launched_alone(env) is alone


@pytest.mark.parametrize("local_rank,visible,index", [(0, 1, 0), (3, 1, 0), (3, 8, 3), (0, 8, 0), (7, 8, 7)])
def test_a_rank_drives_its_own_gpu_whether_it_sees_one_or_the_nodes(local_rank, visible, index):
    """Slurm's --gpus-per-task=1 shows each task one GPU (index 0 whatever its local rank); torchrun, or srun
    showing all of a node's GPUs, leaves the rank to take the one at its local rank."""
    from prores.parallel.topology import cuda_index

    assert cuda_index(local_rank, visible) == index


def test_a_rank_without_a_gpu_of_its_own_is_told_how_to_launch():
    from prores.parallel.topology import cuda_index

    with pytest.raises(TopologyError, match=r"local rank 4 sees 4 GPUs.*--gpus-per-task=1"):
        cuda_index(4, 4)
