"""Run a schedule without a GPU: every CTA co-resident, each executing its steps in order, a step starting
only when its waits hold. A stall with work left is a deadlock; the checker reports the earliest stuck step.

Every object only grows and every wait is a threshold, so the run's end state does not depend on the order
in which ready CTAs go: one complete run shows that no schedule of the real kernel deadlocks.

A schedule is, per CTA, the list of steps one token takes. A step is

    Step(label, waits, actions, release, on_start, on_run)

  waits     (object, per_token, offset) triples: the step runs at token t once
            value[object] >= (t + 1) * per_token + offset
  actions   what running it does, in order:
              ("add", object, n)          value[object] += n                     (a release, a tag, a flag)
              ("tile",)                   one finished tile pending on the current release counter
              ("release", counter)        a later task of the same step releases `counter`: publish what is
                                          pending on another counter first (consecutive tasks of one phase
                                          run as one step: their waits are the first task's)
              ("flush",)                  publish the pending tiles
              ("arrive", object, every, steps)
                                          value[object] += 1, and the arrival that brings it to a multiple of
                                          `every` runs `steps` right away (the last CTA hands the token over)
              ("arrive_live", object, index, live, steps)
                                          an attention split: only a split holding cached positions arrives
                                          (index < live(token)), and the arrival that brings the object to the
                                          sum of live(u) over tokens u <= token runs `steps` (the last live
                                          split merges; kernel/attention.py)
  on_start, on_run  callbacks (token) -> None|str run when the CTA reaches the step and when the step runs:
                    the plan's coverage checks (a returned string is a violation)

  release   a task's release counter (None: it releases none): as the kernel does at every task's start,
            tiles pending on another counter are published when the CTA reaches the step, before its waits.
            Steps that are not tasks (token start, barrier arrival, hand-off) leave it NOT_A_TASK.
Pending tiles model the kernel's deferred release (kernel/sync.py): consecutive tasks releasing one counter
publish their tiles with one increment, at the first task that releases elsewhere or at the token's end.
The same engine checks the single-GPU plan (plan.check_plan) and the tensor-parallel one (tp_plan).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable


NOT_A_TASK = object()


@dataclass
class Step:
    label: str
    waits: tuple = ()
    actions: tuple = ()
    release: Hashable | None = NOT_A_TASK
    order: tuple = ()               # the step's phase: a deadlock is reported at the earliest stuck phase
    on_start: Callable[[int], str | None] | None = None
    on_run: Callable[[int], str | None] | None = None


@dataclass
class _Cta:
    steps: list[Step]
    token: int = 0
    i: int = 0
    started: bool = False
    extra: deque = field(default_factory=deque)      # (step, token) inserted by arrivals
    pend: tuple[Hashable | None, int] = (None, 0)


class ScheduleError(AssertionError):
    """A deadlock or a coverage violation, naming the CTA, the token and the step."""


def simulate(programs: list[list[Step]], tokens: int = 2, describe: Callable[[Hashable], str] = str) -> dict:
    """Run `tokens` tokens of the CTAs' programs; raise ScheduleError on a violation or a deadlock. Returns the
    final object values (for tests). A CTA that cannot go on waits on the first object short of its target
    and runs again when that object grows, so each step is looked at a few times, not once per sweep."""
    val: dict[Hashable, int] = {}
    ctas = [_Cta(p) for p in programs]
    waiting: dict[Hashable, list[int]] = {}
    runnable = deque(range(len(ctas)))

    def bump(obj, n: int) -> None:
        val[obj] = val.get(obj, 0) + n
        if obj in waiting:
            runnable.extend(waiting.pop(obj))

    def flush(c: _Cta) -> None:
        obj, n = c.pend
        if obj is not None and n:
            bump(obj, n)
        c.pend = (None, 0)

    def act(c: _Cta, actions: tuple, t: int) -> None:
        for a in actions:
            kind = a[0]
            if kind == "add":
                bump(a[1], a[2])
            elif kind == "tile":
                c.pend = (c.pend[0], c.pend[1] + 1)
            elif kind == "release":
                if c.pend[0] != a[1]:
                    flush(c)
                    c.pend = (a[1], 0)
            elif kind == "flush":
                flush(c)
            elif kind == "arrive":
                v = val.get(a[1], 0) + 1
                bump(a[1], 1)
                if v % a[2] == 0:
                    c.extra.extendleft((s_, t) for s_ in reversed(a[3]))
            elif kind == "arrive_live":
                live = a[3]
                if a[2] < live(t):
                    v = val.get(a[1], 0) + 1
                    bump(a[1], 1)
                    if v == sum(live(u) for u in range(t + 1)):
                        c.extra.extendleft((s_, t) for s_ in reversed(a[4]))
            else:
                raise ValueError(f"unknown action {kind!r}")

    def current(c: _Cta) -> tuple[Step, int] | None:
        if c.extra:
            return c.extra[0]
        return (c.steps[c.i], c.token) if c.token < tokens and c.i < len(c.steps) else None

    def short(step: Step, t: int):
        for o, per, off in step.waits:
            if val.get(o, 0) < (t + 1) * per + off:
                return o
        return None

    def check(cb, t: int, ci: int, step: Step) -> None:
        if cb is not None:
            msg = cb(t)
            if msg:
                raise ScheduleError(f"CTA {ci}, token {t}, {step.label}: {msg}")

    while runnable:
        ci = runnable.popleft()
        c = ctas[ci]
        while True:
            cur = current(c)
            if cur is None:
                break
            step, t = cur
            if not c.started:
                if step.release is not NOT_A_TASK and c.pend[0] != step.release:
                    flush(c)
                    c.pend = (step.release, 0)
                check(step.on_start, t, ci, step)
                c.started = True
            o = short(step, t)
            if o is not None:
                waiting.setdefault(o, []).append(ci)
                break
            check(step.on_run, t, ci, step)
            if c.extra:
                c.extra.popleft()
            else:
                c.i += 1
                if c.i == len(c.steps):
                    c.i, c.token = 0, c.token + 1
            c.started = False
            act(c, step.actions, t)
    stuck = [(cur[1], ci, cur[0]) for ci, c in enumerate(ctas) if (cur := current(c)) is not None]
    if stuck:
        t, ci, step = min(stuck, key=lambda s: (s[0], s[2].order, s[1]))
        o, per, off = next(w for w in step.waits if val.get(w[0], 0) < (t + 1) * w[1] + w[2])
        raise ScheduleError(f"deadlock: CTA {ci} stuck at token {t} on {step.label}, waiting on {describe(o)} "
                            f"({val.get(o, 0)} < {(t + 1) * per + off}); {len(stuck)} CTA(s) stuck")
    return val
