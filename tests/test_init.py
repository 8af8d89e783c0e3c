"""Init schemes: per-parameter std from the paper's formulas; TP shards cut like Megatron's."""

import math
from types import SimpleNamespace

import pytest
import torch

from prores.config import ModelConfig
from prores.model.block import Block
from prores.model.sharding import shard, unshard
from prores.model.prores import ProRes

L, H = 8, 128


def block_weights(scheme, layer, layout="pre"):
    cfg = ModelConfig(num_layers=L, hidden_size=H, ffn_hidden_size=256, num_heads=4, seq_length=8,
                      norm_layout=layout, init=scheme)
    block = Block(cfg, ProRes("linear", 10, L), layer=layer, seed=3)
    return {n: p.detach() for n, p in block.named_parameters()}


def expected_std(scheme, name, layer):
    """The paper's rules, restated independently of prores.model.init."""
    std = 0.02
    out_proj = name in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
    if scheme == "scaled" and out_proj:
        return std / math.sqrt(2 * L)
    if scheme == "ds-init" and out_proj:
        return std / math.sqrt(2 * layer)
    if scheme == "deepnorm" and (out_proj or name == "mlp.linear_fc1.weight"):
        return std * (8 * L) ** -0.25
    return std


@pytest.mark.parametrize("scheme", ["normal", "scaled", "ds-init", "deepnorm"])
@pytest.mark.parametrize("layer", [1, 5])
def test_matrix_std_follows_scheme(world_of_one, scheme, layer):
    W = block_weights(scheme, layer, layout="deepnorm" if scheme == "deepnorm" else "pre")
    for name in ("self_attention.linear_proj.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"):
        assert W[name].std().item() == pytest.approx(expected_std(scheme, name, layer), rel=0.05), name
    qkv = W["self_attention.linear_qkv.weight"].view(4, 3, H // 4, H)  # [head, (q, k, v), d, h]
    v_gain = (8 * L) ** -0.25 if scheme == "deepnorm" else 1.0
    assert qkv[:, 0].std().item() == pytest.approx(0.02, rel=0.05)
    assert qkv[:, 1].std().item() == pytest.approx(0.02, rel=0.05)
    assert qkv[:, 2].std().item() == pytest.approx(0.02 * v_gain, rel=0.05)
    assert torch.equal(W["norm1.weight"], torch.ones(H))


def test_shard_matches_megatron_partitions():
    full = torch.arange(8 * 3).view(8, 3)
    # stride 1 (e.g. QKV rows, or columns of a row-parallel weight): contiguous blocks
    p = SimpleNamespace(tensor_model_parallel=True, partition_dim=0, partition_stride=1, shape=(4, 3))
    assert torch.equal(shard(full, p, 1, 2), full[4:])
    row = torch.arange(24).view(1, 24)
    p_col = SimpleNamespace(tensor_model_parallel=True, partition_dim=1, partition_stride=1, shape=(1, 8))
    assert torch.equal(shard(row, p_col, 2, 3), row[:, 16:])
    # stride 2 (SwiGLU fc1 = [gate; up]): rank r holds [gate_r; up_r]
    p2 = SimpleNamespace(tensor_model_parallel=True, partition_dim=0, partition_stride=2, shape=(4, 3))
    gate, up = full[:4], full[4:]
    assert torch.equal(shard(full, p2, 0, 2), torch.cat([gate[:2], up[:2]]))
    assert torch.equal(shard(full, p2, 1, 2), torch.cat([gate[2:], up[2:]]))
    # unshard is the inverse for every stride
    for param, tp in ((p, 2), (p2, 2)):
        assert torch.equal(unshard([shard(full, param, r, tp) for r in range(tp)], param), full)
    assert torch.equal(unshard([shard(row, p_col, r, 3) for r in range(3)], p_col), row)
    # replicated parameters are not cut
    assert shard(full, SimpleNamespace(shape=(8, 3)), 1, 2) is full
