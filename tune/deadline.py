"""A deadline on an injectable clock: the search's and the sweep's wall budget.

Deadline(at, clock) is `at` seconds on `clock` (time.time by default, so `deadline=time.time() + 600` from a
script keeps working). Tests pass a simulated clock (e.g. one that advances by a simulated trial duration
per finished trial) so what they check does not depend on how fast a loaded machine runs.
"""
from __future__ import annotations

import time
from typing import Callable


class Deadline:
    def __init__(self, at: float, clock: Callable[[], float] = time.time):
        self.at, self.clock = float(at), clock

    def passed(self) -> bool:
        return self.clock() >= self.at

    def left(self) -> float:
        """Seconds left on the clock (never negative)."""
        return max(0.0, self.at - self.clock())


def as_deadline(d: "Deadline | float | None") -> "Deadline | None":
    """None, a Deadline, or a time.time() value as a Deadline."""
    if d is None or isinstance(d, Deadline):
        return d
    return Deadline(d)
