"""What every test needs, and nothing more.

TRITON_INTERPRET=1 is set here, before any test module imports triton, because Triton reads it at
import time: on the CPU machines (no GPU) kernels can then run only through the interpreter. It is
harmless for tests that never touch Triton, and a test on a GPU machine can still unset it in a
subprocess. KOG_FAKE_DEVICE is cleared so a stray value in the shell cannot change what tests see;
tests that want a fake device use the `fake_device` fixture.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.pop("KOG_FAKE_DEVICE", None)

import pytest  # noqa: E402


@pytest.fixture
def tmp_runs(tmp_path, monkeypatch):
    """A RunStore in a temporary directory, also exported as KOG_RUNS_DIR for subprocesses."""
    from kog.runstore import RunStore
    root = tmp_path / "runs"
    monkeypatch.setenv("KOG_RUNS_DIR", str(root))
    return RunStore(root)


@pytest.fixture
def fake_device(monkeypatch):
    """Call with 'h200' or 'mi300x' (or 'none'): detect()/require_gpu() then return that fake."""
    def use(name: str = "h200"):
        monkeypatch.setenv("KOG_FAKE_DEVICE", name)
        from kog.probe.device import detect
        devs = detect()
        return devs[0] if devs else None
    return use
