"""The errors every kog command turns into one clear line and an exit code.

Exit codes (both CLIs): 0 ok, 1 the work failed, 2 usage or environment error
(bad arguments, no GPU, bad input file, bad storage URL, a subcommand not built yet).
"""
from __future__ import annotations

import functools
import sys
from typing import Callable

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class KogError(Exception):
    """An expected failure with a message meant for a person. `exit_code` is what the CLI returns."""

    exit_code = EXIT_FAIL


class UsageError(KogError):
    """Bad arguments, bad input or an environment that cannot do the job (exit 2)."""

    exit_code = EXIT_USAGE


class NoGPUError(UsageError):
    """The command needs a GPU and there is none (or the one there is unusable)."""


class NotBuiltError(UsageError):
    """A subcommand whose work is not built yet: say so, never print fake output."""


def cli_entry(prog: str) -> Callable[[Callable[[list[str] | None], int]], Callable[[list[str] | None], int]]:
    """Wrap a CLI `main(argv) -> int` so expected errors become one line on stderr and an exit code.

    Unexpected exceptions still become one line (plus a hint to set KOG_DEBUG=1 for the traceback):
    a user never sees a raw traceback by default.
    """

    def deco(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
        @functools.wraps(main)
        def wrapped(argv: list[str] | None = None) -> int:
            import os
            try:
                return int(main(argv) or 0)
            except KogError as e:
                print(f"{prog}: error: {e}", file=sys.stderr)
                return e.exit_code
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return 130
            except SystemExit:
                raise
            except Exception as e:  # noqa: BLE001 - the last line of defence of a CLI
                if os.environ.get("KOG_DEBUG"):
                    raise
                print(f"{prog}: error: {type(e).__name__}: {e} (set KOG_DEBUG=1 for the traceback)",
                      file=sys.stderr)
                return EXIT_FAIL

        return wrapped

    return deco
