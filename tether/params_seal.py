"""Sealing a queued background run's create params for the replicas that may take it over.

With a Redis or PostgreSQL store a queued background run publishes its create params, so that
another replica can run it when its own replica dies before it starts (`tether.core.shared_runs`).
A create whose `mcp` tools carry credentials (`headers`, `authorization`) must not put them at
rest in plaintext: its params are sealed instead, with authenticated encryption under a key every
replica shares (`[server] reasoning_key`, the key the replicas already share for reasoning items;
a sub-key is derived from it for this purpose only).

The construction uses the standard library only: a keystream from SHAKE-256(enc key, nonce)
XORed with the params, then HMAC-SHA256(mac key, tenant, run id, nonce, ciphertext)
(encrypt-then-MAC): confidential, tamper-evident, and bound to the run (a blob copied to another
run or tenant does not open). A sealed blob starts with a byte (0xFF) no serialized protobuf
message starts with, so `open` tells sealed from plain params. The store deletes the params when
the run leaves `queued` (it started, or ended), so nothing sealed outlives the run's queue time.

A replica without the key (no shared `reasoning_key`: each process makes its own) cannot open the
blob: the run it claimed then fails with `mcp_credentials_unavailable` instead of running without
the credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from tether.responses.v1 import request_pb2

MAGIC = b"\xfftether.params.s1\x00"
_NONCE = 16
_TAG = 32


class SealError(Exception):
    """A sealed blob this key did not make for this run, or one that was altered."""


def carries_credentials(params: request_pb2.ResponseCreateParams) -> bool:
    """Whether an `mcp` tool of the create holds credentials (headers or authorization)."""
    return any(t.WhichOneof("tool") == "mcp" and (t.mcp.headers or t.mcp.HasField("authorization"))
               for t in params.tools)  # fmt: skip


class ParamsSealer:
    def __init__(self, key: str | None) -> None:
        root = key.encode() if key else secrets.token_bytes(32)
        self._enc = hmac.new(root, b"tether/run-params/enc", hashlib.sha256).digest()
        self._mac = hmac.new(root, b"tether/run-params/mac", hashlib.sha256).digest()

    def _tag(self, tenant: str, run_id: str, nonce: bytes, body: bytes) -> bytes:
        aad = tenant.encode() + b"\0" + run_id.encode() + b"\0"
        return hmac.new(self._mac, aad + nonce + body, hashlib.sha256).digest()

    def _xor(self, nonce: bytes, data: bytes) -> bytes:
        stream = hashlib.shake_256(self._enc + nonce).digest(len(data))
        return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(len(data), "little")

    def publishable(self, tenant: str, run_id: str, params: request_pb2.ResponseCreateParams) -> bytes:
        """The params as the store may keep them: sealed when they carry MCP credentials."""
        raw = params.SerializeToString()
        if not carries_credentials(params):
            return raw
        nonce = secrets.token_bytes(_NONCE)
        body = self._xor(nonce, raw)
        return MAGIC + nonce + body + self._tag(tenant, run_id, nonce, body)

    def open(self, tenant: str, run_id: str, blob: bytes) -> request_pb2.ResponseCreateParams:
        """The params back from what `publishable` made (raises SealError for a sealed blob this
        key did not make for this run)."""
        if not blob.startswith(MAGIC):
            return request_pb2.ResponseCreateParams.FromString(blob)
        rest = blob[len(MAGIC) :]
        if len(rest) < _NONCE + _TAG:
            raise SealError("truncated")
        nonce, body, tag = rest[:_NONCE], rest[_NONCE:-_TAG], rest[-_TAG:]
        if not hmac.compare_digest(tag, self._tag(tenant, run_id, nonce, body)):
            raise SealError("the sealed params do not open with this replica's key")
        return request_pb2.ResponseCreateParams.FromString(self._xor(nonce, body))
