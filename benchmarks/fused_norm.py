"""Residual-add + norm: eager vs fused, side by side, with the device's copy bandwidth.

For tokens × hidden in {4096, 16384} × {512, 1024, 1368, 4096} and fp32/bf16,
prints eager ms, fused ms (compile on CPU; triton and compile on CUDA), the
speedup, and effective GB/s under a minimum-traffic model:

* forward  h = x + alpha·f, y = RMSNorm(h):  reads x, f; writes h, y    -> 4·M·N·bytes
* backward from dy, dh:                     reads h, dy, dh; writes dx, df -> 5·M·N·bytes
  (forward+backward: 9·M·N·bytes)

next to the measured copy GB/s of a tensor of the same size (2·M·N·bytes).
On CPU the script re-executes itself with MALLOC_MMAP_MAX_=0, so fresh
allocations of 32 MB and more do not page-fault through mmap.

``--gain`` asks where a residual method's per-channel gain (LayerScale's λ: h = x + alpha·λ⊙f) belongs:
inside the fused op (one graph under compile; in the kernel, forward and backward, under Triton) or
applied before it, as its own multiply. It runs the compile backend, and on CUDA the Triton one too, and
prints both times and before/inside (> 1: inside is faster).

Usage: python benchmarks/fused_norm.py [--quick] [--norm rmsnorm|layernorm] [--gain]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from prores.model import fused


def timed(fn, device, reps: int) -> float:
    """Median seconds of ``fn`` after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def case(kernels, m, n, dtype, device, rms, reps, gain: str = ""):
    """(forward, forward+backward) seconds; ``gain``: "" none, "inside" the op, or "before" it."""
    torch._dynamo.reset()  # a fresh compile per shape: stay far from dynamo's recompile limit
    g = torch.Generator(device="cpu").manual_seed(0)
    x, f, dy, dh = (torch.randn(m, n, generator=g).to(device, dtype) for _ in range(4))
    w = torch.ones(n, device=device, dtype=dtype, requires_grad=True)
    b = None if rms else torch.zeros(n, device=device, dtype=dtype, requires_grad=True)
    lam = torch.full((n,), 1e-2, device=device, dtype=dtype, requires_grad=True)
    alpha = torch.tensor(0.5, device=device)
    xg, fg = x.clone().requires_grad_(), f.clone().requires_grad_()

    def add_norm(x, f):
        if gain == "before":
            return kernels.add_norm(x, lam * f, alpha, w, b, 1e-5, rms)
        return kernels.add_norm(x, f, alpha, w, b, 1e-5, rms, gain=lam if gain == "inside" else None)

    def fwd():
        with torch.no_grad():
            add_norm(x, f)

    def fwd_bwd():
        h, y = add_norm(xg, fg)
        torch.autograd.backward([h, y], [dh, dy])

    return timed(fwd, device, reps), timed(fwd_bwd, device, reps)


def copy_gbps(m, n, dtype, device, reps) -> float:
    src = torch.randn(m, n, device=device).to(dtype)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / timed(lambda: dst.copy_(src), device, reps) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="4096 tokens, hidden 1024 and 4096 only")
    parser.add_argument("--norm", default="rmsnorm", choices=["rmsnorm", "layernorm"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--gain", action="store_true", help="a per-channel gain inside the fused op vs before it")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and os.environ.get("MALLOC_MMAP_MAX_") != "0":
        os.environ["MALLOC_MMAP_MAX_"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    rms = args.norm == "rmsnorm"
    fused_names = ["triton", "compile"] if device.type == "cuda" else ["compile"]
    eager = fused.ops("eager").k
    tokens = [4096] if args.quick else [4096, 16384]
    hidden = [1024, 4096] if args.quick else [512, 1024, 1368, 4096]
    note = "MALLOC_MMAP_MAX_=0" if device.type == "cpu" else torch.cuda.get_device_name()
    if args.gain:
        return gain_placement(tokens, hidden, device, rms, args.reps, note)
    print(f"device {device.type} ({note}), {args.norm}, median of {args.reps}; GB/s = minimum traffic / time")
    print(f"{'M x N':>12} {'dtype':>5} {'backend':>8} | {'fwd ms':>8} {'eager':>8} {'x':>5} {'GB/s':>6} |"
          f" {'f+b ms':>8} {'eager':>8} {'x':>5} {'GB/s':>6} | copy GB/s")
    for dtype in (torch.float32, torch.bfloat16):
        for m in tokens:
            for n in hidden:
                size = m * n * torch.tensor([], dtype=dtype).element_size()
                e_fwd, e_fb = case(eager, m, n, dtype, device, rms, args.reps)
                copy = copy_gbps(m, n, dtype, device, args.reps)
                for name in fused_names:
                    k_fwd, k_fb = case(fused.ops(name).k, m, n, dtype, device, rms, args.reps)
                    print(f"{m:>6}x{n:<5} {str(dtype)[6:]:>5} {name:>8} | {k_fwd * 1e3:8.2f} {e_fwd * 1e3:8.2f}"
                          f" {e_fwd / k_fwd:5.2f} {4 * size / k_fwd / 1e9:6.1f} | {k_fb * 1e3:8.2f}"
                          f" {e_fb * 1e3:8.2f} {e_fb / k_fb:5.2f} {9 * size / k_fb / 1e9:6.1f} | {copy:6.1f}")


def gain_placement(tokens, hidden, device, rms, reps, note) -> None:
    print(f"device {device.type} ({note}), per-channel gain: inside the fused op vs before it, median of {reps}")
    print(f"{'M x N':>12} {'dtype':>5} {'backend':>8} | {'fwd in':>8} {'before':>8} {'x':>5} |"
          f" {'f+b in':>8} {'before':>8} {'x':>5}")
    backends = ["compile"] + (["triton"] if device.type == "cuda" else [])
    for dtype in (torch.float32, torch.bfloat16):
        for m in tokens:
            for n in hidden:
                for name in backends:
                    k = fused.ops(name).k
                    i_fwd, i_fb = case(k, m, n, dtype, device, rms, reps, gain="inside")
                    b_fwd, b_fb = case(k, m, n, dtype, device, rms, reps, gain="before")
                    print(f"{m:>6}x{n:<5} {str(dtype)[6:]:>5} {name:>8} | {i_fwd * 1e3:8.2f} {b_fwd * 1e3:8.2f}"
                          f" {b_fwd / i_fwd:5.2f} | {i_fb * 1e3:8.2f} {b_fb * 1e3:8.2f} {b_fb / i_fb:5.2f}")


if __name__ == "__main__":
    main()
