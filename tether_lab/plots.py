"""PNG charts of a bench run (matplotlib, Agg backend: no display needed).

- `overhead_vs_turn`: per-turn server overhead (p50 over repetitions) against the turn index, one
  line per transport: full-resend HTTP grows with the history, cached transports stay flat.
- `e2e_vs_speed`: end-to-end rollout time (p50) against the model's decode speed, one line per
  transport, with the ratio to the HTTP baseline underneath.
- `bytes_vs_turn`: bytes sent client->server per turn against the turn index.
- `stage_breakdown`: stacked per-turn server time by stage, one bar per transport.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tether_lab.report import overhead_by_turn, pct, turn_stages  # noqa: E402
from tether_lab.transports.base import RolloutResult  # noqa: E402

COLORS = {
    "http-full-newconn": "#d62728",
    "http-full-keepalive": "#ff7f0e",
    "http-prev": "#bcbd22",
    "ws-inproc": "#1f77b4",
    "ws-remote": "#17becf",
    "ws-proto": "#9467bd",
    "grpc": "#2ca02c",
}
STYLES = {"ws-proto": ":", "ws-remote": "--", "http-full-newconn": "--"}


def _style(variant: str) -> dict:
    return {"color": COLORS.get(variant), "linestyle": STYLES.get(variant, "-"), "label": variant}


def overhead_vs_turn(results: list[RolloutResult], phase: str, path: Path, title: str = "",
                     what: str = "overhead") -> Path | None:
    series = overhead_by_turn(results, phase, what)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(9, 5))
    for variant, pts in series.items():
        xs = [i + 1 for i, _, _ in pts]
        ax.plot(xs, [p50 for _, p50, _ in pts], linewidth=1.6, **_style(variant))
    ax.set_yscale("log")
    ax.set_xlabel("turn (model call) index")
    ax.set_ylabel(("pre-backend stages (resolve..route)" if what == "pre_backend" else "server overhead")
                  + " per turn, ms (p50, log scale)")
    ax.set_title(title or f"Per-turn server overhead vs turn index ({phase})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bytes_vs_turn(results: list[RolloutResult], phase: str, path: Path, title: str = "") -> Path | None:
    per: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.phase == phase and r.ok:
            for t in r.turns:
                per[r.variant][t.index].append(t.bytes_sent)
    if not per:
        return None
    fig, ax = plt.subplots(figsize=(9, 5))
    for variant, d in per.items():
        xs = sorted(d)
        ax.plot([x + 1 for x in xs], [statistics.median(d[x]) / 1024 for x in xs], linewidth=1.6, **_style(variant))
    ax.set_yscale("log")
    ax.set_xlabel("turn (model call) index")
    ax.set_ylabel("KB sent client→server per turn (log scale)")
    ax.set_title(title or f"Request bytes per turn ({phase})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def e2e_vs_speed(results: list[RolloutResult], phases: list[str], baseline: str, path: Path, title: str = "") -> Path | None:
    """`phases`: phases of the same workload at different speeds (the speed is read from each)."""
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    base: dict[float, float] = {}
    for phase in phases:
        rs = [r for r in results if r.phase == phase and r.ok]
        if not rs:
            continue
        speed = _tps(rs[0].speed)
        by_variant: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            by_variant[r.variant].append(r.e2e_s)
        for variant, xs in by_variant.items():
            p50 = pct(xs, 50)
            points[variant].append((speed, p50))
            if variant == baseline:
                base[speed] = p50
    if not points:
        return None
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for variant, pts in points.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", linewidth=1.6, **_style(variant))
        ratio = [(s, e / base[s]) for s, e in pts if s in base]
        ax2.plot([p[0] for p in ratio], [p[1] for p in ratio], marker="o", linewidth=1.4, **_style(variant))
    ax.set_xscale("log")
    ax.set_ylabel("end-to-end rollout time, s (p50)")
    ax.set_title(title or "End-to-end rollout time vs model speed")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax2.axhline(0.6, color="grey", linestyle=":", linewidth=1)
    ax2.text(ax2.get_xlim()[0] if ax2.get_xlim() else 1, 0.6, " 40% faster", va="bottom", fontsize=8, color="grey")
    ax2.set_xlabel("model decode speed, tokens/s (log scale)")
    ax2.set_ylabel(f"time / {baseline}")
    ax2.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def stage_breakdown(results: list[RolloutResult], phase: str, path: Path, title: str = "") -> Path | None:
    stages = ("resolve", "validate", "classify", "render", "route", "streaming", "finalize", "post_inference")
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.phase == phase and r.ok:
            for k, v in turn_stages(r).items():
                per[r.variant][k].append(v)
    if not per:
        return None
    variants = list(per)
    fig, ax = plt.subplots(figsize=(9, 5))
    bottom = [0.0] * len(variants)
    cmap = plt.get_cmap("tab10")
    for i, stage in enumerate(stages):
        vals = [statistics.fmean(per[v][stage]) if per[v][stage] else 0.0 for v in variants]
        ax.bar(variants, vals, bottom=bottom, label=stage, color=cmap(i))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("server time per turn, ms (mean)")
    ax.set_title(title or f"Where the server's per-turn time goes ({phase})")
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _tps(speed: str) -> float:
    digits = speed.split("tps")[0]
    try:
        return float(digits)
    except ValueError:
        return float("nan")


# --- `tether bench replicas` (tether_lab.replicas.Cell) -------------------------------------------

def _save(fig, ax, path: Path, *, legend: bool = True) -> Path:
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


REPLICA_COLORS = {"http-rr": "#ff7f0e", "http-prefix": "#d62728", "ws-affine": "#1f77b4", "grpc-affine": "#2ca02c"}


def replicas_e2e(cells: list, path: Path) -> Path | None:
    """Mean rollout e2e against the number of replicas, one line per variant."""
    by: dict[str, list] = defaultdict(list)
    for c in cells:
        by[c.variant].append(c)
    if not by:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for variant, cs in by.items():
        cs = sorted(cs, key=lambda c: c.replicas)
        ax.plot([c.replicas for c in cs], [c.e2e_mean for c in cs], marker="o", label=variant,
                color=REPLICA_COLORS.get(variant))
    ax.set_xlabel("replicas in the pool")
    ax.set_xticks(sorted({c.replicas for c in cells}))
    ax.set_ylabel("rollout e2e, s (mean over agents, time-scaled)")
    ax.set_title("Many agents sharing replicas: e2e by routing policy")
    return _save(fig, ax, path)


def replicas_ttft_by_turn(cells: list, path: Path) -> Path | None:
    """Client-observed TTFT (mean over agents) against the turn index, one line per variant."""
    if not cells:
        return None
    fig, ax = plt.subplots(figsize=(9, 5))
    for c in cells:
        ax.plot(range(1, len(c.ttft_by_turn_s) + 1), [1000 * t for t in c.ttft_by_turn_s], label=c.variant,
                color=REPLICA_COLORS.get(c.variant))
    ax.set_xlabel("turn (model call) index")
    ax.set_ylabel("TTFT, ms (mean over agents, time-scaled)")
    ax.set_title(f"TTFT per turn with {cells[0].replicas} replicas: prefill of the uncached history")
    return _save(fig, ax, path)


def replicas_hit_ratio(cells: list, path: Path) -> Path | None:
    """KV prefix cache hit ratio per replica, grouped by variant."""
    if not cells:
        return None
    n = max(c.replicas for c in cells)
    fig, ax = plt.subplots(figsize=(9, 5))
    width = 0.8 / n
    for i, c in enumerate(cells):
        for j, name in enumerate(c.replica_names):
            ax.bar(i + (j - (n - 1) / 2) * width, 100 * c.hit_ratio_of(name), width * 0.9,
                   color=REPLICA_COLORS.get(c.variant), alpha=0.5 + 0.5 * (j + 1) / n)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([c.variant for c in cells])
    ax.set_ylabel("prompt tokens served from the replica's KV cache, %")
    ax.set_ylim(0, 100)
    ax.set_title(f"Cache hit ratio per replica ({n} replicas; one bar per replica)")
    return _save(fig, ax, path, legend=False)
