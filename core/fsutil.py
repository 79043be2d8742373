"""Writing kog's outputs and stored state: atomically, to regular files only, readable by others.

Every file kog writes (run folders, reports, tuned.json, exported configs, bench JSON) goes through
atomic_write_bytes/_text/_json:

- a temp file in the same folder (a rename across file systems is not atomic), fsynced, then os.replace:
  a reader or a power cut sees the old file or the new one, never a torn one;
- only a regular file or a new name may be at the path: a symlink, FIFO, device node, socket or folder
  there is refused with one line (OutputPathError, exit 2) instead of being replaced by a regular file;
- the file is mode 0644 (mkstemp makes 0600, which other users and a web server could not read).

keep_aside() renames stored state that cannot be parsed to NAME.corrupt-<n> (never overwriting an earlier
one), so the next write starts clean without destroying what was there.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from kog.errors import UsageError

FILE_MODE = 0o644


class OutputPathError(UsageError):
    """An output path kog will not write: not a regular file, or in a folder it cannot write."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device node"),
                       (stat.S_ISBLK, "a device node"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_output_path(path: str | os.PathLike) -> Path:
    """`path` as a Path if kog may write it (absent, or a regular file that is not a symlink); else
    OutputPathError naming the path and what is there."""
    p = Path(path)
    if str(path) == "":
        raise OutputPathError("output path is empty")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return p
    except OSError as e:
        raise OutputPathError(f"cannot write {p}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputPathError(f"refusing to write {p}: it is a symlink (give the file it points to, or "
                              f"another path)")
    if not stat.S_ISREG(st.st_mode):
        raise OutputPathError(f"refusing to write {p}: it is {_kind(st.st_mode)}, not a regular file")
    return p


class InputPathError(UsageError):
    """An input kog will not open: not a regular file (a FIFO would block the read forever, a device node
    could read without end)."""


def check_input_file(path: str | os.PathLike, what: str = "input") -> Path:
    """`path` as a Path if it is a regular file (after symlinks); FileNotFoundError if nothing is there;
    else InputPathError naming what is there."""
    p = Path(path)
    st = os.stat(p)             # FileNotFoundError / PermissionError pass through to the caller's handling
    if not stat.S_ISREG(st.st_mode):
        raise InputPathError(f"{what} {p} is {_kind(st.st_mode)}, not a regular file")
    return p


def read_regular_text(path: str | os.PathLike, what: str = "input") -> str:
    """The text of a regular file, never blocking on a FIFO: opened non-blocking and checked on the open
    descriptor (so a file swapped in after a check is still refused); InputPathError otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputPathError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read().decode("utf-8")
    finally:
        os.close(fd)


def _make_parent(p: Path) -> None:
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputPathError(f"cannot write {p}: {p.parent} is not a folder") from None
    except OSError as e:
        raise OutputPathError(f"cannot write {p}: cannot create folder {p.parent}: {e.strerror}") from None
    if not p.parent.is_dir():
        raise OutputPathError(f"cannot write {p}: {p.parent} is not a folder")


def _fsync_dir(d: Path) -> None:
    try:
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:  # some file systems refuse fsync on a directory; the rename is still atomic
        pass


def _discard(tmp: str, p: Path, e: BaseException) -> None:
    """A write to `p` failed with `e`: remove its temp file; an OSError becomes one OutputPathError line."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    if isinstance(e, OSError) and not isinstance(e, OutputPathError):
        raise OutputPathError(f"cannot write {p}: {e.strerror or e}") from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically (see the module docstring); OutputPathError for a path kog must
    not replace or a folder it cannot write."""
    p = check_output_path(path)
    _make_parent(p)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as e:
        raise OutputPathError(f"cannot write {p}: {e.strerror} (folder {p.parent})") from None
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        check_output_path(p)      # something put at the path meanwhile is not replaced either
        os.replace(tmp, p)
    except BaseException as e:
        _discard(tmp, p, e)
        raise
    _fsync_dir(p.parent)
    return p


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike):
    """Yield a temp path beside `path` for a writer that wants a file name (safetensors.save_file); on a
    clean exit the file is fsynced, made 0644 and renamed onto `path` (checked as atomic_write_bytes does)."""
    p = check_output_path(path)
    _make_parent(p)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as e:
        raise OutputPathError(f"cannot write {p}: {e.strerror} (folder {p.parent})") from None
    os.close(fd)
    try:
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, FILE_MODE)
        check_output_path(p)
        os.replace(tmp, p)
    except BaseException as e:
        _discard(tmp, p, e)
        raise
    _fsync_dir(p.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1, default=None) -> Path:
    """`obj` as strict JSON (no NaN: kog.runstore's writers turn it to null first), atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, default=default, allow_nan=False) + "\n")


def keep_aside(path: str | os.PathLike) -> Path:
    """Rename a file that cannot be parsed to PATH.corrupt-<n> (the first n free) and return the new path."""
    p = Path(path)
    n = 1
    while True:
        q = p.with_name(f"{p.name}.corrupt-{n}")
        if not q.exists() and not q.is_symlink():
            break
        n += 1
    os.replace(p, q)
    return q


def atomic_write_table(path: str | os.PathLike, df) -> Path:
    """A pandas DataFrame as Parquet (or CSV for a .csv path), without its index, atomically."""
    import io
    buf = io.BytesIO()
    if Path(path).suffix == ".csv":
        buf.write(df.to_csv(index=False).encode("utf-8"))
    else:
        df.to_parquet(buf, index=False)
    return atomic_write_bytes(path, buf.getvalue())


def set_aside_corrupt(path: str | os.PathLike, why: str) -> Path | None:
    """keep_aside(path) and say so in one line on stderr; None when another process moved it first."""
    import sys
    try:
        q = keep_aside(path)
    except FileNotFoundError:
        return None
    print(f"kog: warning: {path} cannot be read ({why}); kept aside as {q}", file=sys.stderr)
    return q


@contextlib.contextmanager
def locked(path: str | os.PathLike):
    """An exclusive advisory lock on PATH.lock for a read-modify-write of `path` by several processes
    (two searches saving tuned.json at once must not lose each other's entries)."""
    p = Path(path)
    _make_parent(p)
    fd = os.open(p.with_name(p.name + ".lock"), os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
