"""The one place where a block adds a branch to its residual stream.

Every norm layout is written with four calls on a :class:`FusedOps`:

* ``norm(x, n)``                 -> Norm(x)
* ``add(x, f, alpha)``           -> x + alpha·f
* ``add_norm(x, f, alpha, n)``   -> (h, Norm(h)), h = x + alpha·f            (pre, lns, sandwich)
* ``post_norm(x, f, alpha, n, c)`` -> Norm(c·x + alpha·f)                    (post, deepnorm)

``alpha`` is a 0-dim fp32 tensor, or ``None`` once the ProRes schedule has
saturated at 1: then no multiply is issued at all. ``post_norm`` uses
Norm(c·x + a·f) = Norm(x + (a/c)·f) with eps/c² (a norm ignores the scale of
its input except through eps), so one add+norm kernel serves post and deepnorm.

Backends (``kernels.backend``): ``eager`` (plain torch, the reference),
``compile`` (the same formulas under Inductor), ``triton`` (fused GPU kernels).
``auto`` takes triton on CUDA, compile on CPU with a C++ compiler, else eager.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from typing import Optional

import torch

from prores.errors import UsageError
from prores.model.kernels import BACKENDS
from prores.model.norm import Norm


class FusedOps:
    """The four residual operations on top of one kernel module."""

    def __init__(self, name: str):
        self.name = name
        self.k = importlib.import_module(BACKENDS[name])

    @staticmethod
    def _args(n: Norm):
        weight, bias = n.affine()
        return weight, bias, n.eps, n.kind == "rmsnorm"

    def norm(self, x: torch.Tensor, n: Norm) -> torch.Tensor:
        return self.k.norm(x, *self._args(n))

    def add(self, x: torch.Tensor, f: torch.Tensor, alpha: Optional[torch.Tensor]) -> torch.Tensor:
        return self.k.add(x, f, alpha)

    def add_norm(self, x, f, alpha: Optional[torch.Tensor], n: Norm) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k.add_norm(x, f, alpha, *self._args(n))

    def post_norm(self, x, f, alpha: Optional[torch.Tensor], n: Norm, skip_scale: float = 1.0) -> torch.Tensor:
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
            return "compile", "CPU with a C++ compiler for Inductor"
        return "eager", f"no triton for {device.type} and no C++ compiler for torch.compile"
    if requested == "triton":
        if not have_triton:
            raise UsageError("kernels.backend=triton: triton is not installed; pip install triton, or use"
                             " kernels.backend=auto.")
        if device.type != "cuda" and not triton_interpreted():
            raise UsageError(f"kernels.backend=triton needs a CUDA device (this run is on {device.type});"
                             " use kernels.backend=auto or compile, or set TRITON_INTERPRET=1 for tests.")
        return "triton", "requested" + (" (TRITON_INTERPRET=1)" if device.type != "cuda" else "")
    if requested == "compile" and device.type == "cpu" and not shutil.which(os.environ.get("CXX", "g++")):
        raise UsageError("kernels.backend=compile on CPU needs a C++ compiler (g++); install one or use eager.")
    return requested, "requested"
