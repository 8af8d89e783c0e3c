"""Residual-add + norm backends against an independent float64 reference, forward and backward.

The reference is computed in float64 from the same low-precision inputs,
upcast. Errors are normwise per tensor: max|k − ref| ≤ τ·max|ref|; what the
add contributes to the stream, h − x, is checked element by element against
alpha·f (a normwise bound on h would let a tiny alpha·f be mis-scaled).
Triton kernels run on CPU under TRITON_INTERPRET=1 (set before triton is
imported, by conftest), on small shapes.
"""

import importlib.util
import os

import pytest
import torch

from prores.errors import UsageError
from prores.model import fused
from prores.model.norm import Norm

TAU = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
L = 12
ALPHAS = [0.0, 1e-3, 1.0, (2 * L) ** 0.25]
HAS_TRITON = importlib.util.find_spec("triton") is not None
NO_TRITON = ("triton is not installed: `bash scripts/test.sh` installs it with the test extras on x86_64"
             " (pip install triton==3.7.1); its kernels then run on CPU under TRITON_INTERPRET=1")
BACKENDS = ["eager", "compile", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON))]
OTHER_BACKENDS = ["compile", "block"] + (["triton"] if HAS_TRITON else [])
# On a GPU machine, `TRITON_INTERPRET=0 pytest tests/test_fused.py` checks the compiled kernels on CUDA.
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def ref_norm(h, w, b, eps, rms):
    if rms:
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w
    else:
        mu = h.mean(-1, keepdim=True)
        y = (h - mu) * torch.rsqrt((h - mu).pow(2).mean(-1, keepdim=True) + eps) * w
    return y if b is None else y + b


def inputs(m, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a residual with non-zero mean and ~5x the branch's scale
    x = (5.0 * torch.randn(m, n, generator=g) + 0.7).to(dtype)
    f = torch.randn(m, n, generator=g).to(dtype)
    w = (1.0 + 0.2 * torch.randn(n, generator=g)).to(dtype)
    b = (0.1 * torch.randn(n, generator=g)).to(dtype)
    dy = torch.randn(m, n, generator=g).to(dtype)
    dh = torch.randn(m, n, generator=g).to(dtype)
    return tuple(t.to(DEVICE) for t in (x, f, w, b, dy, dh))


def assert_normwise(name, got, ref, tau):
    err = (got.double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= tau * scale, f"{name}: max err {err:.3e} > {tau:g}·{scale:.3e}"


def run_add_norm(backend, x, f, alpha, w, b, eps, rms, dy, dh, gain=None):
    """h, y and the gradients of x, f, w, b (and the gain, if given) from a backend's add_norm."""
    leaves = [t.clone().requires_grad_() for t in (x, f, w, b) + (() if gain is None else (gain,))]
    a = torch.tensor(alpha, dtype=torch.float32, device=DEVICE)
    h, y = fused.ops(backend).k.add_norm(*leaves[:2], a, *leaves[2:4], eps, rms,
                                         gain=None if gain is None else leaves[4])
    torch.autograd.backward([h, y], [dh, dy])
    return h, y, [t.grad for t in leaves]


def reference(x, f, alpha, w, b, eps, rms, dy, dh, gain=None):
    """The same in float64, from the definition h = x + alpha·λ⊙f."""
    leaves = [t.double().requires_grad_() for t in (x, f, w, b) + (() if gain is None else (gain,))]
    h = leaves[0] + alpha * (leaves[1] if gain is None else leaves[4] * leaves[1])
    y = ref_norm(h, leaves[2], leaves[3], eps, rms)
    torch.autograd.backward([h, y], [dh.double(), dy.double()])
    return h.detach(), y.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("alpha", ALPHAS, ids=["a0", "a1e-3", "a1", "a2L^.25"])
def test_add_norm_forward_backward(backend, rms, dtype, alpha):
    eps = 1e-5 if alpha < 1 else 1e-6
    x, f, w, b, dy, dh = inputs(100, 1000, dtype)  # 100 rows: not a multiple of any tile
    h, y, grads = run_add_norm(backend, x, f, alpha, w, b, eps, rms, dy, dh)
    rh, ry, rgrads = reference(x, f, alpha, w, b, eps, rms, dy, dh)
    tau = TAU[dtype]
    assert_normwise("h", h, rh, tau)
    assert_normwise("y", y, ry, tau)
    for name, g, r in zip(("dx", "df", "dw", "db"), grads, rgrads):
        if alpha == 0.0 and name == "df":
            assert g.abs().max().item() == 0.0
            continue
        assert_normwise(name, g, r, tau)


U32 = 2.0**-24  # unit roundoff of fp32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1000,), ()], ids=["per-channel", "scalar"])
def test_a_residual_gain_inside_the_add(backend, dtype, shape):
    """A residual method's branch gain (LayerScale's per-channel λ, a scalar one): h = x + alpha·λ⊙f,
    y, and every gradient, dλ included, against float64, on each backend (Triton applies λ in-kernel)."""
    x, f, w, b, dy, dh = inputs(100, 1000, dtype)
    gain = (0.5 + 0.1 * torch.randn(shape, generator=torch.Generator().manual_seed(1))).to(dtype).to(DEVICE)
    h, y, grads = run_add_norm(backend, x, f, 0.3, w, b, 1e-5, False, dy, dh, gain=gain)
    rh, ry, rgrads = reference(x, f, 0.3, w, b, 1e-5, False, dy, dh, gain=gain)
    for name, got, ref in zip(("h", "y", "dx", "df", "dw", "db"), [h, y, *grads], [rh, ry, *rgrads]):
        assert_normwise(name, got, ref, TAU[dtype])
    # dλ sums alpha·f⊙dL/dh over every element λ scales (1e5 of them for a scalar), with cancellation: its
    # error is bounded by the terms' absolute sum, not by |dλ|. Every backend sums by trees (torch's
    # cascade sum, Triton's tl.sum): <= ceil(log2 n)·u·Σ|terms| = 17u for n = 1e5, inside TAU's 1e-5 (fp32);
    # in bf16 each term carries ~3 roundings of 2^-9 before an fp32 sum, inside TAU's 1.6e-2.
    terms = (0.3 * f.double() * rgrads[0]).abs()
    bound = TAU[dtype] * (terms.sum(0) if shape else terms.sum())
    assert grads[4].shape == gain.shape
    assert ((grads[4].double() - rgrads[4]).abs() <= bound).all(), "dgain off by more than the summation bound"
    if dtype == torch.float32:  # there the bound is a few % of dλ at most: a gradient missing alpha or λ fails
        assert (bound / rgrads[4].abs().clamp_min(1e-30)).median().item() < 0.05


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("branch", [torch.float32, torch.bfloat16], ids=["fp32", "fp32-stream-bf16-branch"])
@pytest.mark.parametrize("alpha", [1e-3, 0.1, 1.0])
def test_the_add_contributes_exactly_alpha_f(backend, branch, alpha):
    """h − x against alpha·f, element by element, relative to the branch itself. In fp32 arithmetic
    h = fl(x + fl(alpha·f)) is off x + alpha·f by at most u·|alpha·f| + u·(1 + u)·|h| (two roundings
    to nearest; one with an FMA), and h − x is exact in float64 (x and h are fp32). The branch here is ~1/5 of the stream, so at
    alpha = 1e-3 the bound is ~1e-3 of |alpha·f| where a normwise bound on h allows ~10·|alpha·f|."""
    x, _, w, b, dy, dh = inputs(100, 1000, torch.float32)
    f = inputs(100, 1000, branch)[1]
    h, _, _ = run_add_norm(backend, x, f, alpha, w, b, 1e-5, True, dy, dh)
    a = torch.tensor(alpha, dtype=torch.float32).double()  # the fp32 alpha the kernels are given
    added, want = h.detach().double() - x.double(), a * f.double()
    bound = U32 * want.abs() + U32 * (1 + U32) * h.detach().double().abs()
    worst = ((added - want).abs() / bound).max().item()
    assert worst <= 1.0 + 1e-9, f"h - x is off alpha·f by {worst:.2f} times the fp32 rounding bound"
    # what the bound allows, per element, is a small share of the branch: a mis-scaled alpha·f fails
    assert (bound / want.abs().clamp_min(1e-30)).median().item() < 0.02


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_an_fp32_stream_with_a_bf16_branch(backend, rms):
    """model.fp32_residual: x, h and y fp32, the branch f and the norm's weights bf16. The add and the
    norm are fp32 arithmetic, so h, y and dx meet the fp32 tolerance; df is rounded to bf16."""
    x, _, _, _, dy, dh = inputs(100, 1000, torch.float32)
    _, f, w, b, _, _ = inputs(100, 1000, torch.bfloat16)
    h, y, grads = run_add_norm(backend, x, f, 1e-3, w, b, 1e-5, rms, dy, dh)
    assert h.dtype == y.dtype == grads[0].dtype == torch.float32 and grads[1].dtype == torch.bfloat16
    rh, ry, rgrads = reference(x, f, 1e-3, w, b, 1e-5, rms, dy, dh)
    for name, got, ref in zip(("h", "y", "dx"), [h, y, grads[0]], [rh, ry, rgrads[0]]):
        assert_normwise(name, got, ref, TAU[torch.float32])
    assert_normwise("df", grads[1], rgrads[1], TAU[torch.bfloat16])


@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("n", [1368, 3000, 64])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_triton_hidden_sizes_and_fp16(n, rms):
    x, f, w, b, dy, dh = inputs(37, n, torch.float16, seed=n)
    h, y, grads = run_add_norm("triton", x, f, 0.5, w, b, 1e-5, rms, dy, dh)
    rh, ry, rgrads = reference(x, f, 0.5, w, b, 1e-5, rms, dy, dh)
    for name, got, ref in zip(("h", "y", "dx", "df", "dw", "db"), [h, y, *grads], [rh, ry, *rgrads]):
        assert_normwise(name, got, ref, TAU[torch.float16])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_norm_alone_without_bias(backend, rms):
    x, _, w, _, dy, _ = inputs(50, 256, torch.float32)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fused.ops(backend).k.norm(xl, wl, None, 1e-5, rms)
    y.backward(dy)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    r = ref_norm(x64, w64, None, 1e-5, rms)
    r.backward(dy.double())
    for name, got, ref in (("y", y, r.detach()), ("dx", xl.grad, x64.grad), ("dw", wl.grad, w64.grad)):
        assert_normwise(name, got, ref, TAU[torch.float32])


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("alpha", [None, 0.0, 0.37])
def test_deepnorm_is_add_norm_with_scaled_alpha_and_eps(rms, alpha):
    """Norm(c·x + a·f) == Norm(x + (a/c)·f) with eps/c², in float64: why one kernel serves both."""
    c, eps = (2 * L) ** 0.25, 1e-5
    x, f, w, b, _, _ = (t.double().cpu() for t in inputs(20, 64, torch.float32))
    n = Norm("rmsnorm" if rms else "layernorm", 64, eps).double()
    with torch.no_grad():
        n.weight.copy_(w)
        if n.bias is not None:
            n.bias.copy_(b)
    a = None if alpha is None else torch.tensor(alpha, dtype=torch.float64)
    got = fused.ops("eager").post_norm(x, f, a, n, skip_scale=c)
    direct = ref_norm(c * x + (1.0 if alpha is None else alpha) * f, w, None if rms else b, eps, rms)
    torch.testing.assert_close(got, direct, rtol=1e-12, atol=1e-12)


def test_compile_backend_never_recompiles_for_a_new_alpha():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    x, f, w, b, _, _ = inputs(16, 128, torch.float32)
    k = fused.ops("compile").k
    for step in range(10):
        alpha = torch.tensor(step / 10, dtype=torch.float32, device=DEVICE)
        h, y = k.add_norm(x, f, alpha, w, b, 1e-5, True)
        assert torch.equal(h, x + alpha * f)
    assert counters["stats"]["unique_graphs"] == 1
    # the counter does see recompiles: a Python-float alpha is specialised per value
    add = fused.ops("compile").k.add
    for step in range(3):
        add(x, f, step / 10 + 0.05)
    assert counters["stats"]["unique_graphs"] > 2


def test_backend_resolution():
    cpu = torch.device("cpu")
    assert fused.resolve_backend("eager", cpu) == ("eager", "requested")
    assert fused.resolve_backend("auto", cpu)[0] == "block"  # g++ is part of the test setup
    if HAS_TRITON:
        assert fused.resolve_backend("auto", torch.device("cuda"))[0] == "triton"
    assert fused.resolve_backend("triton", cpu)[0] == "triton"  # conftest sets TRITON_INTERPRET=1


def test_triton_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UsageError, match="kernels.backend=triton needs a CUDA device"):
        fused.resolve_backend("triton", torch.device("cpu"))


def train_losses(backend, layout, steps=6):
    """A few AdamW steps of a tiny model built with ``backend``; same seed and data every time."""
    from prores.config import load_config
    from prores.model.gpt import gpt_pieces, lm_loss
    from prores.model.prores import ProRes

    cfg = load_config(None, ("model.num_layers=3", "model.hidden_size=64", "model.ffn_hidden_size=96",
                             "model.seq_length=16", f"model.norm_layout={layout}",
                             f"model.init={'deepnorm' if layout == 'deepnorm' else 'normal'}",
                             "model.norm=layernorm", "model.vocab_multiple=64"))
    prores = ProRes("linear", 2, cfg.model.num_layers)
    modules = [p.cls(**p.kwargs) for p in gpt_pieces(cfg.model, prores, 258, seed=3, backend=backend)]
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3)
    batch = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(0))  # memorised
    losses = []
    for step in range(steps):
        for m in modules[1:1 + cfg.model.num_layers]:
            m.set_step(step)
        h = batch[:, :-1]
        for m in modules:
            h = m(h)
        loss = lm_loss(h, batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("layout", ["pre", "post", "sandwich", "deepnorm", "layerscale"])
def test_switching_backend_changes_nothing_but_speed(world_of_one, layout):
    """Six steps with ProRes on (T = 2: alpha < 1 in every block throughout). A backend only reorders fp32
    arithmetic: each op's result moves by at most its sum's length (here at most 96) times the unit roundoff
    2^-24, about 6e-6 relative, and the loss of a model this small that memorises its batch stays within 1e-5
    of eager's over six steps (the first step's loss is one forward: well inside it)."""
    eager = train_losses("eager", layout)
    assert eager[-1] < eager[0] - 0.1  # it learns
    for backend in OTHER_BACKENDS:
        other = train_losses(backend, layout)
        for step, (a, b) in enumerate(zip(other, eager)):
            assert a == pytest.approx(b, rel=1e-5), f"{backend} {layout}: step {step} loss {a} vs eager {b}"
