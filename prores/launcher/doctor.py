"""`prores doctor`: what this machine or cluster has for a run, one line per item, each ✓ or ✗ with its fix.

The command to run first on a new machine (DeepSpeed's ``ds_report`` is the model). A ✗ on an optional
item (a launcher, Slurm, a GPU kernel backend) is information: the exit status is 1 only when training
cannot start here (a required package does not import, no kernel backend runs, or the run root cannot be
written).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

LAUNCHERS = {"torchrun": "comes with torch", "deepspeed": "comes with deepspeed (pip install -e .)",
             "srun": "Slurm's; only for `srun prores train` and slurm/train.sbatch",
             "sbatch": "Slurm's; only for slurm/train.sbatch and `prores sweep --runner slurm`"}
LOW_DISK = 10 * 2**30  # a checkpoint of a 1.3B model with its optimizer is about 16 GiB


@dataclass
class Check:
    item: str
    ok: bool
    detail: str
    required: bool = False

    def line(self) -> str:
        return f"{'✓' if self.ok else '✗'} {self.item:<25} {self.detail}"


def pinned() -> dict[str, str]:
    """The versions prores pins (``dist==version`` in its own package metadata, from pyproject.toml): those its
    suite ran with, whose internals it relies on (DeepSpeed's pipeline instructions and save barriers,
    Megatron-core's layers)."""
    pins = {}
    for requirement in importlib.metadata.requires("prores") or []:
        if "==" in requirement and ";" not in requirement and "extra" not in requirement:
            name, version = requirement.split("==")
            pins[name.strip().split("[")[0]] = version.strip()
    return pins


def version_of(module: str, dist: str, required: bool, fix: str) -> Check:
    try:
        importlib.import_module(module)
    except Exception as e:  # any failure to import is the finding: say which
        return Check(dist, False, f"does not import ({type(e).__name__}: {str(e).splitlines()[0][:80]}); {fix}",
                     required)
    version, pin = importlib.metadata.version(dist), pinned().get(dist)
    if pin is not None and version != pin:  # a warning: training may start, on internals nobody tested
        return Check(dist, False, f"{version}, not {pin}, the version prores's suite ran with (prores relies on"
                                  f" its internals): pip install {dist}=={pin}")
    return Check(dist, True, version, required)


def packages() -> list[Check]:
    checks = [Check("python", sys.version_info >= (3, 10), sys.version.split()[0]
                    + ("" if sys.version_info >= (3, 10) else "; prores needs Python 3.10 or newer"), True)]
    checks.append(version_of("torch", "torch", True, "pip install torch==2.13.0 (or your CUDA build)"))
    if checks[-1].ok:
        import torch

        if not torch.cuda.is_available():  # as `prores train` says it: DeepSpeed would warn that it guessed
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
    checks.append(version_of("deepspeed", "deepspeed", True, "pip install -e . (deepspeed==0.19.8)"))
    checks.append(version_of("megatron.core", "megatron-core", True, "pip install -e . (megatron-core==0.16.1)"))
    checks.append(version_of("triton", "triton", False, "only the triton kernel backend needs it (GPU runs)"))
    return checks


def devices() -> list[Check]:
    import torch

    if not torch.cuda.is_available():
        return [Check("CUDA", False, f"none: runs train on CPU (gloo), {os.cpu_count()} cores; a GPU run needs a"
                                     " CUDA build of torch and a driver (nvidia-smi)")]
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else None
    bf16 = torch.cuda.is_bf16_supported()
    return [Check("CUDA", True, f"{torch.version.cuda}; {len(names)} device(s): {', '.join(sorted(set(names)))}"),
            Check("NCCL", nccl is not None, nccl or "not available: multi-GPU runs need torch built with NCCL"),
            gpus_for_tasks(len(names), os.environ),
            Check("bf16", bf16, "supported: train.precision=auto trains in bf16 with fp32 masters" if bf16 else
                  "not supported on this GPU: train.precision=auto trains in fp32 (TF32 matmuls)")]


def tasks_per_node(env) -> Optional[int]:
    """How many ranks this node starts, as the launcher says it: torchrun's LOCAL_WORLD_SIZE, or Slurm's
    SLURM_NTASKS_PER_NODE, or the first count of SLURM_TASKS_PER_NODE (``4(x2),3``); None outside a launch."""
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(key):
            return int(env[key].split("(")[0].split(",")[0])
    return None


def gpus_for_tasks(gpus: int, env) -> Check:
    """The GPUs this process sees against the ranks its node starts (topology.cuda_index picks each rank's)."""
    tasks = tasks_per_node(env)
    if tasks is None:
        return Check("GPUs a task", True, f"{gpus} visible; not inside a launch: `prores train` under torchrun"
                                          f" --nproc-per-node={gpus} (or srun --ntasks-per-node={gpus}) uses them all")
    if gpus == 1:
        return Check("GPUs a task", True, f"1 visible to each of {tasks} task(s) a node: each drives its own")
    if tasks > gpus:
        return Check("GPUs a task", False, f"{tasks} tasks a node share {gpus} visible GPUs: start {gpus} tasks a node,"
                                           " or show each task one GPU (srun --gpus-per-task=1)")
    return Check("GPUs a task", tasks == gpus, f"{tasks} task(s) a node, {gpus} GPUs visible"
                 + ("" if tasks == gpus else f": {gpus - tasks} idle; start {gpus} tasks a node to use them"))


def launchers() -> list[Check]:
    checks = [Check(f"launcher {name}", bool(shutil.which(name)), shutil.which(name) or f"not on PATH ({why})")
              for name, why in LAUNCHERS.items()]
    if shutil.which("sinfo"):
        try:
            out = subprocess.run(["sinfo", "-h", "-o", "%P %a %D"], capture_output=True, text=True, timeout=10)
            parts = ", ".join(" ".join(line.split()[:1]) + f" ({line.split()[1]}, {line.split()[2]} nodes)"
                              for line in out.stdout.splitlines() if len(line.split()) == 3)
            checks.append(Check("Slurm partitions", out.returncode == 0 and bool(parts),
                                parts or "sinfo answered nothing: "
                                + ((out.stderr.strip().splitlines() or ['no partitions'])[0][:100])))
        except subprocess.TimeoutExpired:
            checks.append(Check("Slurm partitions", False, "sinfo did not answer in 10 s: is slurmctld up?"))
    else:
        checks.append(Check("Slurm partitions", False, "no sinfo on PATH: not a Slurm cluster, or its client"
                                                       " tools are not installed here"))
    return checks


def backends() -> list[Check]:
    """Each kernel backend's add_norm on a tiny tensor, against the eager reference."""
    import torch

    from prores.errors import UsageError
    from prores.model.fused import resolve_backend
    from prores.model.kernels import BACKENDS
    from prores.parallel.topology import run_device

    device = run_device()
    x, f = torch.randn(4, 64, device=device), torch.randn(4, 64, device=device)
    weight, alpha = torch.ones(64, device=device), torch.tensor(0.5, device=device)
    want = importlib.import_module(BACKENDS["eager"]).add_norm(x, f, alpha, weight, None, 1e-5, True)[1]
    checks = []
    for name in BACKENDS:
        try:
            resolve_backend(name, device)
            got = importlib.import_module(BACKENDS[name]).add_norm(x, f, alpha, weight, None, 1e-5, True)[1]
            ok = torch.allclose(got, want, rtol=1e-4, atol=1e-5)  # fp32 rounding of a 64-wide mean, not more
            checks.append(Check(f"kernels.backend={name}", ok, f"runs on {device.type}" if ok else
                                f"runs on {device.type} but differs from eager by {(got - want).abs().max():.2e}"))
        except UsageError as e:
            checks.append(Check(f"kernels.backend={name}", False, str(e)))
        except Exception as e:  # a compiler or driver failure is the finding
            checks.append(Check(f"kernels.backend={name}", False,
                                f"fails on {device.type}: {type(e).__name__}: {str(e).splitlines()[0][:100]}"))
    auto = resolve_backend("auto", device)
    checks.append(Check("kernels.backend=auto", any(c.ok for c in checks), f"picks {auto[0]} ({auto[1]})", True))
    return checks


def disk(run_root: Path) -> list[Check]:
    where = run_root if run_root.exists() else next(p for p in run_root.absolute().parents if p.exists())
    free = shutil.disk_usage(where).free
    writable = os.access(where, os.W_OK)
    detail = f"{free / 2**30:.1f} GiB free under {where}"
    if not writable:
        return [Check("run root", False, f"{where} is not writable: pass --run-dir elsewhere", True)]
    return [Check("run root", free >= LOW_DISK, detail + ("" if free >= LOW_DISK else
                  f"; less than {LOW_DISK // 2**30} GiB: large checkpoints will not fit (checkpoint.keep_last)"))]


def doctor(run_root: Path) -> int:
    checks = packages()
    sections = [("packages", checks)]
    if all(c.ok for c in checks if c.required):
        sections += [("devices", devices()), ("launchers", launchers()), ("kernels", backends())]
    sections.append(("disk", disk(run_root)))
    for title, section in sections:
        print(f"{title}:")
        for c in section:
            print("  " + c.line())
    fatal = [c for _, section in sections for c in section if c.required and not c.ok]
    print(f"prores doctor: {'training cannot start here: ' + ', '.join(c.item for c in fatal) if fatal else 'ready'}")
    return 1 if fatal else 0
