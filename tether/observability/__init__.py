"""Operating Tether: the metrics endpoint (`metrics_http`), readiness (`health`) and turn tracing
(`tracing`). See docs/operating.md."""
