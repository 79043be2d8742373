"""`kogtune search`: an Optuna study over EngineConfig, crash-proof, resumable and distributable.

Storage: an Optuna storage URL. Default `sqlite:///<runs dir>/kog-studies.db` (one stable file, so running
`kogtune search` again finds the study and resumes: --trials is the study's total, completed trials are
kept; configs the constraints refuse before any launch do not count toward it, up to REFUSED_FREE per trial). A RUNNING trial left by a dead search process is marked FAILED (with 'fail_reason') and its config
re-queued once: at start-up for processes of this host whose pid is gone, and through Optuna's heartbeat
(grace period) for other hosts. Several hosts share one study through PostgreSQL
(`--storage postgresql://...`). --workers N runs N worker processes (worker i sees GPU i only).
Every trial runs isolated from the study (kog.tune.isolation), in one warm worker process per GPU that is
replaced after any failure that may have poisoned it. On the GPU the trials are asked a few at a time and
their kernels compile in parallel processes while the previous few are measured (optimize_ahead).

Order of trials in a new study: the engine default, its valid one-knob neighbors and random configs up to 8
(initial_design), then a local search from each new best (climb), then the sampler.

Tensor parallelism (--tp 1,2,4, --exchange-rows, --gpus; kog.tune.space's docstring): the degrees must be
powers of two <= 8 and, on the GPU, at most torch.cuda.device_count() (UsageError before the study starts);
under --backend sim the simulated host has --gpus GPUs (default 8). A TP trial uses GPUs 0..G-1 of its
worker, so --tp > 1 runs with one worker; its kernels compile on its first launch (not ahead). The tuned-config
store keeps single-GPU configs only: when a TP trial is best, the best degree-1 trial is stored as the engine
default and the TP best is reported beside it (summary 'best_tp', study user attr 'best_tp').
"""
from __future__ import annotations

import inspect
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kog.errors import UsageError
from kog.tune.objective import BENCH_PROTOCOL, bench_max_seq

HEARTBEAT_S, GRACE_S = 20, 60


def quiet_optuna() -> None:
    """Experimental-feature notices (heartbeat, group) are not the user's concern."""
    import warnings
    import optuna
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
    # optimize_ahead keeps the heartbeat itself (ask/tell), which Optuna warns about
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    # a failed trial is reported by kog with its reason; Optuna's per-trial tracebacks would bury it
    optuna.logging.set_verbosity(optuna.logging.ERROR)


# ---- storage -------------------------------------------------------------------------------------
def default_storage(runs_dir: str | os.PathLike | None) -> str:
    """The study database beside the runs: the same folder the run store writes (RunStore's root)."""
    from kog.runstore import RunStore
    root = RunStore(runs_dir).ensure_root()
    return f"sqlite:///{(root / 'kog-studies.db').resolve()}"


def absolute_storage(url: str) -> str:
    """The storage URL with a relative sqlite path made absolute (against the current folder), so the same
    study is found from wherever the search is resumed. Anything else is left for open_storage to judge."""
    if url.startswith("sqlite:///"):
        rest = url[len("sqlite:///"):]
        if rest and rest != ":memory:" and not rest.startswith("/"):
            return f"sqlite:///{Path(rest).expanduser().resolve()}"
    return url


def dashboard_command(url: str) -> str:
    """The optuna-dashboard command that opens this storage (password hidden)."""
    import shlex
    return f"optuna-dashboard {shlex.quote(redact(url))}"


def redact(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url


def _stale_callback(study, trial) -> None:
    """Heartbeat found a trial whose worker stopped beating: say why, and run its config again once."""
    from optuna.storages import RetryFailedTrialCallback
    study._storage.set_trial_user_attr(trial._trial_id, "fail_reason",
                                       "worker died (heartbeat lost): config re-queued")
    RetryFailedTrialCallback(max_retry=1)(study, trial)


def open_storage(url: str):
    """RDBStorage with heartbeat, or UsageError (one line, exit 2) for a bad or unreachable URL."""
    import optuna
    quiet_optuna()
    from sqlalchemy.engine import make_url
    try:
        u = make_url(url)
    except Exception:
        raise UsageError(f"bad storage URL {url!r}: expected e.g. sqlite:///path.db or "
                         f"postgresql://user:pass@host/db") from None
    backend = u.get_backend_name()
    if backend not in ("sqlite", "postgresql", "mysql"):
        raise UsageError(f"bad storage URL {redact(url)}: unsupported database {backend!r} "
                         f"(use sqlite or postgresql)")
    if backend == "sqlite" and u.database and u.database != ":memory:":
        parent = Path(u.database).parent
        if not parent.is_dir():
            raise UsageError(f"bad storage URL {url}: directory {parent} does not exist")
    if backend == "postgresql" and u.drivername == "postgresql":
        # SQLAlchemy >= 2.1 defaults to psycopg 3; the test extra installs psycopg2-binary: use what is there
        import importlib.util
        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            url = u.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    kw: dict[str, Any] = {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S}
    params = inspect.signature(optuna.storages.RDBStorage.__init__).parameters
    kw["heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params
       else "failed_trial_callback"] = _stale_callback
    engine_kwargs = {"connect_args": {"timeout": 30}} if backend == "sqlite" else {
        "pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}
    try:
        import logging
        logging.getLogger("optuna").setLevel(logging.WARNING)
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **kw)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, ModuleNotFoundError):
            msg = f"the database driver is not installed ({e.name}); e.g. pip install psycopg2-binary"
        raise UsageError(f"cannot open storage {redact(url)}: {msg[:300]}") from None


# ---- samplers and pruner ---------------------------------------------------------------------------
def make_sampler(name: str, seed: int | None = None):
    import optuna
    quiet_optuna()
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                          n_startup_trials=5)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        for mod in ("torch", "scipy"):
            try:
                __import__(mod)
            except ImportError:
                raise UsageError(f"the GP sampler needs {mod}: pip install {mod} "
                                 f"(or use --sampler tpe)") from None
        return optuna.samplers.GPSampler(seed=seed)
    if name == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise UsageError("the CMA-ES sampler needs the cmaes package: pip install cmaes "
                             "(or use --sampler tpe)") from None
        import warnings
        warnings.filterwarnings("ignore", category=UserWarning, module="optuna")
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise UsageError(f"unknown sampler {name!r} (tpe, gp, cmaes, random)")


# How far a trial's short measurement may sit below the best completed trial's at the same step and still
# get its full measurement: a config's short and full tok/s differ by 0.3-2.6% (a 32- against a 128-token
# median), and the gains a search looks for are of that size, so only configs clearly behind are cut.
PRUNE_MARGIN = 0.05


def make_pruner(margin: float = PRUNE_MARGIN, n_startup_trials: int = 8):
    """Prune a config whose short measurement is more than `margin` below the best completed trial's
    (BehindBestPruner). Optuna's percentile pruners compare against the completed trials only, which are
    the survivors, so their bar rises with every trial: after the first dozen nothing near the best
    completed, and the best's one-knob neighbors were cut on noise."""
    return BehindBestPruner(margin, n_startup_trials)


class BehindBestPruner:
    """An optuna pruner (duck-typed: optuna calls prune(study, trial); kog imports optuna lazily), for a
    maximized objective: prune at a reported step when the trial's value there is below
    (1 - margin) x the highest value any completed trial reported at that step; never before
    n_startup_trials trials completed. A relative bar, so it does not rise as slow trials are pruned."""

    def __init__(self, margin: float = PRUNE_MARGIN, n_startup_trials: int = 8):
        self.margin, self.n_startup_trials = float(margin), int(n_startup_trials)

    def prune(self, study, trial) -> bool:
        from optuna.trial import TrialState
        step = trial.last_step
        if step is None:
            return False
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        best = [t.intermediate_values[step] for t in done if step in t.intermediate_values]
        if len(done) < self.n_startup_trials or not best:
            return False
        return trial.intermediate_values[step] < (1.0 - self.margin) * max(best)


# ---- the study -------------------------------------------------------------------------------------
@dataclass
class Setup:
    model_spec: str
    model: Any
    device_name: str
    device: Any           # DeviceInfo or None (sim)
    sms: int
    backend: str
    scan_path: str | None
    has_scan: bool
    study_name: str
    storage_url: str
    gpus: int = 1                                   # GPUs a trial may use (TP degrees above it are refused)
    tp_degrees: tuple[int, ...] = (1,)
    exchange_rows: tuple[int, ...] | None = None    # None: the space's default choices
    ring: bool = False                              # the device (or the simulated one) runs the weight ring

    def space(self):
        """build_space(model, has_scan) with this search's TP choices."""
        import dataclasses
        from kog.tune.space import build_space
        sp = build_space(self.model, self.has_scan, ring=self.ring)
        kw: dict[str, Any] = {"tp_degrees": tuple(self.tp_degrees)}
        if self.exchange_rows is not None:
            kw["exchange_rows"] = tuple(self.exchange_rows)
        return dataclasses.replace(sp, **kw)


def _slug(s: str) -> str:
    import re
    return re.sub(r"[^a-z0-9.]+", "-", s.lower()).strip("-")


def prepare(args) -> Setup:
    from kog.probe.scan import find_scan
    from kog.tune.scan_model import load_scan
    from kog.tune.space import resolve_model_config
    model = resolve_model_config(args.model)
    backend = args.backend
    if backend == "gpu":
        from kog.probe.device import require_gpu
        dev = require_gpu()
        scan_dir = find_scan(getattr(args, "scan", None), dev.name)
        name, sms = dev.name, dev.sms
        has_scan = scan_dir is not None
    else:
        dev = None
        scan_dir = find_scan(getattr(args, "scan", None))
        scan = load_scan(scan_dir)
        name, sms = scan.device_name, scan.sms
        has_scan = True   # the simulator's scan (or its synthetic stand-in) drives the topology mapping
    scan_path = str(scan_dir) if scan_dir else None
    tp, xr, gpus = _tp_args(args, backend)
    # a TP study has other parameters (and choice lists) than a single-GPU one: its own default name
    suffix = "" if len(tp) == 1 else "-tp" + "-".join(map(str, tp)) + (
        "" if xr is None else "-x" + "-".join(map(str, xr)))
    study = args.study or f"kog-{_slug(name)}-{_slug(model.name)}" + ("-sim" if backend == "sim" else "") + suffix
    storage = absolute_storage(args.storage) if args.storage else default_storage(args.runs_dir)
    from kog.tune.space import ring_capable
    ring = ring_capable(dev if dev is not None else scan_device(scan_dir))
    return Setup(args.model, model, name, dev, sms, backend, scan_path, has_scan, study, storage, gpus, tp, xr,
                 ring)


def scan_device(scan_dir):
    """The DeviceInfo a scan run recorded (the simulated device of a --backend sim search); with no scan,
    the H200 the simulator's synthetic scan stands for."""
    from kog.probe.device import DeviceInfo
    from kog.probe.device.fake import h200
    if scan_dir is not None:
        try:
            from kog.runstore import open_run
            dev = open_run(scan_dir).meta.get("device")
            if isinstance(dev, dict) and dev.get("name"):
                return DeviceInfo.from_dict(dev)
        except Exception:  # noqa: BLE001 - an unreadable scan: the simulator's own default device
            pass
    return h200()


def _tp_args(args, backend: str) -> tuple[tuple[int, ...], tuple[int, ...] | None, int]:
    """(TP degrees, exchange_rows choices or None, GPUs) from the arguments; UsageError (one line) for a
    degree this host (or the simulated one) cannot run, before any study is opened."""
    from kog.tune.space import MAX_TP, parse_exchange_rows, parse_tp_degrees
    tp = getattr(args, "tp_degrees", None) or parse_tp_degrees(getattr(args, "tp", None))
    text = getattr(args, "exchange_rows", None)
    xr = parse_exchange_rows(text) if text is not None else None     # None: the space's default choices
    want = getattr(args, "gpus", None)
    if want is not None and want < 1:
        raise UsageError(f"--gpus {want}: must be >= 1")
    if backend == "gpu":
        import torch
        have = torch.cuda.device_count()
        if want is not None and want > have:
            raise UsageError(f"--gpus {want}: this host has {have} visible GPU(s)")
        gpus = want or have
        where = f"this host has {have} visible GPU(s)" + (f" (--gpus {want})" if want else "")
    else:
        gpus = want or MAX_TP
        where = f"the simulated host has {gpus} GPU(s) (--gpus)"
    if max(tp) > gpus:
        raise UsageError(f"--tp {','.join(map(str, tp))}: tensor-parallel degree {max(tp)} needs {max(tp)} GPUs; "
                         f"{where}")
    if backend == "gpu" and max(tp) > 1 and getattr(args, "workers", 1) > 1:
        raise UsageError("--tp with a degree > 1 runs with --workers 1 (a TP trial uses GPUs 0..G-1)")
    return tuple(tp), (tuple(xr) if xr is not None else None), gpus


def study_attrs(s: Setup) -> dict[str, Any]:
    from kog.tune.store import shape_signature
    out = {"model": s.model.name, "model_shape": shape_signature(s.model), "dtype": s.model.dtype,
           "device": s.device_name, "backend": s.backend}
    if len(s.tp_degrees) > 1:          # recorded, not checked: a study without --tp keeps exactly its old attrs
        out["tp_degrees"] = list(s.tp_degrees)
    return out


def open_study(s: Setup, storage, sampler, pruner):
    """Create or load the study; refuse (exit 2) one that holds another model, device or backend."""
    import optuna
    try:
        study = optuna.load_study(study_name=s.study_name, storage=storage, sampler=sampler, pruner=pruner)
        existed = True
    except KeyError:
        existed = False
    if not existed:
        try:
            study = optuna.create_study(study_name=s.study_name, storage=storage, sampler=sampler,
                                        pruner=pruner, direction="maximize", load_if_exists=True)
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=s.study_name, storage=storage, sampler=sampler, pruner=pruner)
    _set_metric_names(study, s.backend)
    want = study_attrs(s)
    have = study.user_attrs
    if have.get("model_shape") is None:
        from kog.provenance import git_commit
        # git_commit: the kog the study started with, which kog.tune.promote's entry names
        for k, v in {**want, "git_commit": git_commit()}.items():
            study.set_user_attr(k, v)
        return study
    for k in ("model_shape", "dtype", "device", "backend"):
        if have.get(k) != want[k]:
            raise UsageError(f"study {s.study_name!r} holds trials of {have.get('model')} "
                             f"({have.get('dtype')}) on {have.get('device')} [{have.get('backend')}], not "
                             f"{want['model']} ({want['dtype']}) on {want['device']} [{want['backend']}]; "
                             f"pick another --study")
    return study


SEARCHER_ATTR = "kog:searcher:"       # study system attr per process that asks trials: "<host>:<pid>" -> start


def worker_tag() -> str:
    """How a trial names the process that runs it (user attr 'worker') and how that process registers."""
    return f"{platform.node()}:{os.getpid()}"


def register_searcher(study) -> None:
    """Record this process as one that asks trials of `study`, before it asks any: a later start can then
    tell that an unclaimed RUNNING trial's creator is gone when every registered searcher is (the ask and
    the claim are two writes; a process killed between them leaves a trial nobody owns)."""
    from kog.runstore import _proc_start
    study._storage.set_study_system_attr(study._study_id, SEARCHER_ATTR + worker_tag(),
                                         {"start": _proc_start(os.getpid())})


def _searcher_may_live(tag: str, start) -> bool:
    """False only for a registered searcher of this host whose process is gone (or whose pid was reused)."""
    from kog.runstore import _proc_start
    h, _, pid = tag.rpartition(":")
    if h != platform.node() or not pid.isdigit():
        return True                       # another host: its heartbeat answers for it
    if int(pid) == os.getpid():
        return True
    return _pid_alive(int(pid)) and (start is None or _proc_start(int(pid)) in (None, start))


def _live_searchers(study) -> int:
    attrs = study._storage.get_study_system_attrs(study._study_id)
    return sum(1 for k, v in attrs.items() if k.startswith(SEARCHER_ATTR) and _searcher_may_live(
        k[len(SEARCHER_ATTR):], (v or {}).get("start") if isinstance(v, dict) else None))


METRIC = "tok/s"


def _set_metric_names(study, backend: str) -> None:
    """Name the objective on the study, so Optuna's plots and optuna-dashboard label it (tok/s, or
    simulated tok/s for a --backend sim study)."""
    name = METRIC if backend == "gpu" else f"{METRIC} (simulated)"
    try:
        if study.metric_names != [name]:
            study.set_metric_names([name])
    except Exception:       # an Optuna without metric names: the plots say "Objective Value"
        pass


def fail_dead_local_trials(study) -> int:
    """RUNNING trials whose process is gone: FAIL with a reason + re-queue. Claimed ones (user attr 'worker')
    when their process of this host is dead; unclaimed ones (killed between ask and claim) at once when no
    registered searcher may still be alive, else after KOG_UNCLAIMED_GRACE_S (default 10 s). Every search
    calls this on start, and a running one between its trials, so none stays RUNNING forever."""
    import optuna
    from optuna.trial import TrialState
    import datetime as _dt
    host = platform.node()
    grace = float(os.environ.get("KOG_UNCLAIMED_GRACE_S", "10"))
    now = _dt.datetime.now()
    n = 0
    live = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker", "")
        if not w:
            age = (now - t.datetime_start).total_seconds() if t.datetime_start else float("inf")
            if age < grace:
                live = _live_searchers(study) if live is None else live
                if live:
                    continue
            why = "its search process died between creating and claiming it (unclaimed RUNNING trial)"
        else:
            h, _, pid = w.rpartition(":")
            if h != host or not pid.isdigit() or _pid_alive(int(pid)):
                continue
            why = f"worker {w} died (interrupted or killed): config re-queued"
        try:
            study._storage.set_trial_user_attr(t._trial_id, "fail_reason", why)
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except Exception:
            continue   # another process got there first
        if t.params and "retry_of" not in t.user_attrs:
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
        n += 1
    return n


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


COUNTED = None  # set lazily: states that count toward --trials


def _counted_states():
    from optuna.trial import TrialState
    return (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


REFUSED_FREE = 2    # refused configs that do not count toward --trials, per trial asked for


def is_refused(t) -> bool:
    """A trial whose config the constraints refused before any launch (kog.tune.objective: fail_reason
    "invalid: ..."): it cost no GPU time."""
    from optuna.trial import TrialState
    return t.state == TrialState.PRUNED and str(t.user_attrs.get("fail_reason", "")).startswith("invalid:")


def finished_count(study, total: int | None = None) -> int:
    """Finished trials that count toward a search of `total` trials: refused configs (is_refused; many where
    the space offers ring slots the shared memory cannot hold) do not, up to REFUSED_FREE x total of them,
    so a space of nothing but refusals still ends. Without total: every finished trial."""
    ts = study.get_trials(deepcopy=False, states=_counted_states())
    if not total:
        return len(ts)
    return len(ts) - min(sum(1 for t in ts if is_refused(t)), REFUSED_FREE * total)


class _StopWhenCounted:
    """Optuna callback: stop once the study counts `total` trials (finished_count), whichever worker ran them."""

    def __init__(self, total: int):
        self.total = total

    def __call__(self, study, trial) -> None:
        fail_dead_local_trials(study)      # another search of this study killed meanwhile: its trials
        if finished_count(study, self.total) >= self.total and not waiting_count(study):
            study.stop()


def waiting_count(study) -> int:
    """Queued trials (the initial design, configs re-queued from a dead or interrupted search): a search runs
    them even past --trials, so none waits forever."""
    from optuna.trial import TrialState
    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


CLIMBED_ATTR = "kog:climbed"          # study system attr: {trial number: "dir" | "scan" | "done"}: how far a best
CLIMB_STEP = 8                        # trials one climb queues at most (AHEAD's batch): a new best redirects sooner


def climb(study, s: Setup, total: int) -> int:
    """The local search between the initial design and the sampler. Once nothing is queued, from the best
    completed trial: first the moves that improved before (a knob that beat its parent, one more choice the
    same way), then, if the best is still the best after those, its untried valid neighbors (Space.neighbors),
    CLIMB_STEP at a time so that a new best found among them is climbed from next; at most what --trials
    leaves. The search so walks from the engine default while a step improves, and the sampler takes over
    when the best's neighbors are all tried. Returns how many trials were queued (each with user attr
    climb_from: the trial it steps from)."""
    from optuna.trial import TrialState
    from kog.tune.space import residency_fn
    if waiting_count(study):
        return 0
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    room = total - finished_count(study, total) - _running_count(study)
    if not done or room <= 0:
        return 0
    best = max(done, key=lambda t: t.value)
    attrs = study._storage.get_study_system_attrs(study._study_id)
    state = dict(attrs.get(CLIMBED_ATTR) or {})
    how = state.get(str(best.number))
    if how == "done":
        return 0
    space, maxc = s.space(), residency_fn(s.backend)
    tried = {json.dumps(space.replay(t.system_attrs.get("fixed_params", t.params))[1], sort_keys=True)
             for t in study.get_trials(deepcopy=False)}

    def untried(cands):
        for p in cands:
            key = json.dumps(p, sort_keys=True)
            if key not in tried and _feasible(space.replay(p)[0], p, s, maxc):
                tried.add(key)
                yield p

    picked = list(untried(_improving_moves(space, done, best))) if how is None else []
    how = "dir" if picked else "scan"
    if not picked:
        picked = [p for _, p in zip(range(min(CLIMB_STEP, room)), untried(space.neighbors(best.params)))]
        if not picked:
            how = "done"
    state[str(best.number)] = how
    study._storage.set_study_system_attr(study._study_id, CLIMBED_ATTR, state)
    for p in picked[:room]:
        study.enqueue_trial(p, user_attrs={"climb_from": best.number}, skip_if_exists=True)
    return min(len(picked), room)


def _improving_moves(space, done, best) -> list[dict[str, Any]]:
    """The best's params with one knob moved one more numeric choice the way it moved in a trial that beat its
    parent (its climb_from, or the engine default for the initial design's neighbors)."""
    from kog.tune.space import ordered
    by_number = {t.number: t for t in done}
    default = next((t for t in done if t.user_attrs.get("baseline")), None)
    dirs: dict[str, int] = {}
    for t in done:
        parent = by_number.get(t.user_attrs.get("climb_from", default.number if default else -1))
        if parent is None or parent is t or t.value <= parent.value:
            continue
        _, a, choices = space.replay(parent.params)
        b = space.replay(t.params)[1]
        moved = [k for k in a if k in b and a[k] != b[k]]
        if len(moved) == 1 and ordered(choices[moved[0]]):
            k = moved[0]
            dirs.setdefault(k, 1 if choices[k].index(b[k]) > choices[k].index(a[k]) else -1)
    _, base, choices = space.replay(best.params)
    out = []
    for k, d in dirs.items():
        if k in base and base[k] in choices[k] and 0 <= choices[k].index(base[k]) + d < len(choices[k]):
            out.append(space.replay({**base, k: choices[k][choices[k].index(base[k]) + d]})[1])
    return out


class _Climb:
    """climb() as an Optuna callback (the search without compiles ahead)."""

    def __init__(self, s: Setup, total: int):
        self.s, self.total = s, total

    def __call__(self, study, trial) -> None:
        climb(study, self.s, self.total)


def fail_trials_of(study, tag: str, reason: str) -> int:
    """FAIL (with `reason`) and re-queue the RUNNING trials claimed by worker `tag`: what an interrupted
    search does on its way out, so its trials are not left RUNNING."""
    from optuna.trial import TrialState
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.user_attrs.get("worker") != tag:
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except Exception:
            continue
        if t.params and "retry_of" not in t.user_attrs:
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
        n += 1
    return n


class _Tagged:
    """Wraps the objective: tags each trial with its worker so a dead worker's trials can be found."""

    def __init__(self, obj):
        self.obj = obj
        self.tag = worker_tag()

    def __call__(self, trial):
        trial.set_user_attr("worker", self.tag)
        return self.obj(trial)

    def prepare(self, trial):
        trial.set_user_attr("worker", self.tag)
        return self.obj.prepare(trial)

    def execute(self, trial, payload):
        return self.obj.execute(trial, payload)


def run_worker(s: Setup, total_trials: int, timeout: float, sampler_name: str, seed: int | None,
               worker_index: int = 0, gpu_env: bool = False, target: str | None = None,
               payload_extra: dict[str, Any] | None = None, ahead: int | None = None,
               compile_processes: int | None = None, compile_target: str | None = None,
               deadline: float | None = None) -> None:
    """One worker: optimize until the study holds `total_trials` finished trials.

    Trials run in one warm worker process (isolation.WarmWorker; restarted after a crash, hang, OOM or
    CUDA error). With ahead > 0 (default for --backend gpu: AHEAD) the trials are asked `ahead` at a time
    and the kernels of the next batch compile in parallel processes while this batch is measured
    (optimize_ahead); ahead 0 is Optuna's plain one-trial-at-a-time optimize(). Past `deadline`
    (a Deadline or a time.time() value; optimize_ahead only) no new trial is asked: the search ends with fewer trials."""
    from kog.tune.isolation import WarmWorker
    storage = open_storage(s.storage_url)
    wseed = None if seed is None else seed + worker_index
    study = open_study(s, storage, make_sampler(sampler_name, wseed), make_pruner())
    left = total_trials - finished_count(study, total_trials)
    waiting = waiting_count(study)
    if left <= 0 and not waiting:
        return
    register_searcher(study)
    env = {"CUDA_VISIBLE_DEVICES": str(worker_index)} if gpu_env else None
    runner = WarmWorker(env, f"measure-{worker_index}")
    try:
        _optimize(s, study, ctx_args=(env, runner, timeout, target, payload_extra), total_trials=total_trials,
                  left=max(left, 0) + waiting, worker_index=worker_index, ahead=ahead,
                  compile_processes=compile_processes, compile_target=compile_target, deadline=deadline)
    except BaseException as e:
        # SIGTERM, Ctrl-C or an error: the trial this process was running must not stay RUNNING
        runner.kill()
        fail_trials_of(study, worker_tag(), f"search interrupted ({_why(e)}): config re-queued")
        raise
    finally:
        runner.close()


def _why(e: BaseException) -> str:
    from kog.errors import Terminated
    if isinstance(e, Terminated):
        return "SIGTERM"
    if isinstance(e, KeyboardInterrupt):
        return "SIGINT / Ctrl-C"
    return f"{type(e).__name__}: {e}"[:200]


def _optimize(s: Setup, study, ctx_args, total_trials: int, left: int, worker_index: int, ahead, compile_processes,
              compile_target, deadline) -> None:
    from kog.tune.isolation import WorkerPool
    from kog.tune.objective import COMPILE_TARGET, Objective, TrialContext, TrialFailed
    env, runner, timeout, target, payload_extra = ctx_args
    ctx = TrialContext(s.model_spec, s.model, s.sms, s.backend, timeout, s.scan_path,
                       s.space(), payload_extra or {}, env, target, runner, gpus=s.gpus)
    if ahead is None:
        ahead = AHEAD if s.backend == "gpu" else 0
    ctarget = compile_target or (COMPILE_TARGET if s.backend == "gpu" else None)
    if ahead > 0:
        pool = None
        if ctarget is not None:
            n = compile_processes or default_compile_processes(s.model)
            pool = WorkerPool(n, [env] * n, f"compile-{worker_index}")
        try:
            optimize_ahead(study, _Tagged(Objective(ctx)), total_trials, ahead, pool, ctarget,
                           s.model_spec, payload_extra or {}, timeout=max(timeout, 600.0),
                           deadline=deadline, climb=lambda: climb(study, s, total_trials))
        finally:
            if pool is not None:
                pool.close()
    else:
        # refused configs do not count: at most left + REFUSED_FREE x total asks, stopped when counted
        study.optimize(_Tagged(Objective(ctx)), n_trials=left + REFUSED_FREE * total_trials,
                       catch=(TrialFailed,), callbacks=[_Climb(s, total_trials), _StopWhenCounted(total_trials)],
                       gc_after_trial=False, show_progress_bar=False)


AHEAD = 8        # trials asked (and compiled) ahead per batch in a gpu search


def default_compile_processes(model=None) -> int:
    """Parallel compile processes: the CPU cores less two (the measuring worker, the study process), and,
    given the model (a ModelConfig), no more than GPU 0's free memory holds once the measuring worker's
    engine has its ~4x the weights at its peak (weights, ring packing, reference). A compile process holds
    a CUDA context and an engine's small buffers, no weights (objective.compile_state: placeholders)."""
    n = max(1, min(16, (os.cpu_count() or 3) - 2))
    free = gpu_free_bytes()
    if model is not None and free is not None:
        per_process = 1 << 30                              # a context, the KV cache and the engine's buffers
        n = max(1, min(n, int((free - 4 * model.num_params() * 2) // per_process)))
    return n


def gpu_free_bytes(index: int = 0) -> int | None:
    """Free memory of GPU `index` per NVML (no CUDA context in the calling process), None without NVML."""
    from kog.probe.device.nvidia import _nvml
    nv = _nvml()
    if nv is None:
        return None
    try:
        return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index)).free)
    except Exception:
        return None


def _running_count(study) -> int:
    from optuna.trial import TrialState
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def optimize_ahead(study, objective, total: int, ahead: int, pool, compile_target: str | None,
                   model_spec: str, payload_extra: dict[str, Any], timeout: float = 600.0,
                   deadline: float | None = None, climb: Callable[[], int] | None = None) -> None:
    """study.optimize with compilation ahead: ask `ahead` trials, compile their distinct kernels in the
    pool (compile only, nothing runs on the GPU), and while batch i is measured one by one in the warm
    worker, batch i+1 is asked (constant-liar TPE sees batch i as running) and compiled. Stops when the
    study holds `total` finished trials (counting other processes' running ones, so none overshoots).
    Optuna's heartbeat is kept for every asked trial, so a dead process's trials are failed and re-queued
    exactly as with optimize(). Past `deadline` (a kog.tune.deadline.Deadline, or a time.time() value) no trial
    starts; asked ones are failed with a reason and re-queued (a later run measures them). `climb` (search.climb)
    runs before each ask."""
    import threading
    from concurrent.futures import wait
    from kog.tune.deadline import as_deadline
    deadline = as_deadline(deadline)
    import optuna
    from optuna.trial import TrialState
    from kog.tune.objective import TrialFailed
    storage = study._storage
    inflight: dict[int, Any] = {}
    lock = threading.Lock()
    stop = threading.Event()
    beat = hasattr(storage, "record_heartbeat") and storage.get_heartbeat_interval() is not None

    def heartbeat() -> None:
        while not stop.wait(HEARTBEAT_S / 2):
            with lock:
                ids = list(inflight)
            for tid in ids:
                try:
                    storage.record_heartbeat(tid)
                except Exception:
                    pass

    if beat:
        threading.Thread(target=heartbeat, daemon=True).start()
    compiled: set = set()

    def tell(t, value=None, state=None) -> None:
        try:
            if state is None:
                study.tell(t, value)
            else:
                study.tell(t, state=state)
        except (RuntimeError, ValueError) as e:   # finished meanwhile (e.g. failed as stale by another host)
            print(f"kogtune: trial {t.number}: {e}", file=sys.stderr)
        finally:
            with lock:
                inflight.pop(t._trial_id, None)

    def ask_batch() -> list[tuple[Any, dict[str, Any]]]:
        if deadline is not None and deadline.passed():
            return []
        fail_dead_local_trials(study)     # another search of this study killed meanwhile: its trials
        if climb is not None:             # the local search's next step, once the queue is empty
            climb()
        n = min(ahead, max(total - finished_count(study, total) - _running_count(study), waiting_count(study)))
        batch = []
        for _ in range(max(0, n)):
            t = study.ask()
            with lock:
                inflight[t._trial_id] = t
            if beat:
                storage.record_heartbeat(t._trial_id)
            try:
                p = objective.prepare(t)
            except optuna.TrialPruned:
                tell(t, state=TrialState.PRUNED)
                continue
            except TrialFailed:
                tell(t, state=TrialState.FAIL)
                continue
            except BaseException:
                tell(t, state=TrialState.FAIL)
                raise
            if isinstance(p, float):
                tell(t, p)
                continue
            batch.append((t, p))
        return batch

    def compile_batch(batch):
        if pool is None or compile_target is None or not batch:
            return []
        from kog.engine.engine_config import EngineConfig
        new = []
        for _, p in batch:                    # every new config (its variant may be new), grouped by kernel
            if (p.get("tp") or {}).get("G", 1) > 1:
                continue                      # TP: compiled by its trial (objective.precompile_one says why)
            k = json.dumps(p["config"], sort_keys=True)
            if k not in compiled:
                compiled.add(k)
                new.append(EngineConfig.from_dict(p["config"]))
        if not new:
            return []
        extra = {k: v for k, v in batch[0][1].items() if k not in ("model", "config")}
        return precompile(model_spec, new, timeout=timeout, payload_extra={**extra, **payload_extra},
                          pool=pool, on_done=lambda key, o: None, target=compile_target)

    try:
        batch = ask_batch()
        futs = compile_batch(batch)
        def past_deadline() -> bool:
            return deadline is not None and deadline.passed()

        while batch:
            # its kernels (a slow compile must not eat the budget: past the deadline nothing new starts)
            wait(futs, timeout=None if deadline is None else deadline.left())
            nxt = ask_batch()                 # ask before measuring: its kernels compile meanwhile
            nfuts = compile_batch(nxt)
            for t, p in batch:
                if past_deadline():
                    break                     # the rest are failed and re-queued below (finally)
                try:
                    tell(t, objective.execute(t, p))
                except optuna.TrialPruned:
                    tell(t, state=TrialState.PRUNED)
                except TrialFailed:
                    tell(t, state=TrialState.FAIL)
            if past_deadline():
                break
            batch, futs = nxt, nfuts
            if not batch and (finished_count(study, total) < total or waiting_count(study)) and \
                    _running_count(study) == 0:
                batch = ask_batch()           # trials retried by a heartbeat (re-queued) may remain
                futs = compile_batch(batch)
    finally:
        stop.set()
        with lock:
            left = list(inflight.values())
        for t in left:                        # interrupted: FAIL with a reason and re-queue, as a dead worker's
            try:
                storage.set_trial_user_attr(t._trial_id, "fail_reason", "search interrupted or out of time: "
                                            "config re-queued")
                study.tell(t, state=TrialState.FAIL)
                if t.params and "retry_of" not in t.user_attrs:
                    study.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
            except Exception:
                pass


def _worker_entry(s: Setup, total: int, timeout: float, sampler: str, seed, index: int, gpu_env: bool,
                  target, payload_extra, ahead=None, compile_processes=None, compile_target=None,
                  deadline=None, parent: int | None = None) -> None:
    """A --workers N search process. It dies with the search that started it (a kill -9 of the search
    would otherwise leave it finishing the study alone), and SIGTERM fails its running trial with a
    reason on the way out (run_worker), as Ctrl-C does."""
    import signal
    from kog.errors import Terminated, _raise_terminated
    from kog.tune.worker import die_with_parent
    die_with_parent(parent)
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        run_worker(s, total, timeout, sampler, seed, index, gpu_env, target, payload_extra, ahead,
                   compile_processes, compile_target, deadline)
    except (KeyboardInterrupt, Terminated):
        sys.exit(1)


# ---- compile ahead -------------------------------------------------------------------------------------
def kernel_key(cfg) -> tuple:
    """What decides the compiled kernel: EngineConfig.compile_key(), plus the register cap the NVIDIA
    launcher derives from ctas_per_sm x num_warps (maxnreg is a compile option, so ctas_per_sm 2, 3, 4
    are three kernels there even though compile_key() leaves ctas_per_sm out)."""
    regs = min(255, (65536 // (cfg.ctas_per_sm * cfg.num_warps * 32)) // 8 * 8)
    return tuple(cfg.compile_key()) + (regs,)


def precompile(model_spec: str, configs, processes: int | None = None, timeout: float = 600.0,
               payload_extra: dict[str, Any] | None = None, pool=None, on_done=None,
               envs: list[dict[str, str] | None] | None = None, target: str | None = None):
    """Compile the kernels of `configs`, one job per distinct kernel_key() in parallel warm worker processes
    (a pool sized to the CPU cores; compile only: kog.tune.objective.precompile_one runs no kernel). A job
    takes all configs of its key in order: configs that differ only in data (mapping, wait granularity)
    mostly reuse one compiled kernel, and the ones whose plan-derived int arguments need another Triton
    specialization get it here too, not in the middle of a measurement.

    Blocking (on_done None): returns {kernel_key: "ok" | reason}. With on_done(key, outcome): returns at
    once with the list of futures; on_done is called from the pool's threads as each key is compiled
    (record_sweep measures a key's configs as soon as their kernel is ready). Pass `pool` to reuse one.
    Keys are submitted in the order of their first config. `target` overrides the child function (tests)."""
    from kog.tune.isolation import WorkerPool
    from kog.tune.objective import COMPILE_TARGET
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for c in configs:
        group = by_key.setdefault(kernel_key(c), [])
        d = c.to_dict()
        if d not in group:
            group.append(d)
    own = pool is None
    if own:
        if processes is None:
            from kog.tune.space import resolve_model_config
            processes = default_compile_processes(resolve_model_config(model_spec))
        n = min(processes, max(1, len(by_key)))
        pool = WorkerPool(n, envs if envs else None, "compile")
    # one job per kernel: its configs in one worker, in order (a variant compiles once, then cache hits)
    jobs = [(k, target or COMPILE_TARGET, {"model": model_spec, **(payload_extra or {}), "config": g[0],
                                           "configs": g}) for k, g in by_key.items()]
    futs = pool.submit_all(jobs, timeout, on_done=on_done)
    if on_done is not None:
        return futs
    try:
        return {k: ("ok" if o.ok else o.reason) for k, o in (f.result() for f in futs)}
    finally:
        if own:
            pool.close()


def engine_default(backend: str, device_name: str, device, model):
    """What the engine runs on this device when no tuned config is stored (the search's baseline trial):
    on a device with the weight ring (measured, or simulated: the simulator models the engine as it runs),
    kog's own measured config for this GPU and shape (kog.tune.store.builtin_config), else the sm_90 rule
    (engine_config.sm90_default); elsewhere EngineConfig()."""
    from kog.engine.engine_config import EngineConfig, sm90_default
    from kog.tune.space import ring_capable
    from kog.tune.store import builtin_config
    if ring_capable(device):
        return builtin_config(device_name, model) or sm90_default(model)
    return EngineConfig()


def _is_default(s: Setup, params: dict[str, Any]) -> bool:
    """Whether `params` are the engine default's (initial_design puts it first when it is valid)."""
    from kog.tune.store import RETIRED_FIELDS
    d = engine_default(s.backend, s.device_name, s.device if s.device is not None else (
        scan_device(s.scan_path) if s.ring else None), s.model).to_dict()
    return all(d.get(k) == v for k, v in params.items() if k in d and k not in ("wait_timeout_s", *RETIRED_FIELDS))


def initial_design(s: Setup, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Distinct valid configs queued before the sampler takes over, and compiled ahead in parallel: the engine
    default first, then every valid config one knob away from it (Space.neighbors), then random ones up to
    `n` in all."""
    import optuna
    from kog.tune.space import Infeasible, check, residency_fn
    from kog.tune.store import RETIRED_FIELDS
    space = s.space()
    maxc = residency_fn(s.backend)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    d = engine_default(s.backend, s.device_name, s.device if s.device is not None else (
        scan_device(s.scan_path) if s.ring else None), s.model)
    try:
        check(d, s.model, s.sms, maxc)
        p = {k: v for k, v in d.to_dict().items() if k not in ("wait_timeout_s", *RETIRED_FIELDS)}
        if p["mode"] == "grid":
            p.pop("sync_rows")
        if len(space.tp_degrees) > 1:
            p["tp_degree"] = 1            # the engine default runs on one GPU
        # Space.neighbors gives each one-knob move once, none of them the default itself
        out += [p] + [q for q in space.neighbors(p) if _feasible(space.replay(q)[0], q, s, maxc)]
        seen.update(json.dumps(q, sort_keys=True) for q in out)
    except Infeasible:
        pass
    st = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        t = st.ask()
        if not _feasible(space.suggest(t), t.params, s, maxc):
            continue
        key = json.dumps(t.params, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(dict(t.params))
    return out


def _feasible(cfg, params: dict[str, Any], s: Setup, maxc) -> bool:
    """Whether `cfg` (what `params` suggest) with the params' tensor-parallel choices passes the constraints
    (no launch)."""
    from kog.tune.space import Infeasible, check, check_tp, tp_from_params
    try:
        check(cfg, s.model, s.sms, maxc)
        g, x = tp_from_params(params)
        check_tp(cfg, s.model, g, x, s.gpus, s.sms, maxc)
    except Infeasible:
        return False
    return True


# ---- the command ------------------------------------------------------------------------------------
def check_search_args(args) -> None:
    """One line (exit 2) for arguments no search can run with, before any study is opened."""
    import math
    from kog.runstore import RunStore
    if args.trials < 1:
        raise UsageError("--trials must be >= 1")
    if args.workers < 1:
        raise UsageError("--workers must be >= 1")
    if (getattr(args, "confirm_rounds", None) or 0) < 0:
        raise UsageError("--confirm-rounds must be >= 0")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout must be a number of seconds > 0, got {args.timeout:g} (every trial "
                         f"would be stored as a failed hang)")
    RunStore(args.runs_dir).ensure_root()     # the study and the run folder go to one place, or none


def cli_search(args) -> int:
    import multiprocessing as mp
    import optuna
    from optuna.trial import TrialState
    quiet_optuna()
    check_search_args(args)
    s = prepare(args)
    seed = getattr(args, "seed", None)
    storage = open_storage(s.storage_url)
    make_sampler(args.sampler, seed)      # a missing sampler dependency fails here, before any work
    study = open_study(s, storage, make_sampler(args.sampler, seed), make_pruner())
    revived = fail_dead_local_trials(study)
    before = finished_count(study)
    if before == 0 and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        design, default = initial_design(s, min(args.trials, 8), seed or 0)[:args.trials], None
        for p in design:
            # the engine default (queued first) is tagged: the report sets the best trial against it
            tag = {"baseline": "engine default"} if p is design[0] and _is_default(s, p) else None
            study.enqueue_trial(p, user_attrs=tag, skip_if_exists=True)
            default = default or (p if tag else None)
        if default is not None:
            study.set_user_attr("engine_default", default)
    if s.backend == "sim" and "simulator_error" not in study.user_attrs:
        from kog.tune.simulator import error_summary
        study.set_user_attr("simulator_error", error_summary())
    gpu_env = s.backend == "gpu" and args.workers > 1
    target = getattr(args, "target", None)
    extra = getattr(args, "payload_extra", None)
    # the first batch of each worker (the queued initial design) is compiled ahead by optimize_ahead
    ahead = getattr(args, "ahead", None)
    cproc = getattr(args, "compile_processes", None)
    if cproc is None and args.workers > 1:
        cproc = max(1, default_compile_processes(s.model) // args.workers)
    ctarget = getattr(args, "compile_target", None)
    deadline = getattr(args, "deadline", None)      # a Deadline or time.time() value: no trial starts after
    console_err = _console()
    console_err.print(f"study {s.study_name} in {redact(s.storage_url)}"
                      + (" [bold](SIMULATED: --backend sim)[/bold]" if s.backend == "sim" else ""),
                      highlight=False, soft_wrap=True)
    t0 = time.time()
    procs: list = []
    try:
        if args.workers == 1:
            _run_with_progress(s, args, study, seed, gpu_env, target, extra, console_err, ahead, cproc, ctarget,
                               deadline)
        else:
            ctx = mp.get_context("spawn")
            procs = [ctx.Process(target=_worker_entry, args=(s, args.trials, args.timeout, args.sampler, seed, i,
                                                               gpu_env, target, extra, ahead, cproc, ctarget,
                                                               deadline, os.getpid()),
                                 daemon=False)
                     for i in range(args.workers)]
            for p in procs:
                p.start()
            _progress_poll(study, args.trials, procs, console_err)
            for p in procs:
                p.join()
        rounds = getattr(args, "confirm_rounds", None)
        rounds = (CONFIRM_ROUNDS if s.backend == "gpu" else 0) if rounds is None else rounds
        if rounds > 0:
            console_err.print(f"confirming the best against the engine default: {rounds} alternating rounds",
                              highlight=False)
            confirm_best(s, study, rounds, args.timeout, target, extra)
    except BaseException as e:       # SIGTERM, Ctrl-C, an error: no worker goes on alone, the run is recorded
        _interrupted(s, args, study, procs, time.time() - t0, revived, e)
        raise
    return _finish(s, args, study, time.time() - t0, revived)


CONFIRM_ROUNDS = 3     # a GPU search's closing same-run measurements of its best and the engine default, each
CONFIRMATION = "confirmation"      # study user attr: what confirm_best measured
# the confirmation times `kogtune bench`'s protocol (its default prompt and new tokens, in the KV cache the bench
# builds for them: confirm_best), not the trials' shorter one: the gain an entry of the built-in table claims is
# then the one the bench measures
CONFIRM_PROTOCOL = dict(BENCH_PROTOCOL)


def completed_single_gpu(study) -> list:
    """The study's completed trials of one GPU that carry their config."""
    from optuna.trial import TrialState
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and int(t.params.get("tp_degree", 1)) == 1 and t.user_attrs.get("config")]


def default_trials(trials: list) -> list:
    """Those of `trials` the search queued as the engine default."""
    return [t for t in trials if t.user_attrs.get("baseline") == "engine default"]


def best_and_default(study) -> tuple[Any, Any] | None:
    """(best completed single-GPU trial, the engine-default trial), or None when either is missing."""
    done = completed_single_gpu(study)
    base = default_trials(done)
    if not done or not base:
        return None
    return max(done, key=lambda t: t.value), base[0]


def confirm_best(s: Setup, study, rounds: int, timeout: float, target: str | None = None,
                 payload_extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Measure the best single-GPU trial's config and the engine default's again, alternating, `rounds` times
    each in one warm worker, in the bench's protocol (CONFIRM_PROTOCOL, unless payload_extra sets its fields),
    and store the result as the study's CONFIRMATION attr (the gain kog.tune.promote claims). The best of many
    trials measured once each is biased up (it won partly by its own noise), and the trials time a shorter
    protocol than the bench. None when the study has no best or no engine-default trial; no measurement when
    the best is the default."""
    from statistics import median

    from kog.tune.isolation import WarmWorker
    from kog.tune.objective import TARGETS
    pair = best_and_default(study)
    if pair is None:
        return None
    best, default = pair
    protocol = {k: (payload_extra or {}).get(k, v) for k, v in CONFIRM_PROTOCOL.items()}
    # the cache the bench builds for that prompt and run, unless the search sets one
    protocol["max_seq"] = int((payload_extra or {}).get("max_seq", bench_max_seq(**protocol)))
    conf: dict[str, Any] = {"best_trial": best.number, "default_trial": default.number, "rounds": 0,
                            "protocol": protocol, "best_tok_per_s": [], "default_tok_per_s": [], "errors": []}
    if best.number != default.number:
        conf["rounds"] = rounds
        with WarmWorker(None, "confirm") as w:
            for _ in range(rounds):
                for name, t in (("default", default), ("best", best)):
                    payload = {"model": s.model_spec, "config": t.user_attrs["config"], "scan": s.scan_path,
                               **(payload_extra or {}), **protocol}
                    out = w.run(target or TARGETS[s.backend], payload, timeout)
                    if out.ok:
                        conf[f"{name}_tok_per_s"].append(float(out.value))
                    else:
                        conf["errors"].append(f"{name}: {out.reason}"[:300])
        b, d = conf["best_tok_per_s"], conf["default_tok_per_s"]
        if b and d:
            conf["gain"] = median(b) / median(d) - 1.0
    else:
        conf["gain"] = 0.0
    study.set_user_attr(CONFIRMATION, conf)
    return conf


def _confirmed_best(study, sb: dict[str, Any] | None) -> dict[str, Any] | None:
    """The single-GPU best to store: the engine default's trial instead where confirm_best measured the best
    no faster than it."""
    conf = study.user_attrs.get(CONFIRMATION) or {}
    if sb is None or conf.get("best_trial") != sb["number"] or conf.get("gain") is None or conf["gain"] > 0:
        return sb
    return _trial_brief(study.get_trials(deepcopy=False)[conf["default_trial"]])


def _trial_brief(t) -> dict[str, Any]:
    """A finished trial as the summary and the store see it."""
    return {"number": t.number, "tok_per_s": t.value, "params": t.params, "config": t.user_attrs.get("config"),
            "breakdown": t.user_attrs.get("breakdown")}


def _stop_workers(procs, grace_s: float = 10.0) -> None:
    """SIGTERM each search worker (it fails its running trial and exits), SIGKILL any still there after
    `grace_s`."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)


def _interrupted(s: Setup, args, study, procs, wall: float, revived: int, e: BaseException) -> None:
    """What an interrupted search leaves: its workers stopped, every trial it was running FAILED with the
    reason (and re-queued), and its run folder, marked incomplete. A second signal meanwhile is ignored."""
    import signal
    old = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            old[sig] = signal.signal(sig, signal.SIG_IGN)
        except ValueError:                   # not the main thread
            pass
    try:
        _stop_workers(procs)
        why = f"search interrupted ({_why(e)}): config re-queued"
        fail_trials_of(study, worker_tag(), why)
        fail_dead_local_trials(study)        # the workers' trials, if a worker was killed before it could
        _finish(s, args, study, wall, revived, interrupted=e)
    except Exception as err:  # noqa: BLE001 - the interruption is what the user must see
        print(f"kogtune: could not record the interrupted search: {type(err).__name__}: {err}", file=sys.stderr)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _console():
    from rich.console import Console
    return Console(stderr=True)


def _best_text(study) -> str:
    try:
        b = study.best_trial
        return f"best {b.value:.1f} tok/s (trial {b.number})"
    except ValueError:
        return "best -"


def _run_with_progress(s, args, study, seed, gpu_env, target, extra, console, ahead=None, cproc=None,
                       ctarget=None, deadline=None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("[bold]search"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, disable=not console.is_terminal) as prog:
        task = prog.add_task(_best_text(study), total=args.trials, completed=finished_count(study, args.trials))
        import threading
        stop = threading.Event()

        def poll():
            while not stop.wait(0.5):
                prog.update(task, completed=finished_count(study, args.trials), description=_best_text(study))

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        try:
            run_worker(s, args.trials, args.timeout, args.sampler, seed, 0, gpu_env, target, extra, ahead, cproc,
                       ctarget, deadline)
        finally:
            stop.set()
            th.join()
            prog.update(task, completed=finished_count(study, args.trials), description=_best_text(study))


def _progress_poll(study, total, procs, console) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("[bold]search"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, disable=not console.is_terminal) as prog:
        task = prog.add_task(_best_text(study), total=total)
        while any(p.is_alive() for p in procs):
            prog.update(task, completed=finished_count(study, total), description=_best_text(study))
            time.sleep(0.5)
        prog.update(task, completed=finished_count(study, total), description=_best_text(study))


def summarize(study) -> dict[str, Any]:
    from optuna.trial import TrialState
    ts = study.get_trials(deepcopy=False)
    states = {st.name: sum(1 for t in ts if t.state == st) for st in TrialState}
    fails = {}
    for t in ts:
        if t.state in (TrialState.FAIL,) and "fail_reason" in t.user_attrs:
            k = t.user_attrs.get("fail_kind") or t.user_attrs["fail_reason"].split(":")[0]
            fails[k] = fails.get(k, 0) + 1
    out: dict[str, Any] = {"study": study.study_name, "trials": len(ts),
                           "refused": sum(1 for t in ts if is_refused(t)),
                           "states": {k: v for k, v in states.items() if v}, "fail_kinds": fails,
                           "attrs": study.user_attrs}
    try:
        out["best"] = _trial_brief(study.best_trial)
    except ValueError:
        out["best"] = None
    # tensor parallelism: the store's engine default is the best single-GPU trial; the TP best beside it
    b = out["best"]
    if b is not None and int(b["params"].get("tp_degree", 1)) > 1:
        g, x = int(b["params"]["tp_degree"]), b["params"].get("exchange_rows")
        b["tp"] = {"G": g, "exchange_rows": x}
        out["best_tp"] = {"number": b["number"], "tok_per_s": b["tok_per_s"], "G": g, "exchange_rows": x,
                          "config": b["config"]}
        s1 = max(completed_single_gpu(study), key=lambda t: t.value, default=None)
        out["best_single_gpu"] = None if s1 is None else _trial_brief(s1)
    return out


def _finish(s: Setup, args, study, wall: float, revived: int, interrupted: BaseException | None = None) -> int:
    """Store the best config, write the run folder (trials table, summary, report) and print the result.
    `interrupted`: the search was stopped by it: the run folder is marked incomplete with why, no report is
    rendered and nothing is printed but one line naming the folder (the caller re-raises)."""
    from kog.runstore import RunStore
    from kog.tune import store
    summ = summarize(study)
    summ.update({"storage": redact(s.storage_url), "wall_s": round(wall, 2), "revived_dead_trials": revived,
                 "backend": s.backend, "sampler": args.sampler, "dashboard": dashboard_command(s.storage_url)})
    if interrupted is not None:
        summ["interrupted"] = _why(interrupted)
    stored = False
    # the engine default is a single-GPU config: with a TP best, the best degree-1 trial is stored
    sb = summ["best_single_gpu"] if "best_tp" in summ else summ["best"]
    sb = _confirmed_best(study, sb)
    if sb is not None and sb.get("config"):
        cfg = store.engine_config(sb["config"])        # a study an older kog started: retired fields
        source = {"backend": s.backend, "study": s.study_name, "storage": redact(s.storage_url),
                  "trial": sb["number"]}
        if "best_tp" in summ:
            source["tp_best"] = {k: summ["best_tp"][k] for k in ("G", "exchange_rows", "tok_per_s", "number")}
            try:
                study.set_user_attr("best_tp", source["tp_best"])
            except Exception:
                pass
        stored = store.save_best(s.device_name, s.model, cfg, sb["tok_per_s"], source=source)
    summ["stored"] = stored
    summ["store"] = str(store.store_path())
    dev = s.device if s.device is not None else {"name": s.device_name, "sms": s.sms, "simulated": True}
    report_path = None
    with RunStore(args.runs_dir).create("study", dev, extra={"study": s.study_name,
                                                             "storage": redact(s.storage_url)}) as run:
        try:
            from kog.reports.tuning import trials_frame
            df = trials_frame(study, ("number", "value", "state", "params", "user_attrs", "datetime_start",
                                      "datetime_complete"))
            for c in df.columns:
                if df[c].dtype == object:
                    df[c] = df[c].map(lambda v: v if v is None or isinstance(v, (str, int, float)) else
                                      json.dumps(v, default=str))
            run.write_table("trials", df)
        except Exception as e:
            run.note_error("trials", f"{type(e).__name__}: {e}")
        run.write_json("summary", summ)
        summ["run"] = str(run.path)
        if interrupted is not None:
            run.meta["interrupted_by"] = type(interrupted).__name__
            run.meta["interrupted_message"] = summ["interrupted"]
            run.finish("incomplete")
            print(f"kogtune: search interrupted ({summ['interrupted']}); run {run.path} marked incomplete",
                  file=sys.stderr)
            return 1
        from kog.reports.tuning import render_study_report
        try:
            report_path = render_study_report(study, run.path)          # RUN/report.html
        except Exception as e:      # the study is recorded either way
            run.note_error("report", f"{type(e).__name__}: {e}")
    if args.json:
        print(json.dumps({**summ, "report": str(report_path) if report_path else None}, default=str))
    else:
        b = summ["best"]
        st = ", ".join(f"{k.lower()} {v}" for k, v in summ["states"].items())
        print(f"study {s.study_name} ({summ['storage']}): {summ['trials']} trials ({st})")
        if b:
            sim = " (simulated)" if s.backend == "sim" else ""
            print(f"best: {b['tok_per_s']:.1f} tok/s{sim} trial {b['number']}: {json.dumps(b['params'])}")
            if "best_tp" in summ:
                t1 = summ["best_single_gpu"]
                print(f"best is tensor-parallel (G={b['tp']['G']}, exchange_rows {b['tp']['exchange_rows']}): "
                      f"not an engine default; best single-GPU: " + (
                          f"{t1['tok_per_s']:.1f} tok/s{sim} trial {t1['number']}" if t1 else "none"))
            if "best_tp" in summ and summ["best_single_gpu"] is None:
                print("not stored: no single-GPU trial completed")
            else:
                print((f"stored{' (the best single-GPU config)' if 'best_tp' in summ else ''} in {summ['store']}")
                      if stored else "not stored: an equal or better config is stored")
        print(f"run: {summ['run']}")
        print(f"browse it: {summ['dashboard']}")
        if report_path:
            print(str(report_path))
    return 0 if summ["best"] is not None else 1
