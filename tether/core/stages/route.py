"""Model resolution: a model name or alias -> (backend instance, upstream model, context window).

The routing table comes from config (`[models.<name>]`, with "*" catching every other name).
Sessions memoise results, so a connection resolves each model name once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tether import errors
from tether.backends.base import Backend
from tether.config import Route
from tether.errors import TetherError


@dataclass(frozen=True)
class Resolved:
    model: str  # as the client named it (echoed in the Response)
    backend: Backend
    upstream_model: str
    context_window: int


class Router:
    def __init__(self, routes: Mapping[str, Route], backends: Mapping[str, Backend], default_window: int) -> None:
        for name, route in routes.items():
            if route.backend not in backends:
                raise ValueError(f"model route {name!r} names unknown backend {route.backend!r}")
        self._routes = dict(routes)
        self._backends = dict(backends)
        self._default_window = default_window

    @property
    def model_names(self) -> list[str]:
        return sorted(name for name in self._routes if name != "*")

    def resolve(self, model: str) -> Resolved:
        route = self._routes.get(model) or self._routes.get("*")
        if route is None:
            raise TetherError(
                errors.MODEL_NOT_FOUND, f"The model '{model}' does not exist or you do not have access to it.",
                param="model", status=400,
            )
        return Resolved(
            model=model,
            backend=self._backends[route.backend],
            upstream_model=route.upstream_model or model,
            context_window=route.context_window or self._default_window,
        )
