"""Fused residual-add + LayerNorm/RMSNorm in Triton, forward and backward.

One kernel pair serves every layout: ``h = x + alpha·λ⊙f`` (alpha a 0-dim fp32
tensor read on device, so a new alpha never recompiles; λ a residual method's
optional per-channel gain, LayerScale's), ``y = Norm(h)·w + b``.
Each program owns a ``[BLOCK_M, BLOCK_N]`` tile (BLOCK_N ≥ hidden), so small
hidden sizes still give every program a useful amount of work.

Forward reads x, f (and λ) once and writes h, y plus per-row mean/rstd. Backward
recomputes x̂ from the saved h, reads dy (and dh), writes dx and df = alpha·λ⊙dx,
and per-program partial sums of dγ/dβ (and dλ = Σ alpha·f⊙dx); the final sum over
programs is a plain ``torch.sum`` over a fixed layout, hence deterministic. f is
saved only with a gain, whose gradient needs it (as a separate multiply's would).

Every load is upcast to fp32 at once and all arithmetic is fp32 (the Triton
interpreter computes wrongly on bf16 values; tests run these kernels on CPU
under ``TRITON_INTERPRET=1``). Nothing here touches ``torch.cuda`` at import
time, and :mod:`prores.model.fused` imports this module only when the triton
backend is chosen.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from prores.model.kernels import reference

Tensor = torch.Tensor


@triton.jit
def _tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows and columns of program ``pid``'s [BLOCK_M, BLOCK_N] tile of a row-major [M, N] tensor."""
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    return rows, cols, row_ok, col_ok, row_ok[:, None] & col_ok[None, :], rows[:, None] * N + cols[None, :]


@triton.jit
def _fwd(X, F, ALPHA, G, W, B, H, Y, MEAN, RSTD, M, N, eps,
         HAS_F: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_GAIN: tl.constexpr, HAS_BIAS: tl.constexpr,
         RMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows, cols, row_ok, col_ok, mask, offs = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_F:
        f = tl.load(F + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_GAIN:
            f = f * tl.load(G + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_ALPHA:
            x = x + tl.load(ALPHA).to(tl.float32) * f
        else:
            x = x + f
        tl.store(H + offs, x.to(H.dtype.element_ty), mask=mask)
    n = tl.cast(N, tl.float32)
    if RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=1) / n
        tl.store(MEAN + rows, mean, mask=row_ok)
        xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n + eps)
    tl.store(RSTD + rows, rstd, mask=row_ok)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _bwd(H, DY, DH, ALPHA, F, G, W, MEAN, RSTD, DX, DF, DW_PART, DB_PART, DG_PART, M, N,
         HAS_DH: tl.constexpr, HAS_F: tl.constexpr, HAS_ALPHA: tl.constexpr, HAS_GAIN: tl.constexpr,
         HAS_BIAS: tl.constexpr, RMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows, cols, row_ok, col_ok, mask, offs = _tile(pid, M, N, BLOCK_M, BLOCK_N)
    h = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
    if RMS:
        xhat = h * rstd[:, None]
    else:
        mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (h - mean[:, None]) * rstd[:, None], 0.0)
    wdy = dy * w[None, :]
    n = tl.cast(N, tl.float32)
    c1 = tl.sum(xhat * wdy, axis=1) / n
    if RMS:
        dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
    else:
        c2 = tl.sum(wdy, axis=1) / n
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
    if HAS_DH:
        dx = dx + tl.load(DH + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
    if HAS_F:
        if HAS_ALPHA:
            df = tl.load(ALPHA).to(tl.float32) * dx
        else:
            df = dx
        if HAS_GAIN:  # here df is alpha·dx: dλ sums it times f, and df takes λ on
            f = tl.load(F + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(DG_PART + pid * N + cols, tl.sum(df * f, axis=0), mask=col_ok)
            df = df * tl.load(G + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(DF + offs, df.to(DF.dtype.element_ty), mask=mask)
    tl.store(DW_PART + pid * N + cols, tl.sum(dy * xhat, axis=0), mask=col_ok)
    if HAS_BIAS:
        tl.store(DB_PART + pid * N + cols, tl.sum(dy, axis=0), mask=col_ok)


def _tiles(n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): about 8K elements per tile, whole rows."""
    block_n = triton.next_power_of_2(n)
    block_m = max(1, min(64, 8192 // block_n))
    return block_m, block_n, 8 if block_m * block_n >= 4096 else 4


def _forward(x2, f2, alpha, gain, weight, bias, eps, rms):
    m, n = x2.shape
    block_m, block_n, warps = _tiles(n)
    h = torch.empty_like(x2) if f2 is not None else x2
    y = torch.empty_like(x2)
    rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
    mean = rstd if rms else torch.empty(m, dtype=torch.float32, device=x2.device)
    _fwd[(triton.cdiv(m, block_m),)](
        x2, x2 if f2 is None else f2, x2 if alpha is None else alpha, weight if gain is None else gain,
        weight, weight if bias is None else bias, h, y, mean, rstd, m, n, eps,
        HAS_F=f2 is not None, HAS_ALPHA=alpha is not None, HAS_GAIN=gain is not None, HAS_BIAS=bias is not None,
        RMS=rms, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return h, y, mean, rstd


def _backward(h, dy, dh, alpha, f, gain, weight, bias, mean, rstd, rms, has_f):
    m, n = h.shape
    block_m, block_n, warps = _tiles(n)
    programs = triton.cdiv(m, block_m)
    dx = torch.empty_like(h)
    df = torch.empty_like(h) if has_f else dx

    def parts(needed: bool) -> Optional[Tensor]:  # per-program partial sums over rows, of dγ, dβ, dλ
        return torch.empty(programs, n, dtype=torch.float32, device=h.device) if needed else None

    dw_part, db_part, dg_part = parts(True), parts(bias is not None), parts(gain is not None)
    _bwd[(programs,)](
        h, dy, dy if dh is None else dh, h if alpha is None else alpha, h if f is None else f,
        weight if gain is None else gain, weight, mean, rstd, dx, df,
        dw_part, dw_part if db_part is None else db_part, dw_part if dg_part is None else dg_part, m, n,
        HAS_DH=dh is not None, HAS_F=has_f, HAS_ALPHA=alpha is not None, HAS_GAIN=gain is not None,
        HAS_BIAS=bias is not None, RMS=rms, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    dw = dw_part.sum(0).to(weight.dtype)
    db = db_part.sum(0).to(bias.dtype) if bias is not None else None
    dg = dg_part.sum(0) if gain is not None else None  # fp32: the caller sums it to the gain's shape, then casts
    return dx, df, dw, db, dg


def _rows(t: Optional[Tensor], n: int) -> Optional[Tensor]:
    return None if t is None else t.reshape(-1, n).contiguous()


class _AddNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, f, alpha, weight, bias, eps, rms, gain):
        n = x.shape[-1]
        f2, g = _rows(f, n), None if gain is None else gain.expand(n).contiguous()  # a scalar gain: per channel
        h, y, mean, rstd = _forward(_rows(x, n), f2, alpha, g, weight, bias, eps, rms)
        ctx.save_for_backward(h, alpha, None if gain is None else f2, g, weight, bias, mean, rstd)
        ctx.rms, ctx.shape, ctx.gain_shape = rms, x.shape, None if gain is None else gain.shape
        return h.view(x.shape), y.view(x.shape)

    @staticmethod
    def backward(ctx, dh, dy):
        h, alpha, f2, g, weight, bias, mean, rstd = ctx.saved_tensors
        n = h.shape[-1]
        dx, df, dw, db, dg = _backward(h, _rows(dy, n), _rows(dh, n), alpha, f2, g, weight, bias, mean, rstd,
                                       ctx.rms, True)
        if dg is not None:
            dg = dg.sum_to_size(ctx.gain_shape).to(g.dtype)
        return dx.view(ctx.shape), df.view(ctx.shape), None, dw, db, None, None, dg


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms):
        n = x.shape[-1]
        x2 = _rows(x, n)
        _, y, mean, rstd = _forward(x2, None, None, None, weight, bias, eps, rms)
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.rms, ctx.shape = rms, x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        dx, _, dw, db, _ = _backward(x2, _rows(dy, x2.shape[-1]), None, None, None, None, weight, bias, mean,
                                     rstd, ctx.rms, False)
        return dx.view(ctx.shape), dw, db, None, None


def norm(x: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float, rms: bool) -> Tensor:
    return _Norm.apply(x, weight, bias, eps, rms)


# A lone add is one elementwise pass already; nothing to fuse.
add = reference.add


def add_norm(x: Tensor, f: Tensor, alpha: Optional[Tensor], weight: Tensor, bias: Optional[Tensor], eps: float,
             rms: bool, gain: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    return _AddNorm.apply(x, f, alpha, weight, bias, eps, rms, gain)
