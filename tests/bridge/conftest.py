"""Fixtures for the bridge suite: a real Engine (memory store, instant simulated backend) behind a
real bridge on 127.0.0.1:0, and clients: the official SDK and a raw `websockets` client.

Two API keys: `sk-a` (tenant "a") and `sk-b` (tenant "b").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.support.stacks import Stack, running_stack
from tether.auth import Authenticator

from .helpers import KEY_A, KEY_B


@pytest.fixture
def authenticator() -> Authenticator:
    return Authenticator({KEY_A: "a", KEY_B: "b"})


@pytest.fixture
async def stack(authenticator: Authenticator) -> AsyncIterator[Stack]:
    async with running_stack(authenticator) as s:
        yield s


@pytest.fixture
def make_stack(authenticator: Authenticator) -> Callable[..., Any]:
    """`async with make_stack(backend={...}, max_lanes=2) as stack:` for other settings."""
    return lambda backend=None, **limits: running_stack(authenticator, backend, **limits)


@pytest.fixture
async def grpc_port(stack: Stack, authenticator: Authenticator) -> AsyncIterator[int]:
    """The gRPC service on the same engine as `stack` (127.0.0.1, port 0)."""
    yield stack.grpc_port


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[AsyncOpenAI]:
    async with stack.client() as c:
        yield c
