"""Sealing a takeable run's create params (tether/params_seal.py): params with MCP credentials
are sealed (no credential in the bytes), open with the shared key for the same tenant and run
only, and tampering is detected; params without credentials stay plain protobuf."""

from __future__ import annotations

import pytest

from tether.params_seal import MAGIC, ParamsSealer, SealError
from tether.responses.v1 import request_pb2


def params(**mcp: object) -> request_pb2.ResponseCreateParams:
    p = request_pb2.ResponseCreateParams(model="m")
    tool = p.tools.add()
    tool.mcp.server_label, tool.mcp.server_url = "dice", "https://mcp.example.com/mcp"
    for key, value in mcp.items():
        if key == "headers":
            tool.mcp.headers.update(value)  # type: ignore[arg-type]
        else:
            setattr(tool.mcp, key, value)
    return p


def test_credentials_are_sealed_and_open_only_for_their_run_with_the_shared_key() -> None:
    original = params(headers={"X-Api-Key": "hdr-secret-1"}, authorization="tok-secret-2")
    a, b = ParamsSealer("shared"), ParamsSealer("shared")
    blob = a.publishable("tenant", "resp_1", original)
    assert blob.startswith(MAGIC) and b"hdr-secret-1" not in blob and b"tok-secret-2" not in blob
    assert b.open("tenant", "resp_1", blob) == original  # another replica, the same key
    for tenant, run_id in (("other", "resp_1"), ("tenant", "resp_2")):
        with pytest.raises(SealError):
            b.open(tenant, run_id, blob)
    with pytest.raises(SealError):
        ParamsSealer("another key").open("tenant", "resp_1", blob)
    with pytest.raises(SealError):
        ParamsSealer(None).open("tenant", "resp_1", blob)  # a replica with a key of its own
    tampered = bytearray(blob)
    tampered[len(MAGIC) + 20] ^= 1
    with pytest.raises(SealError):
        b.open("tenant", "resp_1", bytes(tampered))
    with pytest.raises(SealError):
        b.open("tenant", "resp_1", MAGIC + b"short")


def test_params_without_credentials_stay_plain() -> None:
    plain = params()
    blob = ParamsSealer("k").publishable("tenant", "resp_1", plain)
    assert blob == plain.SerializeToString()
    assert ParamsSealer("another").open("tenant", "resp_1", blob) == plain
