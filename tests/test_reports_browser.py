"""The reports as a person sees them: headless Chromium opens each report from file:// and we check that
no console error is logged, every figure loaded with a non-zero size, no request leaves the file, and
the screenshot is not blank.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages ending
in NUL on fds 3 and 4), so no driver download and no extra Python package are needed. Skipped with a
reason when /usr/bin/chromium is absent (.ci/run installs Debian's chromium).
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = next((p for p in (os.environ.get("KOG_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                             shutil.which("chromium-browser")) if p and Path(p).exists()), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (/usr/bin/chromium); "
                                                         ".ci/run installs Debian's chromium")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         "--disable-dev-shm-usage", "--window-size=1280,900", "--remote-debugging-pipe"]


class Chromium:
    """A minimal DevTools-protocol client over --remote-debugging-pipe."""

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="kog-chromium-")
        cmd_r, self._cmd_w = os.pipe()      # we write commands, Chromium reads fd 3
        self._ev_r, ev_w = os.pipe()        # Chromium writes fd 4, we read

        def child_fds():                    # runs in the child before exec
            import fcntl
            # move both ends above 10 first: either may already sit on fd 3 or 4 and be clobbered
            hi_r, hi_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(ev_w, fcntl.F_DUPFD, 10)
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, preexec_fn=child_fds, close_fds=False)
        os.close(cmd_r)
        os.close(ev_w)
        self._id = 0
        self._lock = threading.Condition()
        self._responses: dict[int, dict] = {}
        self.events: list[dict] = []
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._ev_r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._responses[-1] = {"closed": True}
                    self._lock.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._lock:
                    if "id" in msg:
                        self._responses[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._lock.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        with self._lock:
            self._id += 1
            mid = self._id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while mid not in self._responses:
                if -1 in self._responses:
                    raise RuntimeError(f"chromium exited: {b''.join(self._stderr)[-2000:].decode(errors='replace')}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer to {method} within {self.timeout} s")
                self._lock.wait(left)
            r = self._responses.pop(mid)
        if "error" in r:
            raise RuntimeError(f"{method}: {r['error']}")
        return r.get("result", {})

    def wait_event(self, method: str, session: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        with self._lock:
            while True:
                for e in self.events:
                    if e.get("method") == method and e.get("sessionId") == session:
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method} within {timeout or self.timeout} s")
                self._lock.wait(left)

    def open(self, url: str, full_page: bool = False, evaluate: str | None = None) -> dict:
        """Load `url` in a fresh tab; return what a person would see and what the page did (and, with
        `evaluate`, the value of that JavaScript expression on the loaded page)."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_event("Page.loadEventFired", session)
        figures = self.send("Runtime.evaluate", {"returnByValue": True, "expression": """
            [...document.querySelectorAll('img, svg')].filter(e => !e.closest('img, svg') || e.tagName === 'IMG')
              .map(e => { const r = e.getBoundingClientRect();
                return {tag: e.tagName, complete: e.tagName === 'IMG' ? e.complete : true,
                        natural: e.tagName === 'IMG' ? [e.naturalWidth, e.naturalHeight] : [r.width, r.height],
                        box: [r.width, r.height], alt: e.getAttribute('alt')}; })"""}, session=session)
        figures = figures["result"]["value"]
        size = self.send("Runtime.evaluate", {"returnByValue": True, "expression":
                                              "[document.documentElement.scrollWidth, "
                                              "document.documentElement.scrollHeight, document.title]"},
                         session=session)["result"]["value"]
        value = None
        if evaluate:
            value = self.send("Runtime.evaluate", {"returnByValue": True, "expression": evaluate},
                              session=session)["result"].get("value")
        shot_args = {"format": "png"}
        if full_page:   # the whole page at half scale (for looking at a report by eye)
            shot_args.update(captureBeyondViewport=True,
                             clip={"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 0.5})
        shot = self.send("Page.captureScreenshot", shot_args, session=session)["data"]
        time.sleep(0.2)                       # let late console/network events arrive
        with self._lock:
            events = [e for e in self.events if e.get("sessionId") == session]
        self.send("Target.closeTarget", {"targetId": target})
        return {"figures": figures, "size": size, "screenshot": base64.b64decode(shot), "events": events,
                "value": value}

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._ev_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


def console_errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
        elif m == "Network.loadingFailed":
            out.append("network: " + json.dumps(p)[:300])
    return out


def outside_requests(events: list[dict], page_url: str) -> list[str]:
    """Every request for something other than the page itself or a data: URI."""
    urls = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    return [u for u in urls if not (u == page_url or u.startswith("data:"))]


def blankness(png: bytes) -> tuple[float, int]:
    """(pixel standard deviation, distinct colours) of a screenshot: ~0 and 1 for a blank page."""
    import numpy as np
    from matplotlib.image import imread
    img = imread(io.BytesIO(png), format="png")
    flat = (img[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    return float(img[..., :3].std()), len(np.unique(flat[:: max(1, len(flat) // 200_000)], axis=0))


@pytest.fixture(scope="module")
def browser():
    b = Chromium()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """One report of each kind (plus one with missing probes and a comparison), from synthetic runs, and
    the bundled H200 scan and bench."""
    from kog.reports import synthetic
    from kog.reports.compare import render_compare
    from kog.reports.engine_report import render_bench_report
    from kog.runstore import RunStore
    from kog.reports.topology import render_scan_report
    from kog.reports.tuning import render_study_report
    root = tmp_path_factory.mktemp("browser")
    store = RunStore(root / "runs")
    scan = synthetic.write_scan(store)
    scan_b = synthetic.write_scan(store, seed=1, scale=1.1, device_name="NVIDIA H100 80GB HBM3")
    partial = synthetic.write_scan(store, drop=("signal", "l2map", "barrier"), errors={"signal": "timeout"})
    older = synthetic.write_scan(store, seed=2, summary_drop=("launch_gpu_us",))   # a scan from before that figure
    bench = synthetic.write_bench(store, model="<script>alert(1)</script>")
    study = synthetic.write_study(store, n_trials=24)
    sim_study = synthetic.write_study(store, n_trials=16, simulated=True, name="sim-study")
    from kog.probe.scan import bundled_scan_path
    from kog.runstore import open_run
    bundled = bundled_scan_path()
    from kog.reports.cli import bundled_bench
    return {
        "bench-bundled": render_bench_report(bundled_bench(), root / "h200-bench-report.html"),
        "bundled": render_scan_report(open_run(bundled), root / "bundled.html")
        if (bundled / "meta.json").exists() else None,
        "scan": render_scan_report(scan, root / "scan.html"),
        "scan-partial": render_scan_report(partial, root / "partial.html"),
        "scan-older": render_scan_report(older, root / "older.html"),
        "bench": render_bench_report(bench, root / "bench.html"),
        "study": render_study_report(study, root / "study.html"),
        "study-sim": render_study_report(sim_study, root / "study-sim.html"),
        "compare": render_compare(scan, scan_b, root / "compare.html"),
    }


@pytest.mark.parametrize("name", ["bundled", "bench-bundled", "scan", "scan-partial", "bench", "study", "study-sim",
                                  "compare"])
def test_report_in_chromium(browser, reports, name):
    path = reports[name]
    if path is None:
        pytest.skip("no bundled H200 scan in this checkout yet")
    url = path.resolve().as_uri()
    seen = browser.open(url)
    assert console_errors(seen["events"]) == []
    assert outside_requests(seen["events"], url) == []
    figs = seen["figures"]
    assert figs, f"{name}: no figure on the page"
    for f in figs:
        assert f["complete"] and min(f["natural"]) > 0 and min(f["box"]) > 0, f"{name}: figure not loaded: {f}"
    width, height, title = seen["size"]
    assert width > 0 and height > 900 and title.startswith("kog")
    std, colours = blankness(seen["screenshot"])
    assert std > 0.02 and colours > 20, f"{name}: screenshot looks blank (std {std:.3f}, {colours} colours)"


def test_blank_page_is_detected(browser, tmp_path):
    """The checks can fail: an empty page's screenshot is blank and a remote image is a request out."""
    p = tmp_path / "blank.html"
    p.write_text("<!DOCTYPE html><html><head><title>x</title></head><body>"
                 "<img src='http://127.0.0.1:9/x.png' alt=''></body></html>")
    seen = browser.open(p.as_uri())
    std, colours = blankness(seen["screenshot"])
    assert std < 0.02 or colours <= 20
    assert outside_requests(seen["events"], p.as_uri()) == ["http://127.0.0.1:9/x.png"]
    assert not all(f["complete"] and min(f["natural"]) > 0 for f in seen["figures"])


# What a person sees of the new parts: laid out boxes with their text, read from the rendered page.
CARD_JS = """(() => { const tiles = [...document.querySelectorAll('#card .tile')].map(t => {
    const r = t.getBoundingClientRect();
    return {label: t.querySelector('.tile-label').innerText, value: t.querySelector('.tile-value').innerText,
            w: r.width, h: r.height, top: r.top + window.scrollY}; });
  const first = document.querySelector('main section');
  return {tiles, first: first && first.id, cardTop: tiles.length ? Math.min(...tiles.map(t => t.top)) : null,
          viewport: window.innerHeight}; })()"""


@pytest.mark.parametrize("name", ["scan", "scan-older", "bundled"])
def test_scan_card_is_the_first_thing_seen(browser, reports, name):
    path = reports[name]
    if path is None:
        pytest.skip("no bundled H200 scan in this checkout yet")
    v = browser.open(path.resolve().as_uri(), evaluate=CARD_JS)["value"]
    assert v["first"] == "card"
    labels = [t["label"] for t in v["tiles"]]
    assert labels == ["L2 partitions x SMs", "far-L2 penalty", "SMs to saturate HBM", "grid barrier, all CTAs",
                      "flag one-way", "launch, GPU", "launch, host"]
    assert all(t["w"] > 100 and t["h"] > 30 and t["value"].strip() for t in v["tiles"])
    assert v["cardTop"] < v["viewport"]                         # above the fold, without scrolling
    values = {t["label"]: t["value"] for t in v["tiles"]}
    if name == "scan-older":                                    # what a scan lacks is said
        assert values["launch, GPU"] == "not measured in this scan"
    if name == "bundled":                                       # the card shows the scan's own figures
        from kog.probe.scan import bundled_scan_path
        summary = json.loads((bundled_scan_path() / "summary.json").read_text())
        assert float(values["launch, GPU"].split()[0]) == pytest.approx(summary["launch_gpu_us"], abs=0.01)
        assert values["SMs to saturate HBM"].startswith(f"{summary['sms_to_saturate_hbm']} of 132")


TABLE_JS = """(() => { const sec = id => document.getElementById(id);
  const heads = id => [...sec(id).querySelectorAll('table.data thead th')].map(h => h.innerText.trim());
  const cells = id => [...sec(id).querySelectorAll('table.data tbody td')].map(c => c.innerText);
  const rowH = [...sec('top').querySelectorAll('table.data tbody tr')].map(r => r.getBoundingClientRect().height);
  const banner = document.querySelector('.banner');
  return {top: heads('top'), topCells: cells('top'), maxRow: Math.max(...rowH),
          trials: sec('trials').querySelectorAll('table.data tbody tr').length,
          defaultText: sec('default').innerText, banner: banner && banner.innerText,
          bannerH: banner ? banner.getBoundingClientRect().height : 0}; })()"""


@pytest.mark.parametrize("name", ["study", "study-sim"])
def test_tuning_report_columns_banner_and_comparison(browser, reports, name):
    v = browser.open(reports[name].resolve().as_uri(), evaluate=TABLE_JS)["value"]
    for p in ("rows_per_task", "k_chunk", "warps", "weight_ring", "mapping"):
        assert p in v["top"]                                    # parameters are columns
    assert not any("{" in c for c in v["topCells"])             # no dicts in cells
    assert v["maxRow"] < 60                                     # one line per trial, not a dict's height
    assert v["trials"] == (24 if name == "study" else 16)       # every trial listed
    assert "speed-up over the default" in v["defaultText"]
    if name == "study-sim":
        assert v["banner"].startswith("SIMULATED study") and v["bannerH"] > 10
    else:
        assert v["banner"] is None
