"""The errors every kog command turns into one clear line and an exit code.

Exit codes (both CLIs): 0 ok, 1 the work failed, 2 usage or environment error
(bad arguments, no GPU, bad input file, bad storage URL, a subcommand not built yet).
"""
from __future__ import annotations

import functools
import importlib
import signal
import sys
from typing import Any, Callable

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


class Terminated(BaseException):
    """SIGTERM turned into an exception, so `with run:` blocks mark their run incomplete on the way out.

    A BaseException (like KeyboardInterrupt) so that `except Exception` in probe code does not eat it.
    """


def _raise_terminated(signum, frame):  # noqa: ARG001 - signal handler signature
    raise Terminated()


def import_command(module: str, func: str, cmd: str) -> Callable[..., Any]:
    """`module.func`, or NotBuiltError('<cmd> is not built yet') when that very module does not exist.

    Only a missing `module` itself (or its function) means "not built": an import error raised from
    inside an existing module is a real bug and propagates.
    """
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            raise NotBuiltError(f"{cmd} is not built yet") from None
        raise
    fn = getattr(mod, func, None)
    if fn is None:
        raise NotBuiltError(f"{cmd} is not built yet")
    return fn


def cli_entry(prog: str) -> Callable[[Callable[[list[str] | None], int]], Callable[[list[str] | None], int]]:
    """Wrap a CLI `main(argv) -> int` so expected errors become one line on stderr and an exit code.

    Unexpected exceptions still become one line (plus a hint to set KOG_DEBUG=1 for the traceback):
    a user never sees a raw traceback by default. SIGTERM unwinds like Ctrl-C (exit 143), so run
    directories get marked incomplete; a closed stdout pipe (`| head`) ends quietly.
    """

    def deco(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
        @functools.wraps(main)
        def wrapped(argv: list[str] | None = None) -> int:
            import os
            old = None
            try:
                old = signal.signal(signal.SIGTERM, _raise_terminated)
            except ValueError:  # not the main thread (e.g. called from a test worker thread)
                pass
            try:
                return int(main(argv) or 0)
            except KogError as e:
                print(f"{prog}: error: {e}", file=sys.stderr)
                return e.exit_code
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return 130
            except Terminated:
                print(f"{prog}: terminated", file=sys.stderr)
                return 143
            except BrokenPipeError:
                # The reader went away (`kogprobe runs --json | head`): stop writing, say nothing.
                try:
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, sys.stdout.fileno())
                except Exception:
                    pass
                return 141
            except SystemExit:
                raise
            except Exception as e:  # noqa: BLE001 - the last line of defence of a CLI
                if os.environ.get("KOG_DEBUG"):
                    raise
                print(f"{prog}: error: {type(e).__name__}: {e} (set KOG_DEBUG=1 for the traceback)",
                      file=sys.stderr)
                return EXIT_FAIL
            finally:
                if old is not None:
                    signal.signal(signal.SIGTERM, old)

        return wrapped

    return deco
