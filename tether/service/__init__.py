"""The gRPC service: the servicer (a thin adapter over the engine) and the remote client adapter."""
