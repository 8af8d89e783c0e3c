"""optim.implementation: torch's fused AdamW against its foreach AdamW, through prores's builder (groups, clipping
by the global norm), on a model whose tensors include scalars and odd widths."""

import pytest
import torch

from prores.config import load_config
from prores.launcher.builders import build_optimizer
from prores.model.gpt import gpt_pieces
from prores.model.prores import ProRes

STEPS = 3


def trained(implementation: str, precision: str, topo):
    cfg = load_config(None, ("model.num_layers=3", "model.hidden_size=18", "model.ffn_hidden_size=21",
                             "model.num_heads=3", "model.seq_length=8", "model.vocab_multiple=1",
                             "model.norm_layout=layerscale", f"train.precision={precision}",
                             "parallel.zero_stage=0", "optim.lr=1e-2", "optim.clip_grad=0.5",
                             f"optim.implementation={implementation}"))
    torch.manual_seed(0)
    module = torch.nn.ModuleList(p.cls(**p.kwargs) for p in gpt_pieces(cfg.model, ProRes("none", 1, 3), 61, seed=1))
    optimizer = build_optimizer(cfg, module, topo)
    assert optimizer.defaults[implementation] is True
    gen = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        for p in module.parameters():  # the same gradients for both, whatever the weights
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()
    return dict(module.named_parameters()), optimizer


@pytest.mark.parametrize("precision", ["fp32", "bf16"])  # fp32: prores's GlobalNormAdamW; bf16: torch's AdamW
def test_fused_adamw_equals_foreach_within_rounding(precision, world_of_one):
    """Each update is lr·m̂/(√v̂+ε) + lr·λ·p from the same gradients; the two kernels order its ~10 float
    operations differently, each rounded to half an ulp (2^-24 relative in fp32), and |m̂/(√v̂+ε)| ≤ 1/(1-β1)
    at most after a few steps: a parameter can differ by at most about 10·2^-24·(|p| + 10·lr) per step."""
    foreach, a = trained("foreach", precision, world_of_one)
    fused, b = trained("fused", precision, world_of_one)
    lr = 1e-2
    for name, p in foreach.items():
        bound = STEPS * 10 * 2**-24 * (p.detach().abs() + 10 * lr)
        assert ((p - fused[name]).abs() <= bound).all(), name
    assert a.state_dict()["state"].keys() == b.state_dict()["state"].keys()
    for i, s in a.state_dict()["state"].items():
        assert float(s["step"]) == float(b.state_dict()["state"][i]["step"]) == STEPS
        torch.testing.assert_close(s["exp_avg_sq"], b.state_dict()["state"][i]["exp_avg_sq"], rtol=2e-6, atol=0)
