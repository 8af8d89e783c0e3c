"""prores's rotary embedding (prores.model.attention.rotate) against Megatron-core's own, bitwise: the same
values forward and backward, in fp32 and bf16, with fewer operations."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

from prores.model.attention import rope_tables, rotate

S, B, HEADS, D = 7, 3, 2, 10  # odd sizes; a head of 10: halves of 5


def megatron_angles(base=10000.0):
    """The angle table Megatron's RotaryEmbedding builds (fp32, [s, 1, 1, d], halves repeated)."""
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    angles = torch.outer(torch.arange(S, dtype=torch.float64), inv).float()
    return torch.cat([angles, angles], -1)[:, None, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_equals_megatrons_bitwise_forward_and_backward(dtype):
    x = torch.randn(S, B, HEADS, D, generator=torch.Generator().manual_seed(0)).to(dtype)
    g = torch.randn(S, B, HEADS, D, generator=torch.Generator().manual_seed(1)).to(dtype)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = rotate(ours, *rope_tables(S, D, 10000.0, dtype, torch.device("cpu")))
    ref = _apply_rotary_pos_emb_bshd(theirs, megatron_angles())
    (y * g).sum().backward()
    (ref * g).sum().backward()
    assert y.dtype == ref.dtype == dtype
    assert torch.equal(y, ref)
    assert torch.equal(ours.grad, theirs.grad)


def test_rotary_takes_no_trig_and_no_concatenation_per_call():
    """Megatron's takes cos and sin of the angles and concatenates twice on every call; ours only flips."""
    x = torch.randn(S, B, HEADS, D)
    tables = rope_tables(S, D, 10000.0, x.dtype, x.device)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        rotate(x, *tables)
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::cat", "aten::cos", "aten::sin"}, ops
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _apply_rotary_pos_emb_bshd(x, megatron_angles())
    assert {"aten::cat", "aten::cos", "aten::sin"} <= {e.key for e in prof.key_averages()}
