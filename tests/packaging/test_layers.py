"""The runtime's layers, read from the source (`tether_lab.import_graph`, strict: TYPE_CHECKING and
function-level imports count): no cycle at all; the core reports through its telemetry port and
knows no transport and no observability; observability and the backends know no core; a turn
knows neither its session nor the engine."""

from __future__ import annotations

from tether.core.telemetry import Telemetry
from tether.observability.telemetry import Observability
from tether_lab import import_graph

EDGES = import_graph.graph()


def _offenders(importer: str, imported: tuple[str, ...]) -> list[tuple[str, str]]:
    return sorted(
        (module, target)
        for module, targets in EDGES.items()
        if module == importer or module.startswith(importer + ".")
        for target in targets
        if any(target == name or target.startswith(name + ".") for name in imported)
    )


def test_no_cycle_even_counting_type_checking_and_lazy_imports() -> None:
    assert import_graph.cycles(EDGES) == []


def test_the_core_imports_no_transport_no_observability_and_no_composition_root() -> None:
    banned = ("tether.observability", "tether.bridge", "tether.service", "tether.server", "tether.client")
    assert _offenders("tether.core", banned) == []


def test_observability_and_backends_import_no_core() -> None:
    assert _offenders("tether.observability", ("tether.core",)) == []
    assert _offenders("tether.backends", ("tether.core",)) == []


def test_a_turn_knows_neither_its_session_nor_the_engine() -> None:
    assert _offenders("tether.core.turn", ("tether.core.session", "tether.core.engine")) == []
    assert _offenders("tether.core.context", ("tether.core.session", "tether.core.engine")) == []


def test_observability_implements_every_method_of_the_telemetry_port() -> None:
    port = [name for name in vars(Telemetry) if not name.startswith("_")]
    assert len(port) >= 15
    assert [name for name in port if not callable(getattr(Observability, name, None))] == []
