"""The one place where a block adds a branch to its residual stream.

Every norm layout is written with four calls on a :class:`FusedOps`:

* ``norm(x, n)``                 -> Norm(x)
* ``add(x, f, alpha, gain)``     -> x + alpha·gain⊙f
* ``add_norm(x, f, alpha, n, gain)`` -> (h, Norm(h)), h = x + alpha·gain⊙f  (pre, lns, sandwich, layerscale)
* ``post_norm(x, f, alpha, n, c, ω)`` -> Norm(c·ω⊙x + alpha·f)              (post, deepnorm, admin)

``alpha`` is a 0-dim fp32 tensor, or ``None`` once the ProRes schedule has
saturated at 1 (and no fixed branch multiplier applies): then no multiply is
issued at all. ``gain`` is a residual method's learnable branch gain (LayerScale's
λ, ReZero's s), or None. ``post_norm`` uses
Norm(c·x + a·f) = Norm(x + (a/c)·f) with eps/c² (a norm ignores the scale of
its input except through eps), so one add+norm kernel serves post and deepnorm.

Backends (``kernels.backend``): ``eager`` (plain torch, the reference),
``compile`` (the same formulas under Inductor), ``triton`` (fused GPU kernels), ``block`` (the eager
formulas, each block compiled whole: :mod:`prores.model.block_compile`).
``auto`` takes triton on CUDA, block on CPU with a C++ compiler, else eager.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from typing import Optional

import torch

from prores.errors import UsageError
from prores.model.kernels import BACKENDS, reference
from prores.model.norm import Norm


class FusedOps:
    """The four residual operations on top of one kernel module. A DyT norm (``model.norm: dyt``) is not a
    normalisation: its ops compute unfused, with the reference's :func:`dyt`."""

    def __init__(self, name: str):
        self.name = name
        self.k = importlib.import_module(BACKENDS[name])

    @staticmethod
    def _args(n: Norm):
        weight, bias = n.affine()
        return weight, bias, n.eps, n.kind == "rmsnorm"

    @staticmethod
    def _dyt(x: torch.Tensor, n: Norm) -> torch.Tensor:
        return reference.dyt(x, n.alpha, n.affine()[0])

    def norm(self, x: torch.Tensor, n: Norm) -> torch.Tensor:
        if n.kind == "dyt":
            return self._dyt(x, n)
        return self.k.norm(x, *self._args(n))

    def add(self, x: torch.Tensor, f: torch.Tensor, alpha: Optional[torch.Tensor],
            gain: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.k.add(x, f, alpha, gain)

    def add_norm(self, x, f, alpha: Optional[torch.Tensor], n: Norm,
                 gain: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        if n.kind == "dyt":
            h = self.add(x, f, alpha, gain)
            return h, self._dyt(h, n)
        return self.k.add_norm(x, f, alpha, *self._args(n), gain=gain)

    def post_norm(self, x, f, alpha: Optional[torch.Tensor], n: Norm, skip_scale: float = 1.0,
                  skip_gain: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Norm(c·ω⊙x + alpha·f); ``skip_gain`` ω is a method's learnable gain on the skip (Admin)."""
        if skip_gain is not None:
            x = x * skip_gain.to(x.dtype)
        if n.kind == "dyt":  # not scale-invariant: no eps/c² shortcut
            return self._dyt(self.add(x * skip_scale if skip_scale != 1.0 else x, f, alpha), n)
        weight, bias, eps, rms = self._args(n)
        if skip_scale != 1.0:
            if alpha is None:
                alpha = torch.ones((), dtype=torch.promote_types(f.dtype, torch.float32), device=f.device)
            alpha = alpha / skip_scale
            eps = eps / skip_scale**2
        return self.k.add_norm(x, f, alpha, weight, bias, eps, rms)[1]


_OPS: dict[str, FusedOps] = {}


def ops(name: str) -> FusedOps:
    """The shared :class:`FusedOps` of a resolved backend name (not ``auto``)."""
    if name not in _OPS:
        _OPS[name] = FusedOps(name)
    return _OPS[name]


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def resolve_backend(requested: str, device: torch.device) -> tuple[str, str]:
    """(backend, why) for ``kernels.backend``; a backend that cannot run here is a UsageError."""
    have_triton = importlib.util.find_spec("triton") is not None
    if requested == "auto":
        if device.type == "cuda" and have_triton:
            return "triton", "CUDA device and triton installed"
        if device.type == "cpu" and shutil.which(os.environ.get("CXX", "g++")):
            # each block compiled whole trains the CPU study soonest, compilation included (docs/study_time.txt)
            return "block", "CPU with a C++ compiler for Inductor: each block compiled whole"
        return "eager", f"no triton for {device.type} and no C++ compiler for torch.compile"
    if requested == "triton":
        if not have_triton:
            raise UsageError("kernels.backend=triton: triton is not installed; pip install triton, or use"
                             " kernels.backend=auto.")
        if device.type != "cuda" and not triton_interpreted():
            raise UsageError(f"kernels.backend=triton needs a CUDA device (this run is on {device.type});"
                             " use kernels.backend=auto or compile, or set TRITON_INTERPRET=1 for tests.")
        return "triton", "requested" + (" (TRITON_INTERPRET=1)" if device.type != "cuda" else "")
    if requested in ("compile", "block") and device.type == "cpu" and not shutil.which(os.environ.get("CXX", "g++")):
        raise UsageError(f"kernels.backend={requested} on CPU needs a C++ compiler (g++); install one or use eager.")
    return requested, "requested"
