"""Run store: every scan, bench, study and sweep writes one directory that the reports read.

    runs/<utc-time>-<device>-<kind>/
        meta.json        format marker, status, device inventory, versions, git commit, argv, dates
        <table>.parquet  one per table (pandas + pyarrow)
        <name>.json      small JSON documents (summary.json, ...)

    with RunStore().create("scan", device) as run:     # status "running" -> "complete"
        run.write_table("latency", df)                 # atomic: temp file + rename
        run.write_json("summary", {...})
    # An exception or Ctrl-C inside the block marks the run "incomplete" and keeps what finished;
    # a run killed with -9 stays "running" and readers report it as incomplete.

    run = open_run(path)      # refuses a corrupt or foreign directory with RunError
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

from kog.errors import UsageError
from kog.fsutil import atomic_write_bytes, atomic_write_table  # re-exported: the writers' one atomic write
from kog.provenance import git_commit, package_versions, source_digest

FORMAT = "kog-run"
FORMAT_VERSION = 1
KINDS = ("scan", "bench", "study", "sweep")
STATUSES = ("running", "complete", "incomplete", "failed")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RunError(UsageError):
    """A directory that is not a readable kog run."""


class NotARunError(RunError):
    """A folder with no meta.json: something else than a run (a run store lists it as nothing)."""


def default_root() -> Path:
    """$KOG_RUNS_DIR (an empty value counts as unset), else ./runs."""
    return Path(os.environ.get("KOG_RUNS_DIR") or "runs")


def _utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _jsonable(obj: Any) -> Any:
    """Plain JSON values: numpy scalars/arrays to Python, NaN/inf to null (strict JSON that a browser's
    JSON.parse reads), dataclasses to dicts, paths and anything else to str."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return _jsonable(obj.to_dict())
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays and scalars
        return _jsonable(obj.tolist())
    if hasattr(obj, "item") and callable(obj.item):
        return _jsonable(obj.item())
    return str(obj)


def atomic_write_json(path: Path, obj: Any) -> None:
    text = json.dumps(_jsonable(obj), indent=1, allow_nan=False)
    atomic_write_bytes(path, (text + "\n").encode())


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or name == "meta":
        raise ValueError(f"bad table/document name {name!r}: letters, digits, '_', '-', '.' only "
                         f"(not 'meta', no path separators)")
    return name


class Run:
    """One run directory. Create with RunStore.create (writing) or open_run (reading)."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = Path(path)
        self.meta = meta

    # ---- writing -------------------------------------------------------------------------
    def _save_meta(self) -> None:
        atomic_write_json(self.path / "meta.json", self.meta)

    def write_table(self, name: str, df) -> Path:
        """Store a pandas DataFrame as <name>.parquet, atomically; records it in meta['tables']."""
        _check_name(name)
        p = atomic_write_table(self.path / f"{name}.parquet", df)
        if name not in self.meta["tables"]:
            self.meta["tables"].append(name)
            self._save_meta()
        return p

    def write_json(self, name: str, obj: Any) -> Path:
        """Store a small JSON document as <name>.json, atomically (NaN becomes null)."""
        p = self.path / f"{_check_name(name)}.json"
        atomic_write_json(p, obj)
        docs = self.meta.setdefault("documents", [])
        if name not in docs:
            docs.append(name)
            self._save_meta()
        return p

    def note_error(self, where: str, message: str) -> None:
        """Record a failed part (a probe, a system) without failing the run."""
        self.meta.setdefault("errors", {})[where] = message
        self._save_meta()

    def finish(self, status: str = "complete") -> None:
        """Mark the run `status` ('complete', 'incomplete' or 'failed') and stamp the finish time."""
        if status not in STATUSES or status == "running":
            raise ValueError(f"finish status must be complete, incomplete or failed, not {status!r}")
        self.meta["status"] = status
        self.meta["finished"] = _utc_now().isoformat(timespec="seconds")
        self._save_meta()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            # Whatever stopped the block (an error, Ctrl-C, SIGTERM via cli_entry): keep the tables
            # already written and say the run is incomplete, with why.
            self.meta["interrupted_by"] = exc_type.__name__
            if exc is not None and str(exc):
                self.meta["interrupted_message"] = str(exc)[:500]
            self.finish("incomplete")
        elif self.meta.get("status") == "running":  # an explicit finish("failed") inside the block stays
            self.finish("complete")
        return False

    # ---- reading -------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def status(self) -> str:
        """'complete', 'incomplete' or 'failed'; a run still marked 'running' whose writer is gone
        (killed) reads as 'incomplete'."""
        s = self.meta.get("status", "incomplete")
        if s not in STATUSES:
            return "incomplete"
        if s == "running":
            pid, host = self.meta.get("pid"), self.meta.get("host")
            if (host == platform.node() and isinstance(pid, int) and _pid_alive(pid)
                    and self.meta.get("pid_start") in (None, _proc_start(pid))):
                return "running"
            return "incomplete"
        return s

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def tables(self) -> list[str]:
        return list(self.meta.get("tables", []))

    def has_table(self, name: str) -> bool:
        return (self.path / f"{name}.parquet").exists()

    def table(self, name: str):
        import pandas as pd
        p = self.path / f"{name}.parquet"
        if not p.exists():
            raise RunError(f"run {self.path} has no table '{name}' (tables: {', '.join(self.tables) or 'none'})")
        try:
            return pd.read_parquet(p)
        except Exception as e:
            raise RunError(f"table {p} is corrupt: {type(e).__name__}: {e}") from None

    def json(self, name: str) -> Any:
        p = self.path / f"{name}.json"
        if not p.exists():
            raise RunError(f"run {self.path} has no {name}.json")
        try:
            return json.loads(p.read_text())
        except Exception as e:
            raise RunError(f"{p} is corrupt: {e}") from None

    def has_json(self, name: str) -> bool:
        return (self.path / f"{name}.json").exists()

    def corrupt_files(self) -> dict[str, str]:
        """{file name: why} for each table or JSON document of this run that is there but cannot be read
        (a truncated Parquet file, JSON cut short): a reader reports these as corrupt, not as missing.
        Parquet files are checked by their footer (cheap); JSON documents are parsed."""
        bad: dict[str, str] = {}
        for p in sorted(self.path.glob("*.parquet")):
            try:
                import pyarrow.parquet as pq
                pq.read_metadata(p)
            except Exception as e:  # noqa: BLE001 - whatever pyarrow says, the file cannot be read
                bad[p.name] = f"{type(e).__name__}: {str(e)[:200]}"
        for p in sorted(self.path.glob("*.json")):
            if p.name == "meta.json":
                continue
            try:
                json.loads(p.read_text())
            except Exception as e:  # noqa: BLE001
                bad[p.name] = f"{type(e).__name__}: {str(e)[:200]}"
        return bad

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, kind={self.meta.get('kind')!r}, status={self.status!r})"


def _proc_start(pid: int) -> int | None:
    """Start time of process `pid` in clock ticks since boot (Linux), to tell a reused pid from the writer."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except Exception:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class RunStore:
    """The runs/ directory (KOG_RUNS_DIR overrides the default ./runs)."""

    def __init__(self, root: str | os.PathLike | None = None):
        if root is not None and str(root) == "":      # Path("") is "." : the runs would land in the cwd
            raise RunError("the run store path is empty (--runs-dir ''): give a folder")
        self.from_env = root is None and bool(os.environ.get("KOG_RUNS_DIR"))
        self.root = Path(root) if root is not None else default_root()

    def _where(self) -> str:
        return f"{self.root} (KOG_RUNS_DIR)" if self.from_env else str(self.root)

    def ensure_root(self) -> Path:
        """The root, created if absent; RunError (one line) when it is a file or cannot be created."""
        if self.root.exists() and not self.root.is_dir():
            raise RunError(f"the run store {self._where()} is not a folder")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunError(f"cannot create the run store {self._where()}: {e.strerror or e}") from None
        return self.root

    def create(self, kind: str, device=None, argv: list[str] | None = None,
               extra: dict[str, Any] | None = None) -> Run:
        """Start a run of `kind` for `device`: an inventory with to_dict() and slug (kog.probe.device.DeviceInfo),
        a dict, or None for no GPU. The store takes it as data, so the core needs no device layer."""
        if kind not in KINDS:
            raise ValueError(f"run kind must be one of {KINDS}, not {kind!r}")
        dev = device.to_dict() if hasattr(device, "to_dict") else device
        slug = device.slug if hasattr(device, "slug") else (
            _slug(dev.get("name", "gpu")) if isinstance(dev, dict) else "nodevice")
        now = _utc_now()
        base = f"{now:%Y%m%dT%H%M%SZ}-{slug}-{kind}"
        self.ensure_root()
        path, i = self.root / base, 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                i += 1
                path = self.root / f"{base}-{i}"
            except OSError as e:
                raise RunError(f"cannot create a run folder in {self._where()}: {e.strerror or e}") from None
        meta = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "status": "running",
            "started": now.isoformat(timespec="seconds"), "finished": None,
            "argv": list(sys.argv if argv is None else argv), "host": platform.node(), "pid": os.getpid(),
            "pid_start": _proc_start(os.getpid()),
            "git_commit": git_commit(), "source_digest": source_digest(), "versions": package_versions(),
            "device": dev,
            "tables": [], **(extra or {}),
        }
        run = Run(path, meta)
        run._save_meta()
        return run

    def list(self, kind: str | None = None, problems: list | None = None) -> list[Run]:
        """Every readable run under the root, oldest first. Folders that are not runs are skipped; a run
        folder that cannot be read (corrupt meta.json, no permission) is skipped too, and, given
        `problems`, appended to it as (path, reason) so the caller can name it."""
        if self.root.exists() and not self.root.is_dir():
            raise RunError(f"the run store {self._where()} is not a folder")
        if not self.root.is_dir():
            return []
        runs = []
        try:
            children = sorted(self.root.iterdir())
        except OSError as e:
            raise RunError(f"cannot list the run store {self.root}: {e.strerror}") from None
        for p in children:
            try:
                if not p.is_dir() or p.name.startswith("."):
                    continue
                r = open_run(p)
            except NotARunError:
                continue
            except (RunError, OSError) as e:
                if problems is not None:
                    problems.append((p, str(e)))
                continue
            if kind is None or r.kind == kind:
                runs.append(r)
        return runs

    def latest(self, kind: str, device_name: str | None = None, complete_only: bool = True) -> Run | None:
        for r in reversed(self.list(kind)):
            if complete_only and r.status != "complete":
                continue
            if device_name and (r.meta.get("device") or {}).get("name") != device_name:
                continue
            return r
        return None


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(s).lower()).strip("-") or "gpu"


def open_run(path: str | os.PathLike) -> Run:
    """Open a run directory for reading; RunError (one clear line) if it is not a kog run or cannot be read."""
    p = Path(path)
    try:
        return _open_run(p)
    except OSError as e:          # no permission, an I/O error: one line, never a traceback
        raise RunError(f"cannot read run {p}: {e.strerror or e}") from None


def _open_run(p: Path) -> Run:
    import stat
    if not p.exists():
        raise RunError(f"no such run directory: {p}")
    if not p.is_dir():
        raise RunError(f"not a run directory (a file): {p}")
    mp = p / "meta.json"
    if not mp.exists():
        hint = " (it looks like a run store: list it with `kogprobe runs --runs-dir`)" if any(
            (c / "meta.json").exists() for c in p.iterdir() if c.is_dir()) else ""
        raise NotARunError(f"not a kog run: {p} has no meta.json{hint}")
    if not stat.S_ISREG(os.stat(mp).st_mode):      # a FIFO or device would block or never end
        raise RunError(f"corrupt run: {mp} is not a regular file")
    try:
        meta = json.loads(mp.read_text())
    except Exception as e:
        raise RunError(f"corrupt run: {mp} is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RunError(f"not a kog run: {mp} lacks the '{FORMAT}' format marker")
    version = meta.get("format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunError(f"corrupt run: {mp} has a malformed format_version {version!r}")
    if version > FORMAT_VERSION:
        raise RunError(f"run {p} was written by a newer kog (format {version})")
    if not isinstance(meta.get("kind"), str) or meta.get("kind") not in KINDS:
        raise RunError(f"corrupt run: {mp} has unknown kind {meta.get('kind')!r}")
    tables = meta.get("tables", [])
    if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
        raise RunError(f"corrupt run: {mp} has a malformed 'tables' list")
    if meta.get("device") is not None and not isinstance(meta["device"], dict):
        raise RunError(f"corrupt run: {mp} has a malformed 'device' entry")
    meta.setdefault("tables", [])
    return Run(p, meta)
