"""`prores export RUN --format hf OUT`: a run's checkpoint as a Hugging Face ``LlamaForCausalLM``.

Only a model that *is* a Llama exports: Pre-LN blocks with RMSNorm, SwiGLU and RoPE, no biases, no
learned positions, no branch scale (every alpha exactly 1 at that step: ProRes saturated or off, no
depth-µP multiplier) and no method gains. Anything else is one refusal that says why: HF's Llama has no
place for it, and an approximate export would give other numbers than the run.

Weights map one to one: Megatron's fused QKV rows are ``[head, (q, k, v), head_dim]`` (cut into q_proj,
k_proj and v_proj), its SwiGLU fc1 rows ``[gate; up]``; both use the half-split rotary convention that HF's
``rotate_half`` does. The vocabulary is the padded one (padding rows never score: the tokenizer has no ids
for them). The tokenizer: a run's ``tokenizer.json`` is copied; the byte tokenizer becomes its exact HF
form, a BPE over the 256 bytes (id = byte value) with no merges, ``<eod>`` = 256, ``<pad>`` = 257.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from prores.errors import UsageError
from prores.launcher.restore import OneProcessModel, pick_step
from prores.model.block import Block
from prores.model.gpt import Embedding, FinalNorm, Head


def llama_refusal(cfg, model: OneProcessModel) -> Optional[str]:
    """Why this model has no exact LlamaForCausalLM form, or None."""
    m = cfg.model
    for ok, why in ((m.norm_layout == "pre", f"model.norm_layout={m.norm_layout}: Llama's blocks are Pre-LN"),
                    (m.norm == "rmsnorm", f"model.norm={m.norm}: Llama's norms are RMSNorm"),
                    (m.mlp == "swiglu", f"model.mlp={m.mlp}: Llama's MLP is SwiGLU"),
                    (m.position == "rope", f"model.position={m.position}: Llama's positions are RoPE")):
        if not ok:
            return why
    scaled = [b.layer_number for b in model.blocks if b.alpha is not None]
    if scaled:
        return (f"at step {model.step} block {scaled[-1]}'s branches are scaled by {float(model.blocks[-1].alpha):g}"
                " (ProRes not saturated, or depth-µP's multiplier): Llama has no branch scale; export a checkpoint"
                " from after the warmup")
    return None


def _bpe_byte_tokenizer(out: Path) -> None:
    """The byte tokenizer's exact HF form: ByteLevel's byte-to-character map, each byte a token whose id is the
    byte's value, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    chars = ByteLevel.alphabet()
    byte_char = {b: c for b, c in zip(range(256), _bytes_to_unicode())}
    assert set(byte_char.values()) == set(chars)
    vocab = {byte_char[b]: b for b in range(256)} | {"<eod>": 256, "<pad>": 257}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eod>", "<pad>"])
    tok.save(str(out / "tokenizer.json"))


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255, the map ByteLevel uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def llama_weights(pieces: list[torch.nn.Module], m) -> dict[str, torch.Tensor]:
    """The pieces' weights under LlamaForCausalLM's names (views, but Q, K and V: copies cut from the fused
    QKV matrix). Alpha is not a weight: a model
    whose alpha is not 1 is refused by :func:`llama_refusal` before its weights are written."""
    h, heads, d = m.hidden_size, m.num_heads, m.hidden_size // m.num_heads
    state: dict[str, torch.Tensor] = {}
    for piece in pieces:
        if isinstance(piece, Embedding) and "model.embed_tokens.weight" not in state:
            state["model.embed_tokens.weight"] = piece.word_embeddings.weight
        elif isinstance(piece, Block):
            p = f"model.layers.{piece.layer_number - 1}."
            q, k, v = piece.self_attention.linear_qkv.weight.view(heads, 3, d, h).unbind(1)
            state |= {p + "self_attn.q_proj.weight": q.reshape(h, h), p + "self_attn.k_proj.weight": k.reshape(h, h),
                      p + "self_attn.v_proj.weight": v.reshape(h, h),
                      p + "self_attn.o_proj.weight": piece.self_attention.linear_proj.weight,
                      p + "input_layernorm.weight": piece.norm1.weight,
                      p + "post_attention_layernorm.weight": piece.norm2.weight,
                      p + "mlp.down_proj.weight": piece.mlp.linear_fc2.weight}
            gate, up = piece.mlp.linear_fc1.weight.chunk(2, dim=0)
            state |= {p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up}
        elif isinstance(piece, FinalNorm):
            state["model.norm.weight"] = piece.norm.weight
        elif isinstance(piece, Head):
            state["lm_head.weight"] = piece.linear.weight
    return state


def llama_config(m, vocab_size: int) -> dict:
    """The LlamaConfig fields of model config ``m`` (``vocab_size``: the padded vocabulary)."""
    h, heads = m.hidden_size, m.num_heads
    return {"model_type": "llama", "hidden_size": h, "intermediate_size": m.ffn_hidden_size,
            "num_hidden_layers": m.num_layers, "num_attention_heads": heads, "num_key_value_heads": heads,
            "head_dim": h // heads, "hidden_act": "silu", "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_base,
            "max_position_embeddings": m.seq_length, "vocab_size": vocab_size,
            "tie_word_embeddings": m.tie_embeddings, "attention_bias": False, "mlp_bias": False,
            "torch_dtype": "float32"}


def export_hf(run_dir: Path, out: Path, step: Optional[int] = None) -> Path:
    from safetensors.torch import save_file

    run_dir, out = Path(run_dir), Path(out)
    step = pick_step(run_dir, step)
    model = OneProcessModel.of(run_dir).load(run_dir, step)
    cfg, m = model.cfg, model.cfg.model
    why = llama_refusal(cfg, model)
    if why:
        raise UsageError(f"{run_dir} (step {step}) cannot be exported as a Hugging Face Llama: {why}.")
    state = llama_weights(model.pieces, m)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    tokenizer, eod = model.tokenizer, model.tokenizer.eod
    config = llama_config(m, state["model.embed_tokens.weight"].shape[0])
    (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config,
                                                 "bos_token_id": eod, "eos_token_id": eod}, indent=2))
    if tokenizer.name == "byte":
        _bpe_byte_tokenizer(out)
        special = {"eos_token": "<eod>", "bos_token": "<eod>", "pad_token": "<pad>"}
    else:
        from tokenizers import Tokenizer

        # training encodes without special tokens (prores.data.tokenizers); "add_bos_token": False does not
        # reach a post-processor inside tokenizer.json, which AutoTokenizer would apply (a BOS template)
        spec = json.loads(Path(tokenizer.name).read_text())
        spec["post_processor"] = None
        (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
        eod_text = Tokenizer.from_file(tokenizer.name).id_to_token(eod)
        special = {"eos_token": eod_text, "bos_token": eod_text}
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": m.seq_length, "add_bos_token": False,
         **special}, indent=2))
    (out / "prores_export.json").write_text(json.dumps({"run_dir": str(run_dir.resolve()), "step": step}, indent=2))
    return out
