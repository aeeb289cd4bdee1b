"""The error catalogue (`tether.errors.CATALOGUE`) is the one place a code's statuses live: every
code has a row, no raise site says otherwise, the gRPC names are real, and docs/errors.md shows
the table as it is."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import grpc
from openai.types.responses.response_error import ResponseError

from tether import errors
from tether.errors import CATALOGUE, TetherError
from tether.protocol import wire

ROOT = Path(__file__).resolve().parents[2]
RAISERS = {"TetherError", "BackendError", "ConnectionLost", "ToolLoopError"}


def code_constants() -> dict[str, str]:
    """Every code constant of tether/errors.py, by name."""
    return {
        name: value
        for name, value in vars(errors).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }


def test_every_code_has_one_catalogue_row() -> None:
    codes = code_constants()
    assert len(codes) > 40
    assert sorted(set(codes.values()) - set(CATALOGUE)) == []  # a code without a row
    assert sorted(set(CATALOGUE) - set(codes.values())) == []  # a row without a code
    assert len(set(codes.values())) == len(codes)  # two constants for one code


def test_rows_are_well_formed() -> None:
    for code, kind in CATALOGUE.items():
        assert kind.grpc in grpc.StatusCode.__members__, code
        assert 400 <= kind.http <= 599, code
        assert kind.type in {
            "invalid_request_error", "authentication_error", "permission_error", "rate_limit_error", "server_error",
        }, code
        assert (kind.type == "server_error") == (kind.http >= 500), code


def test_every_code_maps_into_the_sdks_response_error_codes() -> None:
    """A failed Response's JSON `error.code` is the row's `response_code`, which must be a value
    of the closed list the openai SDK types `ResponseError.code` with (read from the SDK)."""
    sdk_codes = set(typing.get_args(ResponseError.model_fields["code"].annotation))
    assert {"server_error", "rate_limit_exceeded", "invalid_prompt"} <= sdk_codes
    outside = {code: k.response_code for code, k in CATALOGUE.items() if k.response_code not in sdk_codes}
    assert outside == {}
    assert all(errors.response_code(code) == kind.response_code for code, kind in CATALOGUE.items())
    # The turn-redo codes, the backend's failures and the limits map by meaning.
    redo_or_backend = (errors.SERVER_SHUTTING_DOWN, errors.CONNECTION_LIMIT_REACHED, errors.BACKEND_ERROR)
    assert {errors.response_code(c) for c in (*redo_or_backend, errors.BACKEND_TIMEOUT)} == {"server_error"}
    assert errors.response_code(errors.CONTEXT_LENGTH_EXCEEDED) == "invalid_prompt"
    assert errors.response_code(errors.QUEUE_FULL) == "rate_limit_exceeded"
    assert errors.response_code("a_peer_code") == "server_error"


def test_an_error_takes_its_statuses_from_the_catalogue() -> None:
    err = TetherError(errors.REQUEST_TOO_LARGE, "too large")
    assert (err.status, err.type) == (413, "invalid_request_error")
    assert wire.grpc_status_for(err) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert TetherError(errors.ITEM_TOO_LARGE, "x").status == 400
    assert TetherError(errors.UNSUPPORTED, "x").status == 400
    assert TetherError(errors.NOT_IMPLEMENTED, "x").status == 501
    assert wire.grpc_status_for(TetherError(errors.RESPONSE_NOT_FOUND, "x")) == grpc.StatusCode.NOT_FOUND
    # An error rebuilt from a peer keeps the peer's word, and a code this side does not know
    # maps by its status.
    foreign = TetherError("newer_code", "x", status=404)
    assert (foreign.type, wire.grpc_status_for(foreign)) == ("invalid_request_error", grpc.StatusCode.NOT_FOUND)
    assert TetherError.from_proto(TetherError(errors.IDLE_TIMEOUT, "x").to_proto()).status == 408


def _raise_sites() -> list[tuple[str, int, str, ast.expr]]:
    """(file, line, code constant, status expression) of every raise site that passes `status=`
    with a code constant."""
    found = []
    codes = code_constants()
    for path in sorted((ROOT / "tether").rglob("*.py")):
        if "responses" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in RAISERS:
                continue
            first = node.args[0]
            const = first.id if isinstance(first, ast.Name) else getattr(first, "attr", None)
            if const not in codes:
                continue
            for kw in node.keywords:
                if kw.arg == "status":
                    found.append((str(path.relative_to(ROOT)), node.lineno, codes[const], kw.value))
    return found


def test_no_raise_site_gives_a_code_another_status() -> None:
    wrong = [
        f"{path}:{line} {code} status={ast.unparse(value)} (catalogue: {CATALOGUE[code].http})"
        for path, line, code, value in _raise_sites()
        if not (isinstance(value, ast.Constant) and value.value == CATALOGUE[code].http)
    ]
    assert wrong == []


def test_docs_show_the_catalogue() -> None:
    text = (ROOT / "docs" / "errors.md").read_text()
    assert errors.markdown_table() in text, "regenerate the table: python -c 'from tether.errors import markdown_table; print(markdown_table())'"
