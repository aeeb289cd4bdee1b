#!/bin/sh
# HTTP full resend vs WebSocket mode vs gRPC on the same agent rollout (the `chat3` workload at a
# 4,000 tokens/s simulated model), against a Tether the bench starts itself; prints the tables and
# writes results under bench-results/ (or $1). Needs the lab extra: pip install -e '.[lab]'.
# For the full comparison (3 workloads, 3 speeds, every transport, charts): tether bench full --plot
exec tether bench --workloads chat3 --speeds 4000 --transports http-full-keepalive,ws-inproc,grpc --reps 1 --no-remote --no-progress ${1:+--out "$1"}
