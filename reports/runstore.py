"""Run store: every scan, bench and study writes one directory that the reports read.

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

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kog.probe.errors import UsageError

FORMAT = "kog-run"
FORMAT_VERSION = 1
KINDS = ("scan", "bench", "study", "sweep")


class RunError(UsageError):
    """A directory that is not a readable kog run."""


def default_root() -> Path:
    return Path(os.environ.get("KOG_RUNS_DIR", "runs"))


def _utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a reader never sees a half-written file (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, default=str, sort_keys=False) + "\n").encode())


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit of the kog source tree ("<sha>-dirty" with uncommitted changes), None outside git."""
    here = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return None


def package_versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("kog", "torch", "triton", "optuna", "pandas", "pyarrow", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    try:
        import torch
        out["cuda"] = torch.version.cuda
        out["hip"] = getattr(torch.version, "hip", None)
    except Exception:
        pass
    return out


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
        import io
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        p = self.path / f"{name}.parquet"
        atomic_write_bytes(p, buf.getvalue())
        if name not in self.meta["tables"]:
            self.meta["tables"].append(name)
            self._save_meta()
        return p

    def write_json(self, name: str, obj: Any) -> Path:
        p = self.path / f"{name}.json"
        atomic_write_json(p, obj)
        return p

    def note_error(self, where: str, message: str) -> None:
        """Record a failed part (a probe, a system) without failing the run."""
        self.meta.setdefault("errors", {})[where] = message
        self._save_meta()

    def finish(self, status: str = "complete") -> None:
        self.meta["status"] = status
        self.meta["finished"] = _utc_now().isoformat(timespec="seconds")
        self._save_meta()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish("complete")
        else:
            self.meta["interrupted_by"] = exc_type.__name__
            self.finish("incomplete")
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
        if s == "running":
            pid, host = self.meta.get("pid"), self.meta.get("host")
            if host == platform.node() and isinstance(pid, int) and _pid_alive(pid):
                return "running"
            return "incomplete"
        return s

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

    @property
    def device(self):
        from kog.probe.device import DeviceInfo
        d = self.meta.get("device")
        return DeviceInfo.from_dict(d) if d else None

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, kind={self.meta.get('kind')!r}, status={self.status!r})"


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
        self.root = Path(root) if root is not None else default_root()

    def create(self, kind: str, device=None, argv: list[str] | None = None,
               extra: dict[str, Any] | None = None) -> Run:
        """Start a run of `kind` for `device` (a DeviceInfo, a dict, or None for no GPU)."""
        if kind not in KINDS:
            raise ValueError(f"run kind must be one of {KINDS}, not {kind!r}")
        dev = device.to_dict() if hasattr(device, "to_dict") else device
        slug = device.slug if hasattr(device, "slug") else (
            _slug(dev.get("name", "gpu")) if isinstance(dev, dict) else "nodevice")
        now = _utc_now()
        base = f"{now:%Y%m%dT%H%M%SZ}-{slug}-{kind}"
        self.root.mkdir(parents=True, exist_ok=True)
        path, i = self.root / base, 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                i += 1
                path = self.root / f"{base}-{i}"
        meta = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "status": "running",
            "started": now.isoformat(timespec="seconds"), "finished": None,
            "argv": list(sys.argv if argv is None else argv), "host": platform.node(), "pid": os.getpid(),
            "git_commit": git_commit(), "versions": package_versions(), "device": dev,
            "tables": [], **(extra or {}),
        }
        run = Run(path, meta)
        run._save_meta()
        return run

    def list(self, kind: str | None = None) -> list[Run]:
        """Every readable run under the root, oldest first; unreadable directories are skipped."""
        if not self.root.is_dir():
            return []
        runs = []
        for p in sorted(self.root.iterdir()):
            if not p.is_dir():
                continue
            try:
                r = open_run(p)
            except RunError:
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
    import re
    return re.sub(r"[^a-z0-9]+", "-", str(s).lower()).strip("-") or "gpu"


def open_run(path: str | os.PathLike) -> Run:
    """Open a run directory for reading; RunError (one clear line) if it is not a kog run."""
    p = Path(path)
    if not p.exists():
        raise RunError(f"no such run directory: {p}")
    if not p.is_dir():
        raise RunError(f"not a run directory (a file): {p}")
    mp = p / "meta.json"
    if not mp.exists():
        raise RunError(f"not a kog run: {p} has no meta.json")
    try:
        meta = json.loads(mp.read_text())
    except Exception as e:
        raise RunError(f"corrupt run: {mp} is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RunError(f"not a kog run: {mp} lacks the '{FORMAT}' format marker")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise RunError(f"run {p} was written by a newer kog (format {meta.get('format_version')})")
    if meta.get("kind") not in KINDS:
        raise RunError(f"corrupt run: {mp} has unknown kind {meta.get('kind')!r}")
    return Run(p, meta)
