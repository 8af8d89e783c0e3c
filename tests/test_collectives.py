"""Every tensor prores hands to a collective lives on the run's device. NCCL, a GPU run's backend, has no CPU
path (``No backend type associated with device type cpu``); gloo takes any tensor, so a CPU run cannot see a
tensor built on the default device instead of the run's. Here the default device is ``meta`` while the run's is
the CPU: a tensor built without its device lands on meta and has no value to read back."""

import math

import torch

from prores.parallel.grad_norm import count_parameters, global_grad_norm, grouped_sq_norms
from prores.run.signals import highest_on_any_rank


def test_collectives_take_the_runs_device_not_the_default(world_of_one):
    from megatron.core import parallel_state

    group = parallel_state.get_model_parallel_group()
    assert world_of_one.device == torch.device("cpu")
    params = [torch.nn.Parameter(torch.ones(3, 5)), torch.nn.Parameter(torch.tensor(2.0))]  # odd width, a scalar
    for p in params:
        p.grad = torch.full_like(p, 3.0)
    with torch.device("meta"):
        assert count_parameters(params, 0, group) == 16
        assert math.isclose(float(global_grad_norm(params, 0, group)), math.sqrt(16 * 9.0), rel_tol=1e-7)
        sq = grouped_sq_norms([params[:1], params[1:]], lambda p: p.detach(), 0, [group], world_of_one.device)
        assert sq.tolist() == [15.0, 4.0]
        assert highest_on_any_rank(3, world_of_one.device) == 3
