"""Pure pieces of the parallel layout: srun rendezvous variables, stage boundaries, divisibility."""

import pytest

from prores.parallel.pipeline import stage_bounds
from prores.parallel.plan import uniform_blocks
from prores.parallel.rendezvous import TopologyError, check_divisible, slurm_rendezvous

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
