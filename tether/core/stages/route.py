"""Model resolution: a model name or alias -> (backend instance, upstream model, context window).

The routing table comes from config (`[models.<name>]`, with "*" catching every other name only
when configured), plus the model ids each backend lists at startup (`Backend.discover`), which
route to that backend unless config routes them elsewhere. Any other name is `model_not_found`.
Sessions memoise results, so a connection resolves each model name once.

`Router.listing` is what a client can ask for (GET /v1/models, gRPC ListModels, the startup
banner): every routed name, then the names the "*" route's backend is known to serve
(`Backend.catch_all_models`: the simulated model's default name and the lab's workload models),
each with the `owned_by` its backend reports.
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


@dataclass(frozen=True)
class Listed:
    """One name a client can use: the backend it routes to and the `owned_by` that backend reports."""

    model: str
    backend: str  # the configured backend name
    owned_by: str
    source: str  # "config" (a [models] route), "discovered" (the backend listed it) or "*" (the catch-all)


class Router:
    def __init__(self, routes: Mapping[str, Route], backends: Mapping[str, Backend], default_window: int) -> None:
        for name, route in routes.items():
            if route.backend not in backends:
                raise ValueError(f"model route {name!r} names unknown backend {route.backend!r}")
        self._routes = dict(routes)
        self._backends = dict(backends)
        self._default_window = default_window
        self._discovered: set[str] = set()

    def add_discovered(self, backend: str, models: list[str] | tuple[str, ...]) -> int:
        """Route the ids `backend` listed to it (configured names win); returns how many were added."""
        added = 0
        for model in models:
            if model not in self._routes and model != "*":
                self._routes[model] = Route(backend=backend, upstream_model=model)
                self._discovered.add(model)
                added += 1
        return added

    @property
    def catch_all(self) -> str | None:
        """The backend answering names nobody routed (the "*" route), if one is configured."""
        route = self._routes.get("*")
        return route.backend if route else None

    def listing(self) -> list[Listed]:
        """Every name a client can use: the routed ones (sorted), then those the "*" route's
        backend serves that no route names."""
        out = []
        for name, route in sorted(self._routes.items()):
            if name != "*":
                owner = self._backends[route.backend].owned_by(route.upstream_model or name)
                out.append(Listed(name, route.backend, owner, "discovered" if name in self._discovered else "config"))
        star = self._routes.get("*")
        if star is not None:
            backend = self._backends[star.backend]
            for name in backend.catch_all_models():
                if name not in self._routes:
                    out.append(Listed(name, star.backend, backend.owned_by(name), "*"))
        return out

    def resolve(self, model: str) -> Resolved:
        route = self._routes.get(model) or self._routes.get("*")
        if route is None:
            raise TetherError(
                errors.MODEL_NOT_FOUND, f"The model '{model}' does not exist or you do not have access to it.",
                param="model",
            )
        return Resolved(
            model=model,
            backend=self._backends[route.backend],
            upstream_model=route.upstream_model or model,
            context_window=route.context_window or self._default_window,
        )
