"""The hosted `mcp` tool inside a turn: list the servers' tools, let the model call them, run the
calls, and call the model again, all within one response (docs/mcp.md).

A create whose `tools` hold `{"type": "mcp", ...}` entries gets an `McpLoop` (`McpLoop.of`); the
standard turn kind hands its backend steps to `McpLoop.steps`, a step function over the turn's
`StepIO` like any kind (tether.core.kinds):

1. listing: a server whose `mcp_list_tools` item is in the history is not listed again (the
   model gets the tools that item names); any other is listed through the connection's session
   (`tether.mcp.sessions`: one initialised session per server for the connection's life, whose
   list is reused without asking the server again) and gets an `mcp_list_tools` item, with `error`
   set when listing failed (the response goes on without that server's tools);
2. approvals: each `mcp_approval_response` in the new input that approves a request Tether issued
   (its id signs it: `approval_id`) runs that call now (an `mcp_call` item with
   `approval_request_id`); a denial is left for the model to read;
3. model calls: the MCP tools go to the backend as function tools (routed back by name:
   `OutputBuilder.mcp_routes`). Each MCP call the model makes is run and its `mcp_call` item gets
   `output` or `error` (a failing, hanging or oversized server fails that call only), then the
   model is called again, until it answers, calls a client tool, asks for an approval
   (`require_approval`), or `max_tool_calls` is reached. Every call, approved or not, is checked
   against the create's `allowed_tools` when it runs (`_call_allowed`). Past `[mcp] max_calls_per_response` the
   MCP tools are withdrawn and the model answers with what it has.

Usage sums every model call of the response. `headers` and `authorization` reach the HTTP client
only; the Response's `tools` carry neither (`redacted_tools`).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import orjson

from tether import errors, ids, render
from tether.backends.base import Finish, Usage
from tether.config import McpConfig
from tether.core.accounting import add_usage
from tether.core.builder import McpRoute, OutputBuilder
from tether.core.kinds import Prepared, StepIO
from tether.errors import TetherError
from tether.mcp.client import (
    REFUSED,
    TIMEOUT,
    TOO_LARGE,
    McpFailure,
    McpServerSession,
    SessionGone,
    protocol_error,
)
from tether.mcp.policy import McpPolicy
from tether.protocol.calls import call_of
from tether.reasoning_codec import ReasoningSealer
from tether.responses.v1 import items_pb2, request_pb2

_APPROVAL_MODES = ("always", "never")


# -- validation (before response.created) ------------------------------------------------------------


def mcp_tools(params: request_pb2.ResponseCreateParams) -> list[tuple[int, request_pb2.McpTool]]:
    return [(i, t.mcp) for i, t in enumerate(params.tools) if t.WhichOneof("tool") == "mcp"]


def validate(params: request_pb2.ResponseCreateParams, config: McpConfig) -> list[tuple[int, request_pb2.McpTool]]:
    """The create's MCP tools, each checked; a 400 naming the field that is not acceptable."""
    servers = mcp_tools(params)
    choice = _choice_object(params)
    if not servers:
        if choice is not None and choice.get("type") == "mcp":
            raise TetherError(errors.INVALID_REQUEST, "tool_choice names an MCP server, and 'tools' has no mcp tool.",
                              param="tool_choice")  # fmt: skip
        return servers
    if len(servers) > config.max_servers_per_request:
        raise TetherError(errors.INVALID_REQUEST, f"At most {config.max_servers_per_request} mcp tools are allowed "
                          "([mcp] max_servers_per_request).", param="tools")  # fmt: skip
    policy = McpPolicy(config)
    labels: set[str] = set()
    for i, tool in servers:
        where = f"tools[{i}]"
        extra = orjson.loads(params.tools[i].extra_json) if params.tools[i].extra_json else {}
        for key in sorted(k for k, v in extra.items() if v is not None):  # an explicit null is "not set"
            raise TetherError(errors.UNSUPPORTED_PARAMETER,
                              f"'{where}.{key}' is not supported on an mcp tool by this server.",
                              param=f"{where}.{key}")  # fmt: skip
        if tool.HasField("connector_id"):
            raise TetherError(errors.UNSUPPORTED_PARAMETER, "Connectors are not supported: name a remote MCP "
                              "server with server_url.", param=f"{where}.connector_id")  # fmt: skip
        if not tool.server_label or not all(c.isalnum() or c in "_-" for c in tool.server_label):
            raise TetherError(errors.INVALID_REQUEST, f"'{where}.server_label' must be a non-empty name of letters, "
                              "digits, '_' and '-'.", param=f"{where}.server_label")  # fmt: skip
        if tool.server_label in labels:
            raise TetherError(errors.INVALID_REQUEST, f"Duplicate server_label {tool.server_label!r}.",
                              param=f"{where}.server_label")  # fmt: skip
        labels.add(tool.server_label)
        if not tool.server_url:
            raise TetherError(errors.MISSING_REQUIRED_PARAMETER, f"'{where}.server_url' is required.",
                              param=f"{where}.server_url")  # fmt: skip
        policy.check_url(tool.server_url, f"{where}.server_url")
        if tool.WhichOneof("approval") == "approval_mode" and tool.approval_mode not in _APPROVAL_MODES:
            raise TetherError(errors.INVALID_REQUEST, f"'{where}.require_approval' must be always, never or a "
                              "filter object.", param=f"{where}.require_approval")  # fmt: skip
    if choice is not None and choice.get("type") == "mcp" and choice.get("server_label") not in labels:
        raise TetherError(errors.INVALID_REQUEST, "tool_choice names an MCP server_label that is not in 'tools'.",
                          param="tool_choice")  # fmt: skip
    return servers


_APPROVAL = b"mcp-approval"


def _approval_mac(sealer: ReasoningSealer, tenant: str, nonce: str, request: items_pb2.McpApprovalRequest) -> str:
    fields = "\0".join((nonce, request.server_label, request.name, request.arguments)).encode()
    return sealer.mac(tenant, _APPROVAL, fields)[:16].hex()


def approval_id(sealer: ReasoningSealer, tenant: str, request: items_pb2.McpApprovalRequest) -> str:
    """The id of an approval request Tether issues: `mcpr_` + a nonce + a MAC (under the
    replicas' shared key) of the tenant, the nonce and what it asks (server, tool, arguments),
    so that only a request Tether issued to this tenant, unaltered, can be approved."""
    nonce = secrets.token_hex(8)
    return f"mcpr_{nonce}{_approval_mac(sealer, tenant, nonce, request)}"


def issued(sealer: ReasoningSealer, tenant: str, request: items_pb2.McpApprovalRequest) -> bool:
    """Whether Tether issued `request` to `tenant`, as it stands (see `approval_id`)."""
    rid = request.id
    if not rid.startswith("mcpr_") or len(rid) != 5 + 16 + 32:
        return False
    nonce, mac = rid[5:21], rid[21:]
    return hmac.compare_digest(mac, _approval_mac(sealer, tenant, nonce, request))


def check_approval_responses(items: Sequence[items_pb2.Item], history: Iterable[items_pb2.Item],
                             sealer: ReasoningSealer, tenant: str) -> None:  # fmt: skip
    """Each `mcp_approval_response` answers an `mcp_approval_request` of the history or the input
    that Tether issued to this tenant, unaltered (`issued`): a request a client wrote itself (into
    the input, or into an earlier turn's input) cannot be approved."""
    answers = [(i, item.mcp_approval_response) for i, item in enumerate(items)
               if item.WhichOneof("item") == "mcp_approval_response"]  # fmt: skip
    if not answers:
        return
    requests = {it.mcp_approval_request.id: it.mcp_approval_request for it in (*history, *items)
                if it.WhichOneof("item") == "mcp_approval_request"}  # fmt: skip
    for i, answer in answers:
        request = requests.get(answer.approval_request_id)
        if request is None:
            raise TetherError(errors.INVALID_ITEM, f"No mcp_approval_request with id {answer.approval_request_id!r} "
                              "in this conversation.", param=f"input[{i}].approval_request_id")  # fmt: skip
        if not issued(sealer, tenant, request):
            raise TetherError(errors.INVALID_ITEM, f"The mcp_approval_request {answer.approval_request_id!r} was not "
                              "issued by this server for this API key, or was altered: only a request Tether made can "
                              "be approved.", param=f"input[{i}].approval_request_id")  # fmt: skip


def redacted_tools(tools: Sequence[request_pb2.Tool]) -> Sequence[request_pb2.Tool]:
    """The tools as a Response echoes (and the store keeps) them: MCP credentials removed. With
    no MCP tool (the common case) `tools` themselves, not a copy."""
    for tool in tools:
        if tool.WhichOneof("tool") == "mcp":
            break
    else:
        return tools
    out = []
    for tool in tools:
        if tool.WhichOneof("tool") == "mcp" and (tool.mcp.headers or tool.mcp.HasField("authorization")):
            copy = request_pb2.Tool()
            copy.CopyFrom(tool)
            tool = copy
            tool.mcp.headers.clear()
            tool.mcp.ClearField("authorization")
        out.append(tool)
    return out


def _choice_object(params: request_pb2.ResponseCreateParams) -> dict | None:
    if params.tool_choice.WhichOneof("choice") != "other_json":
        return None
    try:
        choice = orjson.loads(params.tool_choice.other_json)
    except orjson.JSONDecodeError:
        return None
    return choice if isinstance(choice, dict) else None


# -- the loop --------------------------------------------------------------------------------------


def _matches(rule: request_pb2.McpToolFilter, name: str, read_only: bool) -> bool:
    if not rule.tool_names and not rule.HasField("read_only"):
        return False
    if rule.tool_names and name not in rule.tool_names:
        return False
    return not rule.HasField("read_only") or rule.read_only == read_only


def allowed(tool: request_pb2.McpTool, name: str, read_only: bool) -> bool:
    arm = tool.WhichOneof("allowed")
    if arm == "allowed_names":
        return name in tool.allowed_names.names
    if arm == "allowed_filter":
        return _matches(tool.allowed_filter, name, read_only)
    return True


def needs_approval(tool: request_pb2.McpTool, name: str, read_only: bool) -> bool:
    """`require_approval`: unset or "always" asks (OpenAI's default); a filter object asks unless
    `never` covers the tool (and asks when `always` does, or neither)."""
    arm = tool.WhichOneof("approval")
    if arm == "approval_mode":
        return tool.approval_mode != "never"
    if arm == "approval_filter":
        f = tool.approval_filter
        if f.HasField("always") and _matches(f.always, name, read_only):
            return True
        return not (f.HasField("never") and _matches(f.never, name, read_only))
    return True


@dataclass
class _Server:
    index: int  # tools[i]
    tool: request_pb2.McpTool
    tools: list[items_pb2.McpToolInfo] = field(default_factory=list)


def _own_name(tool: request_pb2.Tool) -> str:
    """The name of a function or custom tool of the create ("" for any other)."""
    if tool.WhichOneof("tool") == "function":
        return tool.function.name
    if tool.WhichOneof("tool") == "other" and tool.other.type == "custom":
        name = orjson.loads(tool.other.json).get("name")
        return name if isinstance(name, str) else ""
    return ""


def _read_only(info: items_pb2.McpToolInfo) -> bool:
    try:
        return bool(info.annotations_json and orjson.loads(info.annotations_json).get("readOnlyHint"))
    except (orjson.JSONDecodeError, AttributeError):
        return False


class McpLoop:
    """The MCP side of one turn (see the module docstring)."""

    def __init__(self, servers: list[tuple[int, request_pb2.McpTool]], config: McpConfig,
                 taken: frozenset[str] = frozenset()) -> None:  # fmt: skip
        self.servers = {tool.server_label: _Server(i, tool) for i, tool in servers}
        self.config = config
        self.taken = taken  # names of the create's own tools: an MCP tool of the same name is not offered
        self.calls = 0  # MCP calls run in this response

    @classmethod
    def of(cls, params: request_pb2.ResponseCreateParams, config: McpConfig) -> McpLoop | None:
        servers = validate(params, config)
        if not servers:
            return None
        return cls(servers, config, frozenset(filter(None, map(_own_name, params.tools))))

    # -- what the backend sees --------------------------------------------------------------------

    def backend_tools(self, tools: Sequence[request_pb2.Tool], *, with_mcp: bool) -> list[request_pb2.Tool]:
        """The create's own tools (without the mcp entries) plus each listed MCP tool as a function."""
        out = [t for t in tools if t.WhichOneof("tool") != "mcp"]
        if with_mcp:
            for name, (_, info) in self._by_name().items():
                fn = request_pb2.Tool()
                fn.function.name = name
                if info.HasField("description"):
                    fn.function.description = info.description
                fn.function.parameters_json = info.input_schema_json or '{"type":"object","properties":{}}'
                out.append(fn)
        return out

    def _by_name(self) -> dict[str, tuple[_Server, items_pb2.McpToolInfo]]:
        """MCP tool name -> (its server, its listing); the first server wins a name, and a
        function or custom tool of the create wins over every server."""
        out: dict[str, tuple[_Server, items_pb2.McpToolInfo]] = {}
        for server in self.servers.values():
            for info in server.tools:
                if info.name not in out and info.name not in self.taken:
                    out[info.name] = (server, info)
        return out

    def routes(self) -> dict[str, McpRoute]:
        return {name: McpRoute(server.tool.server_label, needs_approval(server.tool, name, _read_only(info)))
                for name, (server, info) in self._by_name().items()}  # fmt: skip

    def tool_choice(self, choice: request_pb2.ToolChoice | None, first: bool) -> request_pb2.ToolChoice | None:
        """`tool_choice` for a model call: an `mcp` choice becomes the named tool (or any of the
        server's tools) on the first call; after it, a forced choice is `auto` (else the model
        would call tools for ever)."""
        if choice is None:
            return None
        obj = None
        if choice.WhichOneof("choice") == "other_json":
            try:
                obj = orjson.loads(choice.other_json)
            except orjson.JSONDecodeError:
                obj = None
        if not first:
            if choice.WhichOneof("choice") == "mode" and choice.mode == "none":
                return choice
            return request_pb2.ToolChoice(mode="auto")
        if not isinstance(obj, dict) or obj.get("type") != "mcp":
            return choice
        server = self.servers.get(str(obj.get("server_label")))
        names = [info.name for info in server.tools] if server else []
        if isinstance(obj.get("name"), str) and obj["name"] in names:
            return request_pb2.ToolChoice(function_name=obj["name"])
        if not names:
            return request_pb2.ToolChoice(mode="auto")
        allowed_tools = {"type": "allowed_tools", "mode": "required",
                         "tools": [{"type": "function", "name": n} for n in names]}  # fmt: skip
        return request_pb2.ToolChoice(other_json=orjson.dumps(allowed_tools).decode())

    # -- the steps ----------------------------------------------------------------------------------

    async def steps(self, io: StepIO, prepared: Prepared, builder: OutputBuilder) -> Finish:
        history = prepared.node.items()
        new_items = [seg.item for seg in prepared.new_segments]
        input_tokens = prepared.input_tokens
        sealer, tenant = io.services.reasoning, io.tenant
        builder.approval_id = lambda request: approval_id(sealer, tenant, request)
        await self._list(io, builder, history)  # first: an approved call is checked against the listing
        approved = await self._run_approved(io, builder, new_items, history)
        sums = [0, 0, 0]  # input, output, reasoning tokens of every model call
        first = not approved  # a forced tool_choice was honoured by the call just approved
        steps = 0
        while True:
            steps += 1
            before = len(builder.output)
            with_mcp = self.calls < self.config.max_calls_per_response
            builder.mcp_routes = self.routes() if with_mcp else {}
            context = [*history, *builder.output]
            estimate = input_tokens + sum(len(render.encode(render.render_item(i))) for i in builder.output)
            request = io.backend_request(prepared.route, context, estimate)
            request.tools = self.backend_tools(io.params.tools, with_mcp=with_mcp)
            request.tool_choice = self.tool_choice(request.tool_choice, first)
            request.mcp_tools = frozenset(builder.mcp_routes)
            await io.stream(builder, prepared.route.backend, request)
            await io.emit_all(builder.close_all("completed"))
            finish = builder.finish or Finish()
            produced = builder.output[before:]
            add_usage(sums, finish.usage, estimate, produced)
            waiting = builder.waiting_mcp_calls()
            for index, item in waiting:
                await self._run(io, builder, index, item)
            client_calls = any(call_of(it) is not None for it in produced)  # the client runs these
            first = False
            if (not waiting or builder.approvals_requested or client_calls or builder.capped
                    or finish.reason != "tool_calls"):  # fmt: skip
                for _ in range(builder.approvals_requested):
                    io.services.telemetry.mcp_approval("requested")
                if steps == 1:
                    return finish
                reason = "stop" if finish.reason == "tool_calls" and not client_calls else finish.reason
                usage = Usage(input_tokens=sums[0], output_tokens=sums[1], reasoning_tokens=sums[2])
                return Finish(reason=reason, usage=usage, timing=finish.timing, replica=finish.replica)

    async def _list(self, io: StepIO, builder: OutputBuilder, history: Sequence[items_pb2.Item]) -> None:
        listed = {it.mcp_list_tools.server_label: it.mcp_list_tools for it in history
                  if it.WhichOneof("item") == "mcp_list_tools" and not it.mcp_list_tools.HasField("error")}  # fmt: skip
        for label, server in self.servers.items():
            if label in listed:  # OpenAI's rule: the history's listing stands
                server.tools = [t for t in listed[label].tools if allowed(server.tool, t.name, _read_only(t))]
                continue
            await self._list_one(io, builder, server)

    async def _list_one(self, io: StepIO, builder: OutputBuilder, server: _Server) -> None:
        item = items_pb2.Item()
        lt = item.mcp_list_tools
        lt.id, lt.server_label = ids.new_id("mcpl"), server.tool.server_label
        index, events = builder.open_mcp_item(item)
        progress = io.event()
        progress.mcp_list_tools_in_progress.item_id, progress.mcp_list_tools_in_progress.output_index = lt.id, index
        await io.emit_all([*events, progress])
        started = time.perf_counter()
        outcome = "listed"
        try:
            session = await self._session(io, server)
            if session.tools is not None:
                outcome = "reused"
                tools = session.tools
            else:
                tools = await session.list_tools()
            for t in tools:
                if not allowed(server.tool, t.name, t.read_only):
                    continue
                info = lt.tools.add(name=t.name, input_schema_json=orjson.dumps(t.input_schema).decode())
                if t.description is not None:
                    info.description = t.description
                if t.annotations:
                    info.annotations_json = orjson.dumps(t.annotations).decode()
            server.tools = list(lt.tools)
        except McpFailure as exc:
            outcome = "failed"
            del lt.tools[:]
            lt.error = exc.message
        io.clock.add("mcp", time.perf_counter() - started)
        io.services.telemetry.mcp_listing(lt.server_label, outcome, time.perf_counter() - started)
        done = io.event()
        arm = done.mcp_list_tools_failed if outcome == "failed" else done.mcp_list_tools_completed
        arm.item_id, arm.output_index = lt.id, index
        await io.emit_all([done, builder.add_done(index, item)])

    @staticmethod
    async def _session(io: StepIO, server: _Server) -> McpServerSession:
        """The connection's session with this server (opened now if it has none)."""
        tool = server.tool
        return await io.mcp_sessions.get(tool.server_url, tool.headers,
                                      tool.authorization if tool.HasField("authorization") else None)  # fmt: skip

    async def _run_approved(self, io: StepIO, builder: OutputBuilder, new_items: Sequence[items_pb2.Item],
                            history: Sequence[items_pb2.Item]) -> int:  # fmt: skip
        """Run the calls the new input approves; returns how many ran."""
        answers = [it.mcp_approval_response for it in new_items if it.WhichOneof("item") == "mcp_approval_response"]
        if not answers:
            return 0
        requests = {it.mcp_approval_request.id: it.mcp_approval_request for it in history
                    if it.WhichOneof("item") == "mcp_approval_request"}  # fmt: skip
        ran = {it.mcp_call.approval_request_id for it in history if it.WhichOneof("item") == "mcp_call"}
        count = 0
        for answer in answers:
            io.services.telemetry.mcp_approval("approved" if answer.approve else "denied")
            request = requests.get(answer.approval_request_id)
            if not answer.approve or request is None or request.id in ran:
                continue
            ran.add(request.id)
            item = items_pb2.Item()
            mc = item.mcp_call
            mc.id, mc.server_label, mc.name, mc.arguments = ids.new_id("mcp"), request.server_label, request.name, request.arguments
            mc.status, mc.approval_request_id = "in_progress", request.id
            index, events = builder.open_mcp_item(item)
            await io.emit_all(events)
            await self._run(io, builder, index, item)
            count += 1
        return count

    async def _call_allowed(self, io: StepIO, server: _Server, name: str) -> bool:
        """The create's `allowed_tools` at call time, whatever the input claims: a name list is
        checked as it stands; a `read_only` filter against the server's own listing (that of the
        connection's session, listed now if it has none), not against a listing item of the
        history, which a client may have written."""
        tool = server.tool
        arm = tool.WhichOneof("allowed")
        if arm is None:
            return True
        if arm == "allowed_names" or not tool.allowed_filter.HasField("read_only"):
            return allowed(tool, name, False)
        session = await self._session(io, server)
        tools = session.tools if session.tools is not None else await session.list_tools()
        return any(t.name == name and allowed(tool, name, t.read_only) for t in tools)

    async def _run(self, io: StepIO, builder: OutputBuilder, index: int, item: items_pb2.Item) -> None:
        """Call the server for one `mcp_call` item and finish it (output or error, never raises)."""
        mc = item.mcp_call
        progress = io.event()
        progress.mcp_call_in_progress.item_id, progress.mcp_call_in_progress.output_index = mc.id, index
        await io.emit_all([progress])
        started = time.perf_counter()
        outcome = "ok"
        server = self.servers.get(mc.server_label)
        try:
            if self.calls >= self.config.max_calls_per_response:
                raise protocol_error(TOO_LARGE, f"this response already made {self.calls} MCP calls "
                                     "(mcp.max_calls_per_response)")  # fmt: skip
            if server is None:
                raise protocol_error(-32602, f"the MCP server {mc.server_label!r} is not in this create's tools")
            if not await self._call_allowed(io, server, mc.name):
                raise protocol_error(REFUSED, f"the tool {mc.name!r} is not in the allowed_tools of the MCP server "
                                              f"{mc.server_label!r} (tools[{server.index}].allowed_tools)")  # fmt: skip
            self.calls += 1
            try:
                arguments = orjson.loads(mc.arguments or "{}")
            except orjson.JSONDecodeError:
                raise protocol_error(-32602, "the model's arguments are not valid JSON") from None
            if not isinstance(arguments, dict):
                raise protocol_error(-32602, "the model's arguments are not a JSON object")
            try:
                result = await (await self._session(io, server)).call_tool(mc.name, arguments)
            except SessionGone:  # the server restarted or dropped the session: once more on a new one
                result = await (await self._session(io, server)).call_tool(mc.name, arguments)
            if result.error is not None:
                outcome = "tool_error"
                mc.error_json = orjson.dumps(result.error).decode()
            else:
                mc.output = result.output or ""
        except McpFailure as exc:
            code = exc.error.get("code")
            outcome = {TIMEOUT: "timeout", TOO_LARGE: "too_large", REFUSED: "refused"}.get(code, "failed")  # type: ignore[arg-type]  # a missing code (None) finds nothing: "failed"
            mc.error_json = orjson.dumps(exc.error).decode()
        mc.status = "completed" if outcome == "ok" else "failed"
        io.clock.add("mcp", time.perf_counter() - started)
        io.services.telemetry.mcp_call(mc.server_label, outcome, time.perf_counter() - started)
        await io.emit_all(builder.settle_mcp_call(index, item))
