"""Server-side figures: per-turn `server_timing`, the Prometheus `/metrics` text, and /proc.

- `server_timing(response)`: `{stages_ms, overhead_ms}` from a Response (JSON dict, SDK model or
  proto), or None when the server did not send it.
- `parse_prometheus(text)`: samples keyed by (name, labels); `stage_sums(text)` the
  `tether_stage_seconds` histogram's (sum, count) per stage; `diff_stage_sums(before, after)`
  what one rollout added.
- `ProcStat`: CPU seconds (utime + stime, all threads) and RSS of a process, from /proc.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from tether import eventloop

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def server_timing(response: Any) -> dict | None:
    """`{"stages_ms": {...}, "overhead_ms": float}` of a Response in any of its forms."""
    if response is None:
        return None
    if hasattr(response, "HasField"):  # proto
        if not response.HasField("server_timing"):
            return None
        st = response.server_timing
        return {"stages_ms": dict(st.stages_ms), "overhead_ms": st.overhead_ms}
    if not isinstance(response, dict):  # SDK pydantic model: unknown keys land in model_extra
        extra = getattr(response, "model_extra", None) or {}
        value = extra.get("server_timing", getattr(response, "server_timing", None))
        return _as_timing(value)
    return _as_timing(response.get("server_timing"))


def _as_timing(value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        value = value.model_dump() if hasattr(value, "model_dump") else dict(value)
    stages = {k: float(v) for k, v in (value.get("stages_ms") or {}).items()}
    return {"stages_ms": stages, "overhead_ms": float(value.get("overhead_ms") or 0.0)}


# --- Prometheus text ----------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        key = tuple(sorted(_LABEL.findall(labels or "")))
        try:
            out[(name, key)] = float(value)
        except ValueError:
            continue
    return out


def stage_sums(text: str) -> dict[str, tuple[float, float]]:
    """`tether_stage_seconds` per stage: (sum seconds, count)."""
    samples = parse_prometheus(text)
    out: dict[str, list[float]] = {}
    for (name, labels), value in samples.items():
        if name not in ("tether_stage_seconds_sum", "tether_stage_seconds_count"):
            continue
        stage = dict(labels).get("stage", "")
        slot = out.setdefault(stage, [0.0, 0.0])
        slot[0 if name.endswith("_sum") else 1] = value
    return {k: (v[0], v[1]) for k, v in out.items()}


def counter(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for (n, lab), value in parse_prometheus(text).items():
        if n == name and all(dict(lab).get(k) == v for k, v in labels.items()):
            total += value
    return total


def diff_stage_sums(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Per stage: seconds and observations added between two scrapes."""
    out = {}
    for stage, (s1, c1) in after.items():
        s0, c0 = before.get(stage, (0.0, 0.0))
        if c1 - c0 > 0:
            out[stage] = {"seconds": s1 - s0, "count": c1 - c0}
    return out


# --- /proc --------------------------------------------------------------------------------------


@dataclass
class ProcStat:
    pid: int

    def cpu_seconds(self) -> float:
        """utime + stime of every thread of the process, in seconds (resolution 1/CLK_TCK)."""
        with open(f"/proc/{self.pid}/stat") as f:
            raw = f.read()
        fields = raw[raw.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)

    def rss_bytes(self) -> int:
        """Resident set size (0 when the process is gone)."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def alive(self) -> bool:
        return os.path.exists(f"/proc/{self.pid}")


def machine() -> dict:
    """What the figures were measured on."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import platform

    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "mem_bytes": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        # The loop the lab's own programs run on (`tether.eventloop.run`: TETHER_SERVER__EVENT_LOOP,
        # else the server's default): the clients' CPU figures depend on it as much as the
        # server's do on `server.event_loop`.
        "client_event_loop": eventloop.resolve(eventloop.environment_choice()),
    }
