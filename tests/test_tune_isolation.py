"""Each trial runs in its own process: crashes, hangs, OOM, compile errors, wrong results become reasons."""
import os
import time

import pytest

from kog.tune.isolation import run_isolated

F = "kog.tune._fakes:"


def test_ok_with_intermediate_and_data():
    o = run_isolated(F + "ok", {"value": 7.5}, 30)
    assert o.status == "ok" and o.value == 7.5 and o.data["note"] == "fine"
    assert o.intermediates == [(0, 10.0)]


@pytest.mark.parametrize("fn,status,needle", [
    ("segfault", "crash", "SIGSEGV"),
    ("abort", "crash", "SIGABRT"),
    ("raise_error", "error", "bad thing"),
    ("oom", "oom", "out of memory"),
    ("compile_error", "compile", "unsupported layout"),
    ("wrong", "wrong", "max_rel_err"),
    ("exit3", "crash", "exit code 3"),
])
def test_failures_become_reasons(fn, status, needle):
    o = run_isolated(F + fn, {}, 30)
    assert o.status == status, o
    assert needle in o.reason


def test_hang_is_killed_with_its_group():
    t = time.monotonic()
    o = run_isolated(F + "hang_child", {}, 2.0)
    assert o.status == "hang" and "2 s" in o.reason
    assert time.monotonic() - t < 15


def test_prune_kills_the_child():
    o = run_isolated(F + "slow_then_value", {"short": 3.0, "sleep": 60}, 30, on_intermediate=lambda s, v: v < 5)
    assert o.status == "pruned" and o.wall_s < 20


def test_unknown_target_is_an_error():
    o = run_isolated("kog.tune._fakes:nope", {}, 30)
    assert o.status == "error" and "nope" in o.reason
