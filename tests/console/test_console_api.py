"""The console's HTTP and WebSocket surface without a browser: token exchange, what a token is and
is not good for, tenant isolation, the admin-only server view, the workloads the race runs, and
the page's security headers."""

from __future__ import annotations

import base64
import json
import time

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tether import workloads
from tether.auth import Authenticator
from tether.backends.simulated import lab_script, parse_script
from tether.bridge.console import CSP, tokens
from tether.errors import TetherError
from tether.service.remote import ForwardingAuthenticator

from ..bridge.helpers import recv_response, send_json
from .conftest import KEY_A, KEY_ADMIN, KEY_B, KEYS, ConsoleStack, console_stack


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


async def mint(stack: ConsoleStack, key: str) -> dict:
    async with httpx.AsyncClient(base_url=stack.origin) as http:
        r = await http.post("/console/token", headers=bearer(key))
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    return r.json()


def token_ws(stack: ConsoleStack, token: str, **kwargs):
    protocols = [tokens.SUBPROTOCOL, tokens.TOKEN_SUBPROTOCOL_PREFIX + token]
    return connect(stack.ws_url, subprotocols=protocols, compression=None, **kwargs)  # type: ignore[arg-type]


async def refused(stack: ConsoleStack, token: str, **kwargs) -> tuple[int, dict]:
    with pytest.raises(InvalidStatus) as info:
        async with token_ws(stack, token, **kwargs):
            pass
    response = info.value.response
    return response.status_code, orjson.loads(response.body)


CREATE = {"type": "response.create", "model": "sim-model", "input": "hello", "include": ["tether:server_timing"]}


async def test_token_opens_a_websocket_as_its_tenant(stack: ConsoleStack) -> None:
    minted = await mint(stack, KEY_A)
    assert minted["admin"] is False and minted["expires_in"] == stack.config.server.console_token_ttl_s
    assert minted["subprotocols"] == [tokens.SUBPROTOCOL, "tether-token." + minted["token"]]
    async with token_ws(stack, minted["token"]) as ws:
        assert ws.subprotocol == tokens.SUBPROTOCOL
        await send_json(ws, {**CREATE, "store": True})
        done = (await recv_response(ws))[-1]
    assert done["type"] == "response.completed"
    text = done["response"]["output"][-1]["content"][0]["text"]
    assert text.startswith("This is Tether's simulated model")
    assert done["response"]["server_timing"]["stages_ms"]
    async with httpx.AsyncClient(base_url=stack.origin + "/v1") as http:  # stored under tenant "a"
        rid = done["response"]["id"]
        assert (await http.get(f"/responses/{rid}", headers=bearer(KEY_A))).status_code == 200
        assert (await http.get(f"/responses/{rid}", headers=bearer(KEY_B))).status_code == 404


async def test_token_is_not_an_api_key(stack: ConsoleStack) -> None:
    token = (await mint(stack, KEY_A))["token"]
    async with httpx.AsyncClient(base_url=stack.origin) as http:
        r = await http.post("/v1/responses", headers=bearer(token), json={"model": "sim-model", "input": "hi"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert (await http.post("/console/token", headers=bearer(token))).status_code == 401  # no renewal
        assert (await http.get("/console/api/workloads", headers=bearer(token))).status_code == 401
    with pytest.raises(InvalidStatus) as info:  # not as a bearer key on the handshake either
        async with connect(stack.ws_url, additional_headers=bearer(token)):
            pass
    assert info.value.response.status_code == 401
    with pytest.raises(TetherError):  # the authenticator every transport (gRPC too) uses
        Authenticator(KEYS).tenant_for(f"Bearer {token}")


async def test_expired_token_is_refused(stack: ConsoleStack) -> None:
    old = stack.console.tokens.mint("a", time.time() - stack.config.server.console_token_ttl_s - 1)
    status, body = await refused(stack, old.token)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert "expired" in body["error"]["message"]
    edge = stack.console.tokens.mint("a", time.time() - stack.config.server.console_token_ttl_s + 30)
    async with token_ws(stack, edge.token) as ws:  # 30 s left: still good
        assert ws.subprotocol == tokens.SUBPROTOCOL


async def test_forged_or_malformed_tokens_are_refused(stack: ConsoleStack) -> None:
    token = (await mint(stack, KEY_A))["token"]
    prefix, payload, mac = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["t"] = "b"  # another tenant, same signature
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    other_keys = tokens.ConsoleTokens(Authenticator({"sk-other": "a"}).token_secret() or b"", 300)
    for bad in (f"{prefix}.{forged}.{mac}", "tct1.x.y", "nonsense", "", other_keys.mint("a", time.time()).token):
        status, body = await refused(stack, bad)
        assert status == 401 and "not valid" in body["error"]["message"], bad


async def test_a_token_only_reaches_its_own_tenant(stack: ConsoleStack) -> None:
    async with httpx.AsyncClient(base_url=stack.origin + "/v1") as http:
        r = await http.post("/responses", headers=bearer(KEY_B), json={"model": "sim-model", "input": "b's secret", "store": True})
        b_response = r.json()["id"]
    token = (await mint(stack, KEY_A))["token"]
    async with token_ws(stack, token) as ws:
        await send_json(ws, {**CREATE, "previous_response_id": b_response})
        events = await recv_response(ws)
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["code"] == "previous_response_not_found"


async def test_server_view_is_for_admin_keys_only(stack: ConsoleStack) -> None:
    async with httpx.AsyncClient(base_url=stack.origin) as http:
        await http.post("/v1/responses", headers=bearer(KEY_A), json={"model": "sim-model", "input": "hi"})
        r = await http.get("/console/api/server", headers=bearer(KEY_A))
        assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
        assert (await http.get("/console/api/server")).status_code == 401
        assert (await mint(stack, KEY_ADMIN))["admin"] is True
        snap = (await http.get("/console/api/server", headers=bearer(KEY_ADMIN))).json()
    assert snap["turns"] == {"completed": 1.0}
    assert snap["active_responses"] == 0
    assert snap["stages"]["backend"]["count"] == 1 and snap["stages"]["backend"]["mean_ms"] >= 0
    assert set(snap["cache"]) == {"hits", "misses", "hit_ratio"}


async def test_workload_api_serves_what_the_bench_runs(stack: ConsoleStack) -> None:
    async with httpx.AsyncClient(base_url=stack.origin + "/console/api") as http:
        listed = (await http.get("/workloads", headers=bearer(KEY_A))).json()["data"]
        wl = (await http.get("/workloads/chat3?speed=4000@5:10", headers=bearer(KEY_A))).json()
        assert (await http.get("/workloads/chat3?speed=fast", headers=bearer(KEY_A))).status_code == 400
        assert (await http.get("/workloads/nope", headers=bearer(KEY_A))).status_code == 404
    assert [w["name"] for w in listed] == workloads.available()
    bench = workloads.load("chat3")
    assert wl["model"] == "tether-lab/chat3@4000@5:10"
    assert wl["instructions"] == bench.instructions and wl["tools"] == list(bench.tools)
    assert wl["user_message"] == bench.user_message() and wl["turns"] == bench.turns
    for i, step in enumerate(bench.steps):
        assert wl["steps"][i]["calls"] == [c.name for c in step.calls]
        assert wl["steps"][i]["outputs"] == [bench.tool_output(i, j) for j in range(len(step.calls))]
    # The simulated model plays the script `tether bench` generates for that workload and speed.
    speed = workloads.SpeedProfile.parse("4000@5:10")
    assert lab_script(wl["model"]).steps == parse_script(bench.simulated_script(speed)).steps


async def test_unknown_lab_model_is_a_clear_error(stack: ConsoleStack) -> None:
    async with httpx.AsyncClient(base_url=stack.origin + "/v1") as http:
        r = await http.post("/responses", headers=bearer(KEY_A), json={"model": "tether-lab/nope", "input": "x"})
    failed = r.json()
    assert failed["status"] == "failed" and failed["error"]["tether_code"] == "model_not_found"
    assert failed["error"]["code"] == "invalid_prompt"  # the API's closed list (docs/errors.md)
    assert "chat3" in failed["error"]["message"]


async def test_page_and_files_are_served_with_a_strict_policy(stack: ConsoleStack) -> None:
    async with httpx.AsyncClient(base_url=stack.origin) as http:
        page = await http.get("/console")
        assert page.status_code == 200 and page.headers["content-security-policy"] == CSP
        assert "script-src 'self'" in CSP and "unsafe" not in CSP and "connect-src 'self'" in CSP
        assert "<script" in page.text and "src=\"/console/static/main.js\"" in page.text
        js = await http.get("/console/static/main.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        for bad in ("/console/static/..%2Fconsole.css", "/console/static/nope.js", "/console/static/__init__.py"):
            assert (await http.get(bad)).status_code == 404, bad
    html = page.text
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # no CDN


async def test_console_off_means_no_page_and_no_tokens() -> None:
    async with console_stack(console=False) as stack:
        async with httpx.AsyncClient(base_url=stack.origin) as http:
            assert (await http.get("/console")).status_code == 404
            assert (await http.post("/console/token", headers=bearer(KEY_A))).status_code == 404
        token = tokens.ConsoleTokens(Authenticator(KEYS).token_secret() or b"", 300).mint("a", time.time())
        status, _ = await refused(stack, token.token)
        assert status == 401


async def test_open_server_needs_no_token_and_is_its_own_admin() -> None:
    async with console_stack(Authenticator({})) as stack:
        minted = await mint(stack, "")
        assert minted["admin"] is True
        async with token_ws(stack, minted["token"]) as ws:
            assert ws.subprotocol == tokens.SUBPROTOCOL


async def test_a_forwarding_bridge_cannot_mint_tokens() -> None:
    async with console_stack(ForwardingAuthenticator()) as stack, httpx.AsyncClient(base_url=stack.origin) as http:
        r = await http.post("/console/token", headers=bearer(KEY_A))
    assert r.status_code == 501 and r.json()["error"]["code"] == "not_implemented"


def test_token_lifetime_edge() -> None:
    minter = tokens.ConsoleTokens(b"secret", ttl_s=10)
    token = minter.mint("a", now=1000.0).token
    assert minter.check(token, 1009.999) == (tokens.TokenCheck.VALID, "a")
    assert minter.check(token, 1010.0) == (tokens.TokenCheck.EXPIRED, "")
    assert tokens.ConsoleTokens(b"other", ttl_s=10).check(token, 1000.0)[0] is tokens.TokenCheck.BAD_SIGNATURE
    with pytest.raises(ValueError, match="console_token_ttl_s"):
        tokens.ConsoleTokens(b"secret", ttl_s=0)
