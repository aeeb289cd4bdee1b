"""Ids are checked by shape before they reach a store key: on every store, every endpoint that
takes a response, conversation or item id answers an id no such thing can have (a key suffix
such as `<own id>:ev`, which on Redis names the run's event stream; a NUL; a hash tag; a very long
one) with its 404 (or the create's 400), never a 500."""

from __future__ import annotations

import secrets
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.store.conftest import RUN_ID
from tests.support.configs import instant_config
from tests.support.stacks import running_stack
from tether.auth import Authenticator


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    tag = f"ids{secrets.token_hex(3)}"
    if request.param == "redis":
        return f"{request.getfixturevalue('redis_url')}?prefix=tether_test:{RUN_ID}:{tag}"
    if request.param == "postgres":
        return f"{request.getfixturevalue('pg_url')}?schema=tether_test_{RUN_ID}_{tag}"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tether.db'}"
    return "memory://"


async def test_ids_of_the_wrong_shape_are_404_on_every_endpoint(store_url: str) -> None:
    cfg = instant_config()
    cfg.store = store_url
    async with running_stack(Authenticator({}), config=cfg) as st:
        async with httpx.AsyncClient(base_url=st.base_url, timeout=10) as http:
            created = (await http.post("/responses", json={"model": "sim-model", "input": "hi", "background": True}))
            rid = created.json()["id"]
            conv = (await http.post("/conversations", json={"items": [{"role": "user", "content": "hi"}]})).json()["id"]
            assert (await http.get(f"/responses/{rid}")).status_code == 200
            bad_ids = [f"{rid}:ev", f"{rid}\x00", "resp_{t:x}", "r" * 5000, f"{conv}:ci", "../" + rid]
            for bad in bad_ids:
                b = quote(bad, safe="")
                for method, path in [("GET", f"/responses/{b}"), ("GET", f"/responses/{b}?stream=true"),
                                     ("POST", f"/responses/{b}/cancel"), ("DELETE", f"/responses/{b}"),
                                     ("GET", f"/responses/{b}/input_items"), ("GET", f"/conversations/{b}"),
                                     ("POST", f"/conversations/{b}"), ("DELETE", f"/conversations/{b}"),
                                     ("GET", f"/conversations/{b}/items"), ("POST", f"/conversations/{b}/items"),
                                     ("GET", f"/conversations/{conv}/items/{b}"),
                                     ("DELETE", f"/conversations/{conv}/items/{b}")]:  # fmt: skip
                    body = {"metadata": {}} if path.startswith("/conversations/") and method == "POST" else None
                    if path.endswith("/items") and method == "POST":
                        body = {"items": [{"role": "user", "content": "x"}]}
                    r = await http.request(method, path, json=body)
                    assert r.status_code in (400, 404), (method, path[:80], r.status_code, r.text[:300])
                    assert r.json()["error"]["code"], r.text[:300]
                for field in ("previous_response_id", "conversation"):
                    r = await http.post("/responses", json={"model": "sim-model", "input": "x", field: bad})
                    assert r.status_code in (400, 404), (field, bad[:80], r.status_code, r.text[:300])
            assert (await http.get(f"/responses/{rid}")).status_code == 200  # nothing was harmed
