"""Transport comparison experiments (`tether bench`).

- `bench`: CLI and orchestration (profiles, phases, the server/bridge/proxy subprocesses, the
  per-rollout server figures); `throughput` and `overhead`: the two dedicated modes.
- `workloads` (+ `workloads/*.toml`): agent rollouts as data, and the simulated model's script
  derived from them.
- `transports/`: one module per transport behind `Transport.run_rollout(workload) -> RolloutResult`.
- `proxy`: the loopback delay proxy; `metrics`: server_timing, /metrics and /proc figures;
  `report`: tables, CSV and JSON; `plots`: PNG charts; `server`: the processes a run starts
  (the real `tether serve` / `tether bridge`).
"""
