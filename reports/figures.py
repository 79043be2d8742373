"""The reports' figures: each builder takes tables (pandas) and returns a matplotlib Figure made with
the object API (kog.reports.html.new_figure), never pyplot state. Builders do not embed or save;
kog.reports.html.embed_figure does that."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from kog.reports.html import new_figure

CATEGORY_COLORS = {"streaming": "#2a6fdb", "waiting": "#f2a900", "barrier": "#d1495b", "other": "#9aa3b5"}
PALETTE = ("#2a6fdb", "#d1495b", "#1e9e6a", "#f2a900", "#7b4fc9", "#00a6b8", "#c25d00", "#5b6478")


def _human_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(b) < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if b == int(b) else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b} B"


def partition_legend(ax, parts, loc: str = "upper left", **kw) -> None:
    """A legend naming each L2 partition's colour (the same colours in every figure of a report)."""
    from matplotlib.patches import Patch
    ps = sorted({int(p) for p in parts if p == p and int(p) >= 0})
    if ps:
        ax.legend(handles=[Patch(color=PALETTE[p % len(PALETTE)], label=f"L2 partition {p}") for p in ps],
                  fontsize=7, loc=loc, title_fontsize=7, **kw)


def text_panel(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#5b6478", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


# ---- topology --------------------------------------------------------------------------------
def placement_map(placement: pd.DataFrame, partition: dict[int, int] | None = None):
    """Left: program id -> SM id for the first launch (colour = L2 partition when known).
    Right: for each program id, the share of launches that put it on the same SM as launch 0."""
    fig = new_figure(10, 3.8)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[3, 2])
    launches = sorted(placement["launch"].unique())
    first = placement[placement["launch"] == launches[0]].sort_values("pid")
    colors = [PALETTE[partition.get(int(s), 7) % len(PALETTE)] if partition else PALETTE[0] for s in first["smid"]]
    ax1.scatter(first["pid"], first["smid"], c=colors, s=10)
    if partition:
        partition_legend(ax1, {partition.get(int(s), -1) for s in first["smid"]})
    ax1.set_xlabel("program id (CTA)")
    ax1.set_ylabel("SM id (%smid)")
    ax1.set_title(f"dispatch order, launch {launches[0]}" + (" (colour: L2 partition)" if partition else ""))
    # stability only among launches of the same grid as the first (a scan may add an oversubscribed
    # launch, 2 CTAs per SM, to count co-resident CTAs: its extra program ids have no counterpart)
    n0 = len(first)
    alike = [l for l in launches if int((placement["launch"] == l).sum()) == n0]
    sub = placement[placement["launch"].isin(alike) & placement["pid"].isin(first["pid"])]
    wide = sub.pivot_table(index="pid", columns="launch", values="smid", aggfunc="first")
    same = wide.eq(wide[launches[0]], axis=0).mean(axis=1)
    ax2.set_title(f"same SM in {len(alike)} launches of {n0} CTAs", fontsize=10)
    if len(same) and same.nunique() == 1:
        # one value for every program id is a sentence, not a chart
        text_panel(ax2, f"every program id landed on the same SM\nin all {len(alike)} launches ({same.iloc[0]:.0%})"
                   if same.iloc[0] == 1 else f"{same.iloc[0]:.0%} of launches put each program id\non the SM of "
                                            f"launch {launches[0]}")
        return fig
    ax2.bar(same.index, same.values, width=1.0, color=PALETTE[2])
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("program id")
    ax2.set_ylabel("share of launches on the same SM")
    return fig


def latency_ladder(latency: pd.DataFrame, plateaus: dict[str, float] | None = None,
                   l2_bytes: int | None = None, others: Sequence[tuple[str, pd.DataFrame]] = ()):
    fig = new_figure(9, 4.2)
    ax = fig.subplots()
    series = [("this run", latency)] + list(others) if others else [(None, latency)]
    for i, (label, df) in enumerate(series):
        df = df.sort_values("bytes")
        ax.plot(df["bytes"], df["ns"], "-", color=PALETTE[i % len(PALETTE)], lw=1.5, label=label, zorder=2)
        if i == 0 and "level" in df:
            for j, (lv, g) in enumerate(df.groupby("level", sort=False)):
                ax.scatter(g["bytes"], g["ns"], s=14, color=PALETTE[(j + 2) % len(PALETTE)], label=str(lv), zorder=3)
    for name, ns in (plateaus or {}).items():
        if ns:
            ax.axhline(ns, color="#9aa3b5", lw=0.8, ls="--", zorder=1)
            ax.annotate(f"{name} {ns:.0f} ns", (1.0, ns), xycoords=("axes fraction", "data"), ha="right",
                        va="bottom", fontsize=8, color="#5b6478")
    if l2_bytes:
        ax.axvline(l2_bytes, color="#d1495b", lw=0.8, ls=":")
        ax.annotate("L2 size", (l2_bytes, 0.02), xycoords=("data", "axes fraction"), rotation=90, fontsize=8,
                    color="#d1495b", ha="right")
    ax.set_xscale("log", base=2)
    ticks = [2**k for k in range(14, 32, 2) if latency["bytes"].min() / 2 <= 2**k <= latency["bytes"].max() * 2]
    ax.set_xticks(ticks, [_human_bytes(t) for t in ticks])
    ax.set_xlabel("working set")
    ax.set_ylabel("ns per dependent load")
    ax.set_title("latency ladder (pointer chase)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return fig


def l2_heatmap(l2map: pd.DataFrame, sm_part: pd.Series | None, region_home: pd.Series | None):
    """Per-SM L2 hit latency to each region; rows grouped by the SM's partition, columns by the region's
    home partition, so near/far shows as blocks."""
    m = l2map.pivot_table(index="sm", columns="region", values="ns", aggfunc="median")
    rows = list(m.index)
    cols = list(m.columns)
    if sm_part is not None:
        rows = sorted(rows, key=lambda s: (sm_part.get(s, 1e9), s))
    if region_home is not None:
        cols = sorted(cols, key=lambda r: (region_home.get(r, 1e9), r))
    m = m.loc[rows, cols]
    fig = new_figure(10, 5.2)
    ax = fig.subplots()
    im = ax.imshow(m.values, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="L2 hit latency (ns)")
    ax.set_xlabel("address region" + (" (grouped by home partition)" if region_home is not None else ""))
    ax.set_ylabel("SM" + (" (grouped by partition)" if sm_part is not None else ""))
    ax.set_title(f"per-SM L2 latency: {len(rows)} SMs x {len(cols)} regions")
    _boundaries(ax, [sm_part.get(s) for s in rows] if sm_part is not None else None, axis="y")
    _boundaries(ax, [region_home.get(r) for r in cols] if region_home is not None else None, axis="x")
    step = max(1, len(rows) // 12)
    ax.set_yticks(range(0, len(rows), step), [str(rows[i]) for i in range(0, len(rows), step)], fontsize=7)
    return fig


def _boundaries(ax, labels, axis: str) -> None:
    if labels is None:
        return
    for i in range(1, len(labels)):
        if labels[i] != labels[i - 1]:
            (ax.axhline if axis == "y" else ax.axvline)(i - 0.5, color="white", lw=1.2)


def partition_map(sm_part: pd.Series, region_home: pd.Series | None, sms: int | None = None):
    """Every SM as a cell (SM id order, 12 per row) coloured by its L2 partition; beside it every
    address region coloured by its home partition."""
    n = int(sms or (sm_part.index.max() + 1))
    cols = 12
    nrows = -(-n // cols)
    grid = np.full((nrows, cols), np.nan)
    for sm, p in sm_part.items():
        if 0 <= sm < n:
            grid[sm // cols, sm % cols] = p
    fig = new_figure(10, 3.6)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[3, 2])
    from matplotlib.colors import ListedColormap
    k = int(np.nanmax(grid)) + 1 if np.isfinite(grid).any() else 1
    cmap = ListedColormap(PALETTE[:max(k, 1)])
    ax1.imshow(grid, cmap=cmap, vmin=-0.5, vmax=k - 0.5, aspect="auto")
    for sm in range(n):
        ax1.text(sm % cols, sm // cols, str(sm), ha="center", va="center", fontsize=6, color="white")
    ax1.set_xticks([])
    ax1.set_yticks([])
    ax1.set_title(f"SM -> L2 partition ({k} partitions)")
    partition_legend(ax1, range(k), loc="upper left", bbox_to_anchor=(0.0, -0.02), ncols=k, frameon=False)
    if region_home is not None and len(region_home):
        r = region_home.sort_index()
        rc = 16
        g2 = np.full((-(-len(r) // rc), rc), np.nan)
        for i, p in enumerate(r.values):
            g2[i // rc, i % rc] = p
        ax2.imshow(g2, cmap=cmap, vmin=-0.5, vmax=k - 0.5, aspect="auto")
        ax2.set_title("address region -> home partition")
        ax2.set_xticks([])
        ax2.set_yticks([])
    else:
        text_panel(ax2, "region homes not measured")
    return fig


def cluster_order(m: np.ndarray, groups: Sequence[int] | None = None) -> np.ndarray:
    """An order of the rows of a square latency matrix that puts similar SMs together: by group (the
    L2 partition when known), then along the leading principal component of the row profiles, which
    separates GPCs without needing scipy's hierarchical clustering."""
    x = np.where(np.isfinite(m), m, np.nanmean(m))
    x = x - x.mean(axis=0, keepdims=True)
    try:
        u, s, _ = np.linalg.svd(x, full_matrices=False)
        pc1, pc2 = u[:, 0] * s[0], (u[:, 1] * s[1] if u.shape[1] > 1 else 0 * u[:, 0])
    except np.linalg.LinAlgError:
        pc1 = pc2 = np.zeros(len(m))
    g = np.zeros(len(m)) if groups is None else np.asarray(groups, dtype=float)
    # within a partition, the second component usually splits GPCs once the first has split partitions
    key2 = pc2 if groups is not None else pc1
    return np.lexsort((np.round(key2, 6), g))


def tick_step(n: int, max_labels: int = 12) -> int:
    """Label every Nth of n cells so at most `max_labels` labels share an axis (readable at 7 pt)."""
    return max(1, -(-n // max_labels))


def signal_heatmap(signal: pd.DataFrame, sm_part: pd.Series | None):
    m = signal.pivot_table(index="src_sm", columns="dst_sm", values="ns", aggfunc="median")
    ids = sorted(set(m.index) | set(m.columns))
    m = m.reindex(index=ids, columns=ids)
    groups = [sm_part.get(i, -1) for i in ids] if sm_part is not None else None
    order = cluster_order(m.values, groups)
    mo = m.values[np.ix_(order, order)]
    fig = new_figure(7.5, 6.4)
    ax = fig.subplots()
    finite = mo[np.isfinite(mo)]
    vmin, vmax = (np.percentile(finite, 1), np.percentile(finite, 99)) if finite.size else (0, 1)
    im = ax.imshow(mo, cmap="magma_r", vmin=vmin, vmax=vmax, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="one-way signal latency (ns)", shrink=0.85)
    if groups is not None:
        gs = [groups[i] for i in order]
        _boundaries(ax, gs, "x")
        _boundaries(ax, gs, "y")
    step = tick_step(len(ids))
    lab = [str(ids[i]) for i in order]
    ax.set_xticks(range(0, len(ids), step), lab[::step], fontsize=7, rotation=90)
    ax.set_yticks(range(0, len(ids), step), lab[::step], fontsize=7)
    ax.set_xticks(range(len(ids)), minor=True)
    ax.set_yticks(range(len(ids)), minor=True)
    ax.tick_params(which="minor", length=1.5)
    if groups is not None:
        partition_legend(ax, groups, loc="upper left", bbox_to_anchor=(1.25, 1.0))
    ax.set_xlabel("destination SM (cluster order)")
    ax.set_ylabel("source SM (cluster order)")
    ax.set_title(f"SM x SM signal latency, {len(ids)} SMs (every {step}th labelled)" if step > 1 else
                 f"SM x SM signal latency, {len(ids)} SMs")
    return fig


def sync_costs(barrier: pd.DataFrame | None, flag: pd.DataFrame | None, atomics: pd.DataFrame | None,
               launch: pd.DataFrame | None, anchors: dict[str, float] | None = None):
    fig = new_figure(10, 6.4)
    (a, b), (c, d) = fig.subplots(2, 2)
    anchors = anchors or {}
    if barrier is not None and len(barrier):
        for i, (w, g) in enumerate(barrier.groupby("warps")):
            g = g.sort_values("ctas")
            a.plot(g["ctas"], g["us"], "o-", ms=3, color=PALETTE[i % len(PALETTE)], label=f"{w} warps")
        if "barrier" in anchors:
            a.axhline(anchors["barrier"], ls="--", color="#9aa3b5", lw=0.8)
            a.annotate(f"anchor {anchors['barrier']:.2f} us", (0.02, anchors["barrier"]),
                       xycoords=("axes fraction", "data"), fontsize=7, va="bottom", color="#5b6478")
        a.set_xlabel("CTAs in the barrier")
        a.set_ylabel("us per barrier")
        a.set_ylim(bottom=0)
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    else:
        text_panel(a, "barrier: not measured")
    a.set_title("grid barrier")
    if flag is not None and len(flag):
        b.barh(flag["kind"].astype(str), flag["us"], color=PALETTE[1])
        for y, v in enumerate(flag["us"]):
            b.annotate(f"{v:.2f}", (v, y), fontsize=7, va="center", xytext=(2, 0), textcoords="offset points")
        b.set_xlabel("us")
    else:
        text_panel(b, "flag waits: not measured")
    b.set_title("flag wait")
    if atomics is not None and len(atomics):
        g = atomics.sort_values("ctas")
        c.plot(g["ctas"], g["mops_per_s"], "o-", ms=3, color=PALETTE[2])
        c.set_xlabel("CTAs hitting one counter")
        c.set_ylabel("M atomic ops / s")
        c.grid(alpha=0.3)
    else:
        text_panel(c, "contended atomics: not measured")
    c.set_title("contended atomic throughput")
    if launch is not None and len(launch):
        d.bar(launch["mode"].astype(str), launch["us"], color=PALETTE[3])
        for x, v in enumerate(launch["us"]):
            d.annotate(f"{v:.2f} us", (x, v), ha="center", fontsize=8, va="bottom")
        d.set_ylabel("us per launch")
    else:
        text_panel(d, "launch overhead: not measured")
    d.set_title("kernel launch")
    return fig


def bandwidth_curve(bw: pd.DataFrame, saturate: int | None = None,
                    others: Sequence[tuple[str, pd.DataFrame]] = (), label: str = "", reference: float | None = None):
    fig = new_figure(9, 4.2)
    ax = fig.subplots()
    series = [(label, bw)] + list(others)
    styles = ("-", "--", ":")
    for si, (label, df) in enumerate(series):
        for i, (kind, g) in enumerate(df.groupby("kind", sort=False)):
            g = g.sort_values("sms")
            ax.plot(g["sms"], g["GBps"], styles[si % 3], marker="o", ms=3, color=PALETTE[i % len(PALETTE)],
                    label=f"{kind}" + (f" ({label})" if label else ""))
    if reference:
        ax.axhline(reference, color="#d1495b", ls=":", lw=1)
        ax.annotate(f"torch copy, same run: {reference:,.0f} GB/s", (0.01, reference), fontsize=8, color="#d1495b",
                    xycoords=("axes fraction", "data"), va="bottom")
    if saturate:
        ax.axvline(saturate, color="#9aa3b5", ls="--", lw=0.8)
        ax.annotate(f"saturates at {saturate} SMs", (saturate, 0.05), xycoords=("data", "axes fraction"),
                    fontsize=8, color="#5b6478", xytext=(3, 0), textcoords="offset points")
    ax.set_xlabel("SMs streaming")
    ax.set_ylabel("GB/s")
    ax.set_ylim(bottom=0)
    ax.set_title("streaming bandwidth vs SMs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


# ---- engine ----------------------------------------------------------------------------------
def toks_vs_limit(names: list[str], tps: list[float], limit: float | None):
    fig = new_figure(9, 0.5 * len(names) + 1.6)
    ax = fig.subplots()
    y = np.arange(len(names))
    colors = [PALETTE[0] if n.startswith("kog") else "#9aa3b5" for n in names]
    ax.barh(y, tps, color=colors)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    top = max([v for v in tps if np.isfinite(v)] + [limit or 0]) * 1.15
    for yi, v in zip(y, tps):
        label = f"{v:,.0f} tok/s" + (f"  ({v / limit:.0%} of limit)" if limit else "")
        ax.annotate(label, (v, yi), va="center", fontsize=8, xytext=(3, 0), textcoords="offset points")
    if limit:
        ax.axvline(limit, color="#d1495b", ls="--", lw=1)
        ax.annotate(f"bandwidth limit {limit:,.0f} tok/s", (limit, -0.6), color="#d1495b", fontsize=8,
                    ha="right", va="bottom", annotation_clip=False)
    ax.set_xlim(0, top)
    ax.set_xlabel("tokens per second (batch 1 decode)")
    return fig


def stacked_breakdown(bd: pd.DataFrame, by: str, groups: list[str] | None = None):
    """Stacked bars (us per token) by category. `bd` columns: [by, category, seconds_per_token] and
    optionally 'system' (then one panel per phase with a bar per system: grid vs targeted)."""
    cats = [c for c in CATEGORY_COLORS if c in set(bd["category"])] + \
        sorted(set(bd["category"]) - set(CATEGORY_COLORS))
    if by == "phase":
        phases = list(dict.fromkeys(bd["phase"]))
        systems = groups or list(dict.fromkeys(bd["system"]))
        n = len(phases)
        ncols = min(5, n)
        nrows = -(-n // ncols)
        fig = new_figure(2.1 * ncols + 1, 2.3 * nrows + 0.6)
        axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
        ymax = bd.groupby(["phase", "system"])["seconds_per_token"].sum().max() * 1e6 * 1.1
        for ax, ph in zip(axes, phases):
            sub = bd[bd["phase"] == ph]
            bottom = np.zeros(len(systems))
            for cat in cats:
                v = np.array([sub[(sub["system"] == s) & (sub["category"] == cat)]["seconds_per_token"].sum()
                              for s in systems]) * 1e6
                ax.bar(range(len(systems)), v, bottom=bottom, color=CATEGORY_COLORS.get(cat, "#5b6478"),
                       label=cat)
                bottom += v
            ax.set_xticks(range(len(systems)), [s.replace("kog-", "") for s in systems], fontsize=8)
            ax.set_title(str(ph), fontsize=9)
            ax.set_ylim(0, ymax)
            ax.tick_params(axis="y", labelsize=7)
        for ax in axes[n:]:
            ax.set_visible(False)
        axes[0].set_ylabel("us per token")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=len(cats), fontsize=8)
        return fig
    systems = groups or list(dict.fromkeys(bd[by]))
    fig = new_figure(9, 0.55 * len(systems) + 1.6)
    ax = fig.subplots()
    left = np.zeros(len(systems))
    for cat in cats:
        v = np.array([bd[(bd[by] == s) & (bd["category"] == cat)]["seconds_per_token"].sum()
                      for s in systems]) * 1e6
        ax.barh(range(len(systems)), v, left=left, color=CATEGORY_COLORS.get(cat, "#5b6478"), label=cat)
        left += v
    ax.set_yticks(range(len(systems)), systems)
    ax.invert_yaxis()
    ax.set_xlabel("us per token")
    ax.legend(fontsize=8, ncols=len(cats), loc="lower right")
    return fig


def timeline(tl: pd.DataFrame, max_rows_per_panel: int = 200):
    """Per-SM timeline: one row per SM (CTAs on the same SM share it), bars coloured by kind; one panel
    per system when the table has a 'system' column."""
    systems = list(dict.fromkeys(tl["system"])) if "system" in tl else [None]
    fig = new_figure(11, 3.6 * len(systems) + 0.6)
    axes = np.atleast_1d(fig.subplots(len(systems), 1, squeeze=False)).ravel()
    for ax, sysname in zip(axes, systems):
        d = tl if sysname is None else tl[tl["system"] == sysname]
        t0 = d["start_ns"].min()
        rows = sorted(d["sm"].unique())[:max_rows_per_panel]
        pos = {sm: i for i, sm in enumerate(rows)}
        d = d[d["sm"].isin(pos)]
        # one PolyCollection per kind: tens of thousands of spans as Rectangle artists (barh) would take
        # seconds to draw; a collection draws them in one pass
        from matplotlib.collections import PolyCollection
        from matplotlib.patches import Patch
        handles = []
        for kind, g in d.groupby("kind"):
            y = g["sm"].map(pos).to_numpy(dtype=float)
            x0 = (g["start_ns"].to_numpy() - t0) / 1e3
            x1 = (g["end_ns"].to_numpy() - t0) / 1e3
            verts = np.stack([np.stack([x0, y - 0.5], 1), np.stack([x1, y - 0.5], 1),
                              np.stack([x1, y + 0.5], 1), np.stack([x0, y + 0.5], 1)], 1)
            color = CATEGORY_COLORS.get(kind, "#5b6478")
            ax.add_collection(PolyCollection(verts, facecolors=color, edgecolors="none", linewidths=0))
            handles.append(Patch(color=color, label=str(kind)))
        ax.set_xlim(0, (d["end_ns"].max() - t0) / 1e3 * 1.01)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_ylabel("SM")
        step = max(1, len(rows) // 12)
        ax.set_yticks(range(0, len(rows), step), [str(rows[i]) for i in range(0, len(rows), step)], fontsize=7)
        ax.set_title(f"{sysname}" if sysname else "instrumented run", fontsize=10)
        ax.legend(handles=handles, fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=4, frameon=False)
    axes[-1].set_xlabel("time (us)")
    return fig


def sync_share(rows: list[tuple[str, float]], published: float = 0.35):
    fig = new_figure(7, 0.55 * (len(rows) + 1) + 1.4)
    ax = fig.subplots()
    names = [r[0] for r in rows] + ["published monokernel (standard stacks)"]
    vals = [r[1] for r in rows] + [published]
    colors = [CATEGORY_COLORS["barrier"]] * len(rows) + ["#9aa3b5"]
    ax.barh(range(len(names)), [v * 100 for v in vals], color=colors)
    for y, v in enumerate(vals):
        ax.annotate(f"{v:.1%}", (v * 100, y), va="center", fontsize=8, xytext=(3, 0), textcoords="offset points")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, max(vals + [0.4]) * 115)
    ax.set_xlabel("% of token time lost to grid synchronisation")
    return fig


# ---- tuning ----------------------------------------------------------------------------------
def study_history(df: pd.DataFrame, maximize: bool = True):
    """Objective per trial and best-so-far, every trial drawn: completed as dots; pruned ones at their last
    intermediate value where they have one, else like refused and failed ones on a strip at the bottom
    (each outcome its own marker), so the x axis holds all of the study's trials."""
    fig = new_figure(9, 4)
    ax = fig.subplots()
    kind = df["outcome"] if "outcome" in df else df["state"].astype(str).str.lower().map(
        {"complete": "complete", "fail": "failed", "pruned": "pruned"}).fillna("other")
    ok = df[kind == "complete"].sort_values("number")
    ax.scatter(ok["number"], ok["value"], s=16, color=PALETTE[0], label=f"completed ({len(ok)})", zorder=3)
    if len(ok):
        best = ok["value"].cummax() if maximize else ok["value"].cummin()
        ax.step(ok["number"], best, where="post", color=PALETTE[1], lw=1.6, label="best so far")
    lo = float(ok["value"].min()) if len(ok) else 0.0
    hi = float(ok["value"].max()) if len(ok) else 1.0
    floor = lo - 0.08 * max(hi - lo, abs(lo) * 0.05, 1.0)
    styles = {"pruned": ("v", "#9aa3b5", "pruned"), "refused": ("s", "#c9ced9", "refused before launch"),
              "failed": ("x", "#d1495b", "failed")}
    for k, (marker, color, label) in styles.items():
        sel = df[kind == k]
        if not len(sel):
            continue
        y = sel["value"].where(sel["value"].notna(), floor) if "value" in sel else pd.Series(floor, index=sel.index)
        ax.scatter(sel["number"], y.fillna(floor), marker=marker, color=color, s=22, zorder=2,
                   label=f"{label} ({len(sel)})")
    other = df[~kind.isin(["complete", *styles])]
    if len(other):
        ax.scatter(other["number"], [floor] * len(other), marker=".", color="#5b6478", label=f"other ({len(other)})")
    if len(df):
        ax.set_xlim(df["number"].min() - 1, df["number"].max() + 1)
    ax.set_xlabel(f"trial (all {len(df)})")
    ax.set_ylabel("objective (tok/s)")
    ax.legend(fontsize=8, ncols=2)
    ax.grid(alpha=0.3)
    ax.set_title("optimization history")
    return fig


def importances(imp: dict[str, float]):
    names = list(imp)[::-1]
    fig = new_figure(7, 0.4 * len(names) + 1.2)
    ax = fig.subplots()
    ax.barh(names, [imp[n] for n in names], color=PALETTE[0])
    for y, n in enumerate(names):
        ax.annotate(f"{imp[n]:.2f}", (imp[n], y), va="center", fontsize=8, xytext=(3, 0), textcoords="offset points")
    ax.set_xlabel("importance")
    ax.set_xlim(0, max(imp.values() or [1]) * 1.2)
    return fig


def compare_bars(labels: list[str], a: list[float], b: list[float], name_a: str, name_b: str, xlabel: str):
    fig = new_figure(9, 0.6 * len(labels) + 1.5)
    ax = fig.subplots()
    y = np.arange(len(labels))
    ax.barh(y - 0.2, a, height=0.4, color=PALETTE[0], label=name_a)
    ax.barh(y + 0.2, b, height=0.4, color=PALETTE[1], label=name_b)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8)
    return fig
