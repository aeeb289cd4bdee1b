"""Tether's development tools, outside the runtime package: transport comparison experiments
(`tether bench`), the fuzzer (`tether fuzz`), the load, scale-out and replica campaigns, and the
micro-benchmarks of single components (`bench_*`).

Installed with the `lab` extra (`pip install -e '.[lab]'`; `.[dev]` includes it). Every
campaign runs the real `tether serve` as a subprocess through `processes.ServerProcess`.

- `bench`: CLI and orchestration (profiles, phases, the server/bridge/proxy subprocesses, the
  per-rollout server figures); `throughput` and `overhead`: the two dedicated modes; `replicas`:
  several simulated replicas behind one pool.
- `tether.workloads` (runtime: the simulated model and the console serve them) holds the agent
  rollouts as data and the simulated model's script derived from them.
- `transports/`: one module per transport behind `Transport.run_rollout(workload) -> RolloutResult`.
- `proxy`: the loopback delay proxy; `metrics`: server_timing, /metrics and /proc figures;
  `report`: tables, CSV and JSON; `plots`: PNG charts; `processes`: the processes a run starts
  (the real `tether serve` / `tether bridge`).
- `fuzz`: every surface of a running server with malformed and hostile input; `load`: thousands
  of connections and tool loops against one server; `scaleout`: workers, replicas behind nginx,
  shared stores; `rollout_restart`: agents through nginx while every replica restarts.
- `bench_codec`, `bench_bridge`, `bench_hydrate`, `bench_tracing`: one component each.
"""

from importlib.util import find_spec

from tether.extras import MissingExtra

for _module in ("openai", "matplotlib", "tqdm"):
    if find_spec(_module) is None:
        raise MissingExtra("lab", _module)
