"""A cosine learning-rate schedule whose length is set by a wall-clock budget.

The GPU that trains the reference models is not the machine that writes this code, so the number
of steps cannot be fixed in advance: the first `probe` steps run at warm-up learning rates and are
timed, then total = min(max_steps, budget_s / seconds_per_step) and the cosine is laid over it.
Warm-up is linear over `warmup` steps; the cosine decays from lr to lr*final_frac at `total`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TimedCosine:
    lr: float
    budget_s: float
    max_steps: int
    warmup: int
    probe: int = 5
    final_frac: float = 0.1
    total: int | None = field(default=None, init=False)
    seconds_per_step: float | None = field(default=None, init=False)

    def rate(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        total = self.total or self.max_steps
        t = min(1.0, (step - self.warmup) / max(1, total - self.warmup))
        return self.lr * (self.final_frac + (1 - self.final_frac) * 0.5 * (1 + math.cos(math.pi * t)))

    def observe(self, step: int, elapsed_s: float) -> None:
        """Called after every step with the time since step 1 began (step 0 pays one-time
        costs: allocator warm-up, kernel selection); fixes `total` once the probe is done."""
        if self.total is None and step >= self.probe:
            self.seconds_per_step = elapsed_s / step
            fit = int(self.budget_s / self.seconds_per_step)
            self.total = max(self.warmup + 1, min(self.max_steps, fit))

    def done(self, step: int) -> bool:
        return self.total is not None and step >= self.total
