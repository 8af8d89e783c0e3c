"""Every norm layout × norm against an independent float64 formula written here with plain torch ops."""

import math
import random

import pytest
import torch
import torch.nn.functional as F

from prores.config import ModelConfig
from prores.model.block import Block
from prores.model.layouts import LAYOUTS
from prores.model.prores import ProRes

L, LAYER, S, B = 6, 3, 7, 2


def model_cfg(layout, norm, **kw):
    return ModelConfig(num_layers=L, hidden_size=32, ffn_hidden_size=40, num_heads=4, seq_length=S,
                       norm_layout=layout, norm=norm, init="deepnorm" if layout == "deepnorm" else "normal",
                       **kw)


def make_block(layout, norm, schedule="linear", layer=LAYER, seed=0, backend="eager", dtype=torch.float64, **kw):
    block = Block(model_cfg(layout, norm, **kw), ProRes(schedule, 5, L), layer=layer, seed=seed, backend=backend)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-trivial norm affines, so a misplaced norm cannot hide
        for name, p in block.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return block.to(dtype)


# ------------------------------------------------------------------ the reference


def ref_norm(x, w, b, kind, eps=1e-5):
    if kind == "rmsnorm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rotate(x, base=10000.0):
    """Rotary embedding, half-split convention: pair feature i with i + d/2."""
    s, d = x.shape[0], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None, None], torch.cat([ang.sin()] * 2, -1)[:, None, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def ref_attention(y, W, heads=4):
    s, b, h = y.shape
    d = h // heads
    qkv = (y @ W["self_attention.linear_qkv.weight"].T).view(s, b, heads, 3, d)
    q, k, v = rotate(qkv[..., 0, :]), rotate(qkv[..., 1, :]), qkv[..., 2, :]
    scores = torch.einsum("sbnd,tbnd->bnst", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bnst,tbnd->sbnd", scores.softmax(-1), v).reshape(s, b, h)
    return out @ W["self_attention.linear_proj.weight"].T


def ref_mlp(y, W):
    gate, up = (y @ W["mlp.linear_fc1.weight"].T).chunk(2, -1)
    return (F.silu(gate) * up) @ W["mlp.linear_fc2.weight"].T


def ref_block(layout, kind, x, W, a):
    def N(name, v, scale=1.0):
        return ref_norm(v, W[f"{name}.weight"], W.get(f"{name}.bias"), kind) * scale

    attn, mlp = (lambda y: ref_attention(y, W)), (lambda y: ref_mlp(y, W))
    if layout in ("pre", "lns"):
        s = 1 / math.sqrt(LAYER) if layout == "lns" else 1.0
        h = x + a * attn(N("norm1", x, s))
        return h + a * mlp(N("norm2", h, s))
    if layout in ("post", "deepnorm"):
        c = (2 * L) ** 0.25 if layout == "deepnorm" else 1.0
        h = N("norm1", c * x + a * attn(x))
        return N("norm2", c * h + a * mlp(h))
    assert layout == "sandwich"
    h = x + a * N("norm1_post", attn(N("norm1", x)))
    return h + a * N("norm2_post", mlp(N("norm2", h)))


# ------------------------------------------------------------------ tests

# the ProRes paper's layouts; the baseline zoo's methods have their references in test_methods.py
PAPER_LAYOUTS = ("pre", "post", "sandwich", "deepnorm", "lns")
CASES = [(layout, norm) for layout in PAPER_LAYOUTS for norm in ("layernorm", "rmsnorm")]


# Triton computes in fp32 whatever the storage, so it is checked in fp32 (normwise 1e-5).
BACKEND_DTYPE = [("eager", torch.float64), ("compile", torch.float64), ("triton", torch.float32)]


@pytest.mark.parametrize("layout,norm", CASES)
@pytest.mark.parametrize("alpha", [0.3, 1.0])
@pytest.mark.parametrize("backend,dtype", BACKEND_DTYPE, ids=[b for b, _ in BACKEND_DTYPE])
def test_block_matches_reference_forward_and_backward(world_of_one, layout, norm, alpha, backend, dtype):
    block = make_block(layout, norm, backend=backend, dtype=dtype)
    block.alpha = torch.tensor(alpha, dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    # A residual with non-zero mean and several times the branch scale.
    x = (3.0 * torch.randn(S, B, 32, generator=gen, dtype=torch.float64) + 0.5).to(dtype).requires_grad_()
    probe = torch.randn(S, B, 32, generator=gen, dtype=torch.float64).to(dtype)

    out = block(x)
    (out * probe).sum().backward()
    got = {"out": out.detach(), "x": x.grad.clone(), **{n: p.grad.clone() for n, p in block.named_parameters()}}

    x64 = x.detach().double().requires_grad_()
    W = {n: p.detach().double().requires_grad_() for n, p in block.named_parameters()}
    ref = ref_block(layout, norm, x64, W, alpha)
    (ref * probe.double()).sum().backward()
    want = {"out": ref.detach(), "x": x64.grad, **{n: w.grad for n, w in W.items()}}

    assert got.keys() == want.keys()
    tau = 1e-6 if dtype == torch.float64 else 1e-5
    for name in want:
        err = (got[name].double() - want[name]).abs().max().item()
        assert err <= tau * want[name].abs().max().item(), f"{backend} {layout}/{norm} {name}: max err {err:.3e}"


@pytest.mark.parametrize("layout,norm", CASES)
def test_alpha_zero_start(world_of_one, layout, norm):
    """At t = 0: pre/sandwich/lns are exactly the identity; post and deepnorm only normalise."""
    block = make_block(layout, norm)
    block.set_step(0)
    assert float(block.alpha) == 0.0
    x = 2.0 * torch.randn(S, B, 32, dtype=torch.float64) + 1.0
    out = block(x)
    if layout in ("pre", "sandwich", "lns"):
        assert torch.equal(out, x)
    else:
        c = (2 * L) ** 0.25 if layout == "deepnorm" else 1.0
        W = dict(block.named_parameters())
        n1 = ref_norm(c * x, W["norm1.weight"], W.get("norm1.bias"), norm)
        torch.testing.assert_close(out, ref_norm(c * n1, W["norm2.weight"], W.get("norm2.bias"), norm))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_after_warmup_the_block_is_bitwise_the_plain_block(world_of_one, layout):
    # The last layer is the last to saturate (at T·L), so one step earlier its alpha is < 1.
    prores_block = make_block(layout, "rmsnorm", schedule="linear", layer=L)
    plain_block = make_block(layout, "rmsnorm", schedule="none", layer=L)
    x = torch.randn(S, B, 32, dtype=torch.float64)
    warm = 5 * L  # T·L: every layer's alpha has reached 1 and stays there
    prores_block.set_step(warm - 1)
    assert prores_block.alpha is not None and not torch.equal(prores_block(x), plain_block(x))
    prores_block.set_step(warm)
    plain_block.set_step(0)
    assert prores_block.alpha is None and plain_block.alpha is None
    assert torch.equal(prores_block(x), plain_block(x))


def test_alpha_follows_the_global_index(world_of_one):
    """Block l reads alpha(l, t): layers built with different global indices warm up in turn."""
    T = 5
    for layer in (1, 2, 6):
        block = make_block("pre", "rmsnorm", layer=layer)
        for step in (0, 3, 5, 12, 29):
            block.set_step(step)
            assert float(block.alpha) == pytest.approx(min(step / (T * layer), 1.0))


def weights(block):
    return {n: p.detach().clone() for n, p in block.named_parameters()}


def test_seeding_is_layout_invariant(world_of_one):
    """Weights depend on (seed, global layer, name) only, not on build order or global RNG state."""
    cfg = model_cfg("pre", "layernorm")
    prores = ProRes("linear", 5, L)
    in_order = {l: weights(Block(cfg, prores, layer=l, seed=7)) for l in range(1, L + 1)}
    order = list(range(1, L + 1))
    random.Random(0).shuffle(order)
    shuffled = {}
    for l in order:
        torch.manual_seed(1000 + l)
        torch.randn(100)
        shuffled[l] = weights(Block(cfg, prores, layer=l, seed=7))
    for l in in_order:
        assert in_order[l].keys() == shuffled[l].keys()
        for k in in_order[l]:
            assert torch.equal(in_order[l][k], shuffled[l][k]), (l, k)
    a, b = in_order[1]["mlp.linear_fc1.weight"], in_order[2]["mlp.linear_fc1.weight"]
    assert not torch.equal(a, b)  # distinct layers are distinct draws
    other_seed = weights(Block(cfg, prores, layer=1, seed=8))["mlp.linear_fc1.weight"]
    assert not torch.equal(a, other_seed)


@pytest.mark.parametrize("layout", ["pre", "post", "sandwich"])
def test_an_fp32_residual_stream_keeps_what_a_bf16_one_rounds_away(world_of_one, layout):
    """Block 120 of 120 at step 10 of T=500 (alpha 1.7e-4). Its contribution (its output less its output
    at alpha = 0: x, or Norm(Norm(x)) for post), through a float64 stream from the same bf16 branches,
    is the reference; the share of it that arrives through an fp32
    stream is 1 up to fp32 rounding (2^-24 of |x|, against |alpha·F| ~ 1e-5·|x| here), through a bf16
    stream almost nothing: |alpha·F| is below half an ulp of x (2^-9·|x|) for nearly every element."""
    cfg = ModelConfig(num_layers=120, hidden_size=64, ffn_hidden_size=160, num_heads=4, seq_length=S,
                      norm_layout=layout, fp32_residual=True)
    block = Block(cfg, ProRes("linear", 500, 120), layer=120, seed=0).to(torch.bfloat16)
    x = torch.randn(S, B, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)

    def contribution(dtype):
        outs = []
        for step in (10, 0):
            block.set_step(step)
            outs.append(block(x.to(dtype)).double())
        return outs[0] - outs[1]

    with torch.no_grad():
        assert torch.equal(block.attention_branch(x.float()), block.attention_branch(x))  # the same bf16 compute
        assert block(x.float()).dtype == torch.float32
        exact = contribution(torch.float64)
        through = {dtype: contribution(dtype) for dtype in (torch.float32, torch.bfloat16)}
    share = {dtype: ((d * exact).sum() / exact.square().sum()).item() for dtype, d in through.items()}
    assert share[torch.float32] == pytest.approx(1.0, abs=0.01) and share[torch.bfloat16] < 0.1, share
