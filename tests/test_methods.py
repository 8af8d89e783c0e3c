"""The baseline zoo's residual methods against plain-PyTorch float64 references written here from each paper's
definition: LayerScale, ReZero, Admin, Mix-LN, Peri-LN, HybridNorm, DyT and depth-µP, forward and backward,
with ProRes's alpha on top."""

import json
import math
import subprocess
import sys

import pytest
import torch

from prores.config import ModelConfig, load_config
from prores.launcher.builders import param_groups
from prores.model.block import Block
from prores.model.gpt import Embedding, EmbeddingNorm, gpt_pieces
from prores.model.layouts import LAYOUTS
from prores.model.prores import ProRes
from prores.model.size import block_parameters, embedding_parameters, head_parameters
from conftest import child_env
from test_layouts import B, LAYER, L, S, ref_attention, ref_mlp, ref_norm, rotate

H, HEADS = 32, 4
# The block is float64 but its RoPE angles are fp32 (rope_table keeps them so in every dtype) where the
# reference's are float64: a relative 2^-24 in the angles shows as ~1e-7 in outputs and gradients.
TAU = 1e-6


def make(layout, norm="rmsnorm", layer=LAYER, schedule="linear", **kw):
    cfg = ModelConfig(num_layers=L, hidden_size=H, ffn_hidden_size=40, num_heads=HEADS, seq_length=S,
                      norm_layout=layout, norm=norm, **kw)
    block = Block(cfg, ProRes(schedule, 5, L), layer=layer, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-trivial gains and affines, so a misplaced one cannot hide
        for name, p in block.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return block.double()


def dyt(x, W, name):
    return W[f"{name}.weight"] * torch.tanh(W[f"{name}.alpha"] * x)


def N(W, name, v, kind):
    return dyt(v, W, name) if kind == "dyt" else ref_norm(v, W[f"{name}.weight"], W.get(f"{name}.bias"), kind)


def qkv_normed_attention(y, W, kind):
    """HybridNorm's attention (OLMo2's q_norm/k_norm, its v_norm alike): Q, K, V each normed over the whole
    projection, all heads at once (one affine of width h), then split into heads; Q and K before the rotary
    embedding."""
    s, b, h = y.shape
    d = h // HEADS
    qkv = (y @ W["self_attention.linear_qkv.weight"].T).view(s, b, HEADS, 3, d)  # Megatron's rows: [head, qkv, d]

    def normed(i, name):
        return N(W, name, qkv[..., i, :].reshape(s, b, h), kind).view(s, b, HEADS, d)
    q = rotate(normed(0, "self_attention.q_layernorm"))
    k = rotate(normed(1, "self_attention.k_layernorm"))
    v = normed(2, "self_attention.core_attention.v_norm")
    scores = torch.einsum("sbnd,tbnd->bnst", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bnst,tbnd->sbnd", scores.softmax(-1), v).reshape(s, b, h)
    return out @ W["self_attention.linear_proj.weight"].T


def reference(layout, kind, x, W, a, layer=LAYER, mixln_ratio=0.25):
    attn, mlp = (lambda y: ref_attention(y, W)), (lambda y: ref_mlp(y, W))
    if layout == "mixln":
        layout = "post" if layer <= math.floor(mixln_ratio * L) else "pre"
    if layout == "pre":
        h = x + a * attn(N(W, "norm1", x, kind))
        return h + a * mlp(N(W, "norm2", h, kind))
    if layout == "post":
        h = N(W, "norm1", x + a * attn(x), kind)
        return N(W, "norm2", h + a * mlp(h), kind)
    if layout == "layerscale":  # CaiT: x + λ1⊙F(Norm x), a λ per branch
        h = x + a * W["gain_attn"] * attn(N(W, "norm1", x, kind))
        return h + a * W["gain_mlp"] * mlp(N(W, "norm2", h, kind))
    if layout == "rezero":  # one scalar for both branches, no norm
        h = x + a * W["gain_both"] * attn(x)
        return h + a * W["gain_both"] * mlp(h)
    if layout == "admin":  # Norm(ω⊙x + F(x)), an ω per sublayer
        h = N(W, "norm1", W["gain_attn_skip"] * x + a * attn(x), kind)
        return N(W, "norm2", W["gain_mlp_skip"] * h + a * mlp(h), kind)
    if layout == "periln":  # the block is sandwich's
        h = x + a * N(W, "norm1_post", attn(N(W, "norm1", x, kind)), kind)
        return h + a * N(W, "norm2_post", mlp(N(W, "norm2", h, kind)), kind)
    assert layout == "hybridnorm"
    h = x + a * qkv_normed_attention(x, W, kind)
    y = N(W, "norm2", h, kind)
    return y + a * mlp(y)


CASES = [("layerscale", "rmsnorm"), ("rezero", "rmsnorm"), ("admin", "layernorm"), ("periln", "rmsnorm"),
         ("hybridnorm", "rmsnorm"), ("hybridnorm", "layernorm"), ("hybridnorm", "dyt"), ("pre", "dyt"), ("post", "dyt"),
         ("layerscale", "dyt")]


def check(block, ref_fn, alpha=0.3):
    block.alpha = torch.tensor(alpha, dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    x = (3.0 * torch.randn(S, B, H, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    probe = torch.randn(S, B, H, generator=gen, dtype=torch.float64)
    out = block(x)
    (out * probe).sum().backward()
    got = {"out": out.detach(), "x": x.grad.clone(), **{n: p.grad.clone() for n, p in block.named_parameters()}}
    x64 = x.detach().clone().requires_grad_()
    W = {n: p.detach().clone().requires_grad_() for n, p in block.named_parameters()}
    ref = ref_fn(x64, W, float(block.alpha))  # the fp32 alpha the block multiplies by
    (ref * probe).sum().backward()
    want = {"out": ref.detach(), "x": x64.grad, **{n: w.grad for n, w in W.items()}}
    assert got.keys() == want.keys()
    for name in want:
        err = (got[name] - want[name]).abs().max().item()
        assert err <= TAU * want[name].abs().max().item(), f"{name}: max err {err:.3e}"


@pytest.mark.parametrize("layout,norm", CASES)
def test_method_matches_its_paper(world_of_one, layout, norm):
    check(make(layout, norm), lambda x, W, a: reference(layout, norm, x, W, a))


@pytest.mark.parametrize("layer", [1, LAYER])  # ⌊0.25·6⌋ = 1: block 1 is Post-LN, block 3 Pre-LN
def test_mixln_is_post_ln_first_and_pre_ln_after(world_of_one, layer):
    check(make("mixln", layer=layer), lambda x, W, a: reference("mixln", "rmsnorm", x, W, a, layer=layer))


def test_the_gains_start_at_their_papers_values(world_of_one):
    def gains(layout, **kw):
        cfg = ModelConfig(num_layers=L, hidden_size=H, ffn_hidden_size=40, num_heads=HEADS, norm_layout=layout, **kw)
        return {n: p.detach() for n, p in Block(cfg, ProRes("none", 5, L), LAYER, 0).named_parameters() if "gain" in n}
    tenth = torch.tensor(0.1, dtype=torch.float32).item()  # CaiT's 0.1 up to 18 blocks, as an fp32 parameter
    assert {n: g.tolist() for n, g in gains("layerscale").items()} == {"gain_attn": [tenth] * H, "gain_mlp": [tenth] * H}
    deep = ModelConfig(num_layers=48, hidden_size=H, ffn_hidden_size=40, num_heads=HEADS, norm_layout="layerscale")
    assert Block(deep, ProRes("none", 5, 48), 1, 0).gain_attn[0].item() == pytest.approx(1e-6)  # CaiT, deeper than 24
    assert gains("layerscale", layerscale_init=1e-4)["gain_mlp"][0].item() == pytest.approx(1e-4)
    assert gains("rezero")["gain_both"].tolist() == [0.0]
    omega = math.sqrt((2 * L + 1) / math.log(2 * L + 1) - 1)  # admin-torch's calculate_init(2L), O(log n)
    assert gains("admin")["gain_attn_skip"][0].item() == pytest.approx(omega)
    dyt_block = Block(ModelConfig(num_layers=L, hidden_size=H, ffn_hidden_size=40, num_heads=HEADS, norm="dyt",
                                  dyt_init=0.7), ProRes("none", 5, L), LAYER, 0)
    assert dyt_block.norm1.alpha.item() == pytest.approx(0.7) and dyt_block.norm1.bias is None


def test_dyt_scales_the_embedding_by_a_learnable_sqrt_h(world_of_one):
    """The DyT paper's LLaMA runs: no norm sets the logits' scale, the embedding's output is times √h."""
    m = load_config(None, ("model.num_layers=2", "model.hidden_size=36", "model.ffn_hidden_size=40",
                           "model.num_heads=2", "model.norm=dyt")).model
    embedding = Embedding(m, 258, 0)
    assert embedding.scale.requires_grad and embedding.scale.item() == pytest.approx(6.0)
    tokens = torch.randint(0, 256, (2, 8))
    want = embedding.word_embeddings.weight[tokens].transpose(0, 1) * 6.0
    torch.testing.assert_close(embedding(tokens), want)


def test_rezero_at_zero_ignores_alpha(world_of_one):
    """x + a·s·F(x) with s = 0: the identity for every alpha, which therefore changes nothing until s moves."""
    cfg = ModelConfig(num_layers=L, hidden_size=H, ffn_hidden_size=40, num_heads=HEADS, norm_layout="rezero")
    block = Block(cfg, ProRes("linear", 5, L), LAYER, 0)
    x = torch.randn(S, B, H)
    for alpha in (0.0, 0.3, 1.0):
        block.alpha = torch.tensor(alpha)
        assert torch.equal(block(x), x)


def test_periln_norms_the_embedding_output(world_of_one):
    cfg = load_config(None, ("model.num_layers=2", "model.hidden_size=32", "model.ffn_hidden_size=40",
                             "model.norm_layout=periln"))
    specs = gpt_pieces(cfg.model, ProRes("linear", 5, 2), 258, 0)
    assert [s.cls.__name__ for s in specs] == ["Embedding", "EmbeddingNorm", "Block", "Block", "FinalNorm", "Head"]
    pieces = [s.cls(**s.kwargs) for s in specs]
    tokens = torch.randint(0, 256, (2, 8))
    h = pieces[0](tokens)
    n = pieces[1].norm
    torch.testing.assert_close(pieces[1](h), ref_norm(h.double(), n.weight.double(), None, "rmsnorm").float())
    assert isinstance(pieces[1], EmbeddingNorm)


def test_depth_mup_multiplies_alpha_and_rescales_the_blocks_optimizer(world_of_one):
    """(L/L_base)^(−α) on every branch, times ProRes's alpha; the blocks' learning rate × (L/L_base)^(α−1) and
    AdamW eps × (L/L_base)^(−α); embedding, final norm and head at the base values."""
    cfg = load_config(None, ("model.num_layers=8", "model.hidden_size=32", "model.ffn_hidden_size=40",
                             "model.depth_mup_alpha=0.5", "model.depth_mup_base=2", "optim.lr=0.01", "optim.eps=1e-8"))
    specs = gpt_pieces(cfg.model, ProRes("linear", 5, 8), 258, 0)
    pieces = [s.cls(**s.kwargs) for s in specs]
    block = pieces[3]
    block.set_step(4)
    assert float(block.alpha) == pytest.approx(4 / (5 * 3) * (8 / 2) ** -0.5)
    block.set_step(10**6)  # ProRes saturated, the multiplier stays
    assert float(block.alpha) == pytest.approx(0.5)
    groups = param_groups(torch.nn.ModuleList(pieces), cfg.optim)
    blocks = {id(p) for b in pieces[1:9] for p in b.parameters()}
    for g in groups:
        in_blocks = {id(p) in blocks for p in g["params"]}
        assert len(in_blocks) == 1
        if in_blocks == {True}:
            assert (g["lr"], g["eps"]) == (pytest.approx(0.01 * 4 ** -0.5), pytest.approx(1e-8 * 4 ** -0.5))
        else:
            assert (g["lr"], g["eps"]) == (0.01, 1e-8)
    assert sum(len(g["params"]) for g in groups) == sum(1 for m in pieces for _ in m.parameters())


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm", "dyt"])
def test_the_planner_counts_every_methods_parameters(world_of_one, layout, norm):
    overrides = ("model.num_layers=4", "model.hidden_size=32", "model.ffn_hidden_size=40",
                 f"model.norm_layout={layout}", f"model.norm={norm}",
                 f"model.init={'deepnorm' if layout == 'deepnorm' else 'normal'}")
    m = load_config(None, overrides).model
    specs = gpt_pieces(m, ProRes("linear", 5, 4), 258, 0)
    count = {s.cls.__name__: sum(p.numel() for p in s.cls(**s.kwargs).parameters()) for s in specs}
    assert block_parameters(m) == count["Block"]
    assert embedding_parameters(m, 258) == count["Embedding"] + count.get("EmbeddingNorm", 0)
    assert head_parameters(m, 258) == count["Head"] + count.get("FinalNorm", 0)


TRAIN_EACH = """if True:
    import json, sys
    from pathlib import Path
    from prores.config import load_config
    from prores.launcher.train import train
    from prores.monitor.tensorboard import read_scalars
    small = ["model.num_layers=12", "model.hidden_size=32", "model.ffn_hidden_size=88", "model.num_heads=2",
             "model.seq_length=32", "train.micro_batch_size=8", "train.steps=20", "train.log_interval=1",
             "train.eval_interval=20", "data.eval_samples=16", "optim.warmup_steps=2", "prores.T=0.5",
             "kernels.backend=eager", "logging.progress_bar=false", "checkpoint.interval=0"]
    losses = {}
    for i, method in enumerate(json.loads(sys.argv[1])):
        train(load_config(None, tuple(small + method)), Path(sys.argv[2]) / str(i))
        losses[" ".join(method)] = read_scalars(Path(sys.argv[2]) / str(i), lambda k: k == "train/loss")["train/loss"]
    print(json.dumps(losses))
"""


def test_every_method_trains_20_steps_at_12_blocks_and_its_loss_drops(tmp_path):
    """Each method at its defaults, with ProRes, in one fresh interpreter. "Drops": the last five steps'
    mean is a tenth of a nat under the first step's loss (every method starts at about ln 258 = 5.55,
    and a model that does not learn stays within a few hundredths of it over 20 steps)."""
    methods = [[f"model.norm_layout={name}"] + (["model.init=deepnorm"] if name == "deepnorm" else [])
               for name in LAYOUTS] + [["model.norm=dyt"], ["model.depth_mup_alpha=1"]]
    proc = subprocess.run([sys.executable, "-c", TRAIN_EACH, json.dumps(methods), str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = json.loads(proc.stdout.splitlines()[-1])
    assert len(losses) == len(methods)
    for method, loss in losses.items():
        last = sum(loss[str(step)] for step in range(15, 20)) / 5
        assert last < loss["0"] - 0.1, (method, loss["0"], last)
