"""The child side of kog.tune.isolation: `python -m kog.tune.worker` runs one trial and exits.

Protocol (JSON lines on stdout, see isolation.py). Anything the target prints goes to stderr, so stdout
carries only protocol lines.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import sys


def main() -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                     # a library printing to stdout cannot break the protocol
    sys.stdout = sys.stderr

    def emit(obj) -> None:
        proto.write(json.dumps(obj, default=_jsonable) + "\n")
        proto.flush()

    try:
        job = json.loads(sys.stdin.read())
        mod, fn = job["target"].split(":")
        target = getattr(importlib.import_module(mod), fn)

        def report(step: int, value: float) -> None:
            emit({"event": "intermediate", "step": int(step), "value": float(value)})

        res = target(job.get("payload") or {}, report)
        if isinstance(res, dict):
            value = res.pop("value")
            extra = res
        else:
            value, extra = res, {}
        if value is None or not math.isfinite(float(value)):
            raise ValueError(f"objective returned a non-finite value {value!r}")
        emit({"event": "result", "value": float(value), **extra})
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure becomes one protocol line
        emit({"event": "error", "type": type(e).__name__, "message": str(e)[:1000]})
        return 1


def _jsonable(o):
    try:
        import numpy as np
        if isinstance(o, np.generic):
            return o.item()
    except Exception:
        pass
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
