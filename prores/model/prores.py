"""Progressive Residual Warmup: alpha(l, t) schedules as pure functions.

``l`` is the GLOBAL 1-based block index, ``t`` the number of completed
optimizer steps, ``T`` the per-layer warmup length (a positive real, so that
a short run can keep the paper's warmup as a share of training) and ``L``
the number of blocks. alpha scales both residual branches of block ``l``. It is a schedule,
never a parameter, so it is recomputed from ``t`` and a resume is exact.

Each schedule also says from which step on every alpha is 1 forever
(``saturates_at``); from then on blocks skip the multiply altogether.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from prores.errors import UsageError


def _linear(l: int, t: int, T: float, L: int) -> float:
    return min(t / (T * l), 1.0)


def _stagewise0(l: int, t: int, T: float, L: int) -> float:
    return min(max((t - T * (l - 1)) / T, 0.0), 1.0)


def _never_unless_one_layer(T: float, L: int) -> Optional[float]:
    return 0 if L == 1 else None


def _after_all_layers(T: float, L: int) -> Optional[float]:
    return T * L


@dataclass(frozen=True)
class Schedule:
    name: str
    fn: Callable[[int, int, float, int], float]
    saturates_at: Callable[[float, int], Optional[float]]  # the first step from which every alpha is 1
    doc: str


SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule("linear", _linear, _after_all_layers, "min(t/(T·l), 1)"),
        Schedule("linear-sqrt", lambda l, t, T, L: math.sqrt(_linear(l, t, T, L)), _after_all_layers, "linear^(1/2)"),
        Schedule("linear-square", lambda l, t, T, L: _linear(l, t, T, L) ** 2, _after_all_layers, "linear^2"),
        Schedule("equal", lambda l, t, T, L: min(t / T, 1.0), lambda T, L: T, "min(t/T, 1)"),
        Schedule("reverse", lambda l, t, T, L: min(t / (T * (L - l + 1)), 1.0), _after_all_layers,
                 "min(t/(T·(L−l+1)), 1)"),
        Schedule("stagewise-0", _stagewise0, _after_all_layers, "clip((t − T(l−1))/T, 0, 1)"),
        Schedule("stagewise-L", lambda l, t, T, L: _stagewise0(l, t, T, L) * (1 - 1 / L) + 1 / L,
                 _after_all_layers, "stagewise-0·(1 − 1/L) + 1/L"),
        Schedule("stagewise-sqrt-L",
                 lambda l, t, T, L: _stagewise0(l, t, T, L) * (1 - 1 / math.sqrt(L)) + 1 / math.sqrt(L),
                 _after_all_layers, "stagewise-0·(1 − 1/sqrt(L)) + 1/sqrt(L)"),
        Schedule("stagewise-sqrt-l",
                 lambda l, t, T, L: _stagewise0(l, t, T, L) * (1 - 1 / math.sqrt(l)) + 1 / math.sqrt(l),
                 _after_all_layers, "stagewise-0·(1 − 1/sqrt(l)) + 1/sqrt(l)"),
        Schedule("fix-L", lambda l, t, T, L: 1 / L, _never_unless_one_layer, "1/L"),
        Schedule("fix-sqrt-L", lambda l, t, T, L: 1 / math.sqrt(L), _never_unless_one_layer, "1/sqrt(L)"),
        Schedule("fix-sqrt-l", lambda l, t, T, L: 1 / math.sqrt(l), _never_unless_one_layer, "1/sqrt(l)"),
        Schedule("none", lambda l, t, T, L: 1.0, lambda T, L: 0, "1 (ProRes off)"),
    )
}


# The ProRes paper's code's names (torchrun_main.py's PRORES_SCHEDULE, and its README's linear_sqrt and
# linear_square, which that code does not accept) for the same functions. Its per-layer warmup lengths are
# linspace(P // L, P, L) with P = T·L steps, equal to prores's T·l exactly when T is a whole number; at a
# fractional T prores keeps T·l (block l saturates at step T·l, as the paper's formula says), where the
# reference rounds P // L down (its first block warms up in 2 steps, not 2.5, at T = 2.5 and L = 48).
REFERENCE_NAMES: dict[str, str] = {
    "sqrt": "linear-sqrt", "square": "linear-square", "linear_sqrt": "linear-sqrt", "linear_square": "linear-square",
    "linear_reverse": "reverse", "stagewise_0": "stagewise-0", "stagewise_L": "stagewise-L",
    "stagewise_sqrt_L": "stagewise-sqrt-L", "stagewise_sqrt_l": "stagewise-sqrt-l",
}
# The reference's names whose schedule is not prores's of that name: refused with what to write instead.
NOT_THE_SAME: dict[str, str] = {
    "linear_equal": "the ProRes paper's code warms every block up over T·L steps; prores's 'equal' does over T:"
                    " use prores.schedule=equal with prores.T set to T·L",
    **{f"fix_{k}": f"the ProRes paper's code holds its fix_{k} alpha for T·L steps and then sets it to 1;"
                   f" prores's fix-{k.replace('_', '-')} holds it for the whole run: use"
                   f" prores.schedule=fix-{k.replace('_', '-')} knowing so"
       for k in ("L", "sqrt_L", "sqrt_l")},
}


def schedule_name(name: str) -> str:
    """prores's name for ``name`` (its own, or the ProRes paper's code's); ValueError for a reference name
    whose schedule differs from prores's."""
    if name in NOT_THE_SAME:
        raise ValueError(f"'{name}': {NOT_THE_SAME[name]}.")
    return REFERENCE_NAMES.get(name, name)


@dataclass(frozen=True)
class ProRes:
    """A schedule bound to its ``T`` and ``L``; what each block holds."""

    schedule: str
    T: float
    num_layers: int

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown ProRes schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")

    def alpha(self, layer: int, step: int) -> float:
        if not 1 <= layer <= self.num_layers:
            raise ValueError(f"layer {layer} outside 1..{self.num_layers} (global, 1-based)")
        if step < 0:
            raise ValueError(f"step {step} is negative")
        return float(SCHEDULES[self.schedule].fn(layer, step, self.T, self.num_layers))

    def saturated(self, step: int) -> bool:
        """True when every layer's alpha is 1 at ``step`` and at every later step."""
        at = SCHEDULES[self.schedule].saturates_at(self.T, self.num_layers)
        return at is not None and step >= at


class ProResScheduler:
    """Sets every block's alpha for step t, as an LR scheduler sets the learning rate; the blocks are
    this process's (one pipeline stage's), each keyed by its global layer number.

    Its state is the schedule, T and L: saved with every checkpoint, and a checkpoint of another
    schedule is refused (alpha is recomputed from t on resume, so it must be the same function)."""

    def __init__(self, prores: ProRes, blocks: dict):
        self.prores, self.blocks = prores, blocks

    def step(self, t: int) -> None:
        for block in self.blocks.values():
            block.set_step(t)

    def applied(self) -> dict[int, float]:
        """The alpha each block multiplies its branches by now (1 once the schedule saturated)."""
        return {l: 1.0 if b.alpha is None else float(b.alpha) for l, b in sorted(self.blocks.items())}

    def state_dict(self) -> dict:
        return {"schedule": self.prores.schedule, "T": self.prores.T, "num_layers": self.prores.num_layers}

    def load_state_dict(self, state: dict) -> None:
        if state != self.state_dict():
            raise UsageError(f"the checkpoint was trained with ProRes {state}, this run has {self.state_dict()};"
                             " ProRes cannot change within a run: use the same prores.* and model.num_layers,"
                             " or start a new --run-dir.")
