"""The reference formulas under torch.compile (Inductor).

Only tensors and a few constants (eps, rms) reach the compiled functions, and
alpha is a 0-dim tensor input: one graph per shape and dtype, shared by every
layer, and a changing alpha never recompiles. (A Python-float alpha would be
specialised as a constant and recompile each time it changes.)
"""

from __future__ import annotations

import torch

from prores.model.kernels import reference

norm = torch.compile(reference.norm, dynamic=False)
add = torch.compile(reference.add, dynamic=False)
add_norm = torch.compile(reference.add_norm, dynamic=False)
