"""How big each piece of the model is: parameters, and the activations autograd keeps for the backward pass.

Both are counted per tensor-parallel rank, from the config alone, so the planner can size a model
nobody has built. Tests compare both with built pieces (parameters exactly; activations against the
bytes autograd actually saves).

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", §4.1), term by term, adapted to this block. Their per-layer estimate, in 2-byte elements with
tensor parallelism t and no sequence parallelism, is sbh·(10 + 24/t + 5as/(ht)) bytes:
LayerNorm inputs, the QKV and MLP inputs and two dropout masks are replicated; Q, K, V, the
projection input, the 4h MLP output and the GeLU output are split over t; softmax, its dropout mask and
the attention over values cost 5as²b/t. Here, per token and per ``hidden`` (s·b·h elements):

* no dropout (the paper trains without it): no masks;
* SDPA (flash attention, on CPU too) keeps no s×s scores: its output and a logsumexp per head and
  token replace Megatron's 5as/h term, so Megatron's *selective* recompute is what SDPA already does;
* Q, K, V are views of one QKV output, and SDPA keeps it whole: 3/t; RoPE makes new Q and K: 2/t more;
* the SDPA output is the projection's input: 1/t;
* SwiGLU keeps the fc1 output (2f), silu(gate), the up half and their product (f each): 5f/(th);
  a GeLU MLP keeps its fc1 output and the GeLU output: 2f/(th);
* a norm keeps its input in fp32 (the norms compute in fp32 whatever the storage dtype) and, for
  RMSNorm, the normalised input too; its output feeds the next linear, which keeps it at the
  activation dtype (QKV and fc1 inputs, replicated).
"""

from __future__ import annotations

from dataclasses import dataclass

from prores.model.layouts import LAYOUTS

FP32 = 4


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """Padding depends on ``multiple`` only (not on tp), so layouts share one vocab."""
    return -(-vocab_size // multiple) * multiple


def _norm_params(m, width: int = 0) -> int:
    """A norm over ``width`` (default: the hidden size) features: gain; LayerNorm a bias; DyT its a."""
    width = width or m.hidden_size
    return {"layernorm": 2 * width, "rmsnorm": width, "dyt": width + 1}[m.norm]


def block_parameters(m, tp: int = 1) -> int:
    """The matrices (split over tp), and what the residual method adds, replicated: its norms, its gains and
    (HybridNorm) the Q, K and V norms, split over tp like the projections."""
    h, f = m.hidden_size, m.ffn_hidden_size
    fc1 = 2 * f if m.mlp == "swiglu" else f
    layout = LAYOUTS[m.norm_layout]
    gains = sum(h if g.per_channel else 1 for g in layout.gains)
    qkv_norms = 3 * _norm_params(m, h // tp) if layout.qkv_norm else 0
    return (3 * h * h + h * h + h * fc1 + f * h) // tp + len(layout.norms) * _norm_params(m) + gains + qkv_norms


def block_flops_per_token(m) -> int:
    """A block's training FLOPs per token, forward and backward (3x the forward): 2 per weight of its
    matrices, and 2·2·s·h for attention's scores and weighted sum (Megatron's and Kaplan et al.'s count)."""
    return 3 * (2 * block_parameters(m) + 4 * m.seq_length * m.hidden_size)


def embedding_parameters(m, vocab_size: int, tp: int = 1) -> int:
    """The word embedding (split over tp), learned positions, a method's norm on its output (Peri-LN), and
    DyT's scale of it."""
    positions = m.seq_length * m.hidden_size if m.position == "learned" else 0
    norm = _norm_params(m) if LAYOUTS[m.norm_layout].embedding_norm else 0
    scale = 1 if m.norm == "dyt" else 0
    return padded_vocab_size(vocab_size, m.vocab_multiple) * m.hidden_size // tp + positions + norm + scale


def head_parameters(m, vocab_size: int, tp: int = 1) -> int:
    """The final norm (pre-style layouts) and the output layer; tied, the last stage holds a copy of the
    word embedding (DeepSpeed keeps, and updates, the tied weight on both stages)."""
    final_norm = _norm_params(m) if LAYOUTS[m.norm_layout].final_norm else 0
    return final_norm + padded_vocab_size(vocab_size, m.vocab_multiple) * m.hidden_size // tp


@dataclass(frozen=True)
class Shape:
    """One micro-batch."""

    seq: int
    batch: int
    element: int  # bytes per activation element: 4 (fp32) or 2 (bf16)
    stream: int = 0  # bytes per residual-stream element (4 with model.fp32_residual); 0: ``element``

    @property
    def stream_bytes(self) -> int:
        return self.stream or self.element


def _norm_activations(m, backend: str, element: int, width: int = 0, groups: int = 1) -> int:
    """Per token, for norms over ``groups`` slices of ``width`` features (default: one over the hidden size)
    whose input has ``element`` bytes: the eager and compiled kernels compute in fp32 and keep the fp32
    input, the normalised input (RMSNorm) or the mean (LayerNorm), and rstd; the Triton kernel keeps only
    its input as it came, rstd and (LayerNorm) the mean, and recomputes the rest. DyT, computed by the
    reference on every backend, keeps its fp32 input and tanh's output."""
    w, rms = width or m.hidden_size, m.norm == "rmsnorm"
    if m.norm == "dyt":
        return FP32 * 2 * w
    if backend == "triton":
        return w * element + FP32 * groups * (1 if rms else 2)
    return FP32 * (2 * w + groups if rms else w + 2 * groups)


def _kept_affine(m, width: int) -> int:
    """Elements of a norm's affine parameters that its backward keeps (as fp32 copies, or LNS-scaled ones):
    the gain and, for LayerNorm, the bias."""
    return 2 * width if m.norm == "layernorm" else width


def block_activations(m, shape: Shape, tp: int = 1, backend: str = "eager") -> int:
    """Bytes one block (beyond the first, for LNS) keeps for its backward pass, per micro-batch and
    tensor-parallel rank, with the ``kernels.backend`` that runs its norms (scalars such as alpha not
    counted)."""
    h, f, a, e = m.hidden_size, m.ffn_hidden_size, m.num_heads, shape.element
    layout = LAYOUTS[m.norm_layout]
    norms = len(layout.norms)
    on_branch = sum(name.endswith("_post") for name in layout.norms)  # sandwich's norms of F's output
    gained = sum({"attn": 1, "mlp": 1, "both": 2}.get(g.on, 0) for g in layout.gains)  # skip gains: x is kept
    replicated = ((norms - on_branch) * _norm_activations(m, backend, shape.stream_bytes)
                  + on_branch * _norm_activations(m, backend, e)
                  + 2 * h * e  # the QKV and fc1 inputs
                  + gained * h * e)  # a branch's output, for its gain's gradient
    rope = 2 * h if m.position == "rope" else 0
    if layout.qkv_norm:  # the norms keep QKV's output; SDPA keeps the normed V (and RoPE's Q and K)
        qkv = 3 * _norm_activations(m, "eager", e) + h * e
    else:  # SDPA keeps QKV's output whole
        qkv = 3 * h * e
    split = (qkv + (rope + h + (5 if m.mlp == "swiglu" else 2) * f) * e) // tp + a // tp * FP32  # + the LSE
    # a norm whose gain is not the parameter itself keeps that copy: scaled by LNS, or (eager, compiled,
    # DyT everywhere) cast to fp32; the Q, K and V norms always run eager
    scaled = layout.norm_out_scale(2) != 1.0 and m.lns_scale == "fixed"
    copies = e != FP32 and (backend != "triton" or m.norm == "dyt")
    gain_copies = norms * _kept_affine(m, h) * (FP32 if copies else e) if copies or scaled else 0
    if layout.qkv_norm and e != FP32:
        gain_copies += 3 * _kept_affine(m, h // tp) * FP32
    # RoPE's cos and sin tables are not counted: one cached pair serves every block (prores.model.attention)
    return shape.seq * shape.batch * (replicated + split) + gain_copies


def embedding_activations(m, shape: Shape) -> int:
    """The token ids the lookup keeps (int64)."""
    return shape.seq * shape.batch * 8


def head_activations(m, shape: Shape, vocab_size: int, tp: int = 1, backend: str = "eager") -> int:
    """The final norm, the output layer's input, and what vocab-parallel cross-entropy keeps: the fp32
    softmax over this rank's vocab slice, a target mask and the local targets (9 bytes a token)."""
    h = m.hidden_size
    final_norm = _norm_activations(m, backend, shape.stream_bytes) if LAYOUTS[m.norm_layout].final_norm else 0
    vocab = padded_vocab_size(vocab_size, m.vocab_multiple) // tp
    return shape.seq * shape.batch * (final_norm + h * shape.element + FP32 * vocab + 9)


def logits_buffers(m, shape: Shape, vocab_size: int, tp: int = 1) -> int:
    """What DeepSpeed's pipeline engine adds on the last stage, outside autograd: it keeps each in-flight
    micro-batch's output, the logits over this rank's vocab slice in the compute dtype, in its buffers until that
    micro-batch's backward, which then holds their gradient beside them (2 · V · element bytes a token)."""
    return shape.seq * shape.batch * 2 * (padded_vocab_size(vocab_size, m.vocab_multiple) // tp) * shape.element
