"""`python -m kog.probe.device`: the inventory JSON of every visible GPU (a list), or one line + exit 2."""
from __future__ import annotations

import json
import sys

from kog.errors import cli_entry


@cli_entry("kog.probe.device")
def main(argv: list[str] | None = None) -> int:
    from kog.probe.device.base import detect, require_gpu
    require_gpu()  # one clear line and exit 2 when there is no GPU
    print(json.dumps([d.to_dict() for d in detect()], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
