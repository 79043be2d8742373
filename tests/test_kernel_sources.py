"""Every @triton.jit function in kog passes Triton's dependency scan (what a GPU launch runs before compiling,
and the interpreter never does): a kernel that names a plain Python function or a mutable global fails here
on the CPU instead of on the first GPU launch."""
from __future__ import annotations

import json
import os
import subprocess
import sys

_SCAN = r"""
import importlib, json, pkgutil
from triton.runtime.jit import JITFunction
import kog.engine.kernel, kog.probe.probes
mods = [f"{p.__name__}.{m.name}" for p in (kog.engine.kernel, kog.probe.probes) for m in pkgutil.iter_modules(p.__path__)]
mods += ["kog.engine.regreport"]
seen, bad = 0, []
for name in mods:
    mod = importlib.import_module(name)
    for attr, f in vars(mod).items():
        if isinstance(f, JITFunction) and f.__module__ == name:
            seen += 1
            try:
                f.cache_key
            except Exception as e:
                bad.append(f"{name}.{attr}: {e}")
print(json.dumps({"seen": seen, "bad": bad}))
"""


def test_every_kernel_passes_tritons_dependency_scan():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", _SCAN], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["seen"] >= 100, res
    assert not res["bad"], res["bad"]
