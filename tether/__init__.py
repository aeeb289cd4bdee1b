"""Tether: the OpenAI Responses API with WebSocket mode and a bidirectional gRPC session per agent.

Layout: `responses/v1` holds the generated protocol code; `core/` the transport-free session and
turn pipeline; `backends/` the inference adapters; `store/` the response stores; `service/` the
gRPC server; `bridge/` the JSON (WebSocket + HTTP) front end; `lab/` the transport experiments.
"""

__version__ = "0.1.0"
