"""Every tensor prores hands to a collective lives on the run's device. NCCL, a GPU run's backend, has no CPU
path (``No backend type associated with device type cpu``); gloo takes any tensor, so a CPU run cannot see a
tensor built on the default device instead of the run's. Here the default device is ``meta`` while the run's is
the CPU: a tensor built without its device lands on meta and has no value to read back."""

import math

import pytest
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
        assert sq.tolist() == pytest.approx([15.0, 4.0], rel=4 * 2.0 ** -24)  # a norm, then its square: ~3 roundings
        assert highest_on_any_rank(3, world_of_one.device) == 3


def test_grouped_norms_of_a_long_tensor_keep_fp32_sums_rounding(world_of_one):
    """A CPU's norm kernel sums in fp32 without a cascade: at 1M elements its squared norm errs by ~2e-5. The grouped
    norms cut long tensors into chunks; their error stays near a cascade sum's (torch's ``square().sum()`` errs by
    3e-8 here), well inside 1e-6, which the norm in one piece misses."""
    from megatron.core import parallel_state

    gen = torch.Generator().manual_seed(0)
    long, odd = torch.randn(1 << 20, generator=gen), torch.randn(7, 5, generator=gen)
    sq = grouped_sq_norms([[long, odd], [torch.tensor(3.0)]], lambda t: t, 0,
                          [parallel_state.get_model_parallel_group()], world_of_one.device)
    exact = [float(long.double().square().sum() + odd.double().square().sum()), 9.0]
    assert sq.tolist() == pytest.approx(exact, rel=1e-6, abs=0)
