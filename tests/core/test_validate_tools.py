"""Function-tool validation (`validate._check_tools`): names, duplicates, schema objects, and the
memo that spares an agent's resent tools a second parse (exact errors, no timing)."""

from __future__ import annotations

import pytest

from tether.core.stages import validate
from tether.errors import TetherError
from tether.responses.v1 import request_pb2


def params(*tools: tuple[str, str] | str) -> request_pb2.ResponseCreateParams:
    """Tools as (name, parameters JSON) functions, or a bare string: a hosted tool of that type."""
    p = request_pb2.ResponseCreateParams(model="m")
    for tool in tools:
        t = p.tools.add()
        if isinstance(tool, str):
            t.other.type, t.other.json = tool, f'{{"type": "{tool}"}}'
        else:
            t.function.name, t.function.parameters_json = tool
    return p


@pytest.mark.parametrize(
    ("tools", "param", "message"),
    [
        ((("bad name", "{}"),), "tools[0].name", "Invalid function name"),
        ((("f", "{}"), "web_search", ("f", "{}")), "tools[2].name", "Duplicate tool name"),  # hosted tools count
        ((("f", "{}"), ("g", "[1]")), "tools[1].parameters", "JSON Schema object"),
        ((("f", "{not json"),), "tools[0].parameters", "JSON Schema object"),
    ],
)
def test_a_bad_function_tool_is_a_400_naming_it_every_time_it_is_sent(tools, param, message) -> None:
    for _ in range(2):  # the second time from the memo: the same error
        with pytest.raises(TetherError) as ei:
            validate._check_tools(params(*tools))
        assert ei.value.param == param and message in ei.value.message and ei.value.status == 400


def test_resent_tools_are_checked_once() -> None:
    schema = '{"type": "object", "properties": {"path": {"type": "string"}}}'
    before = validate._tools_problem.cache_info()
    for _ in range(3):
        validate._check_tools(params(("read_file", schema), "web_search", ("run_tests", "")))
    after = validate._tools_problem.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 2)
    validate._check_tools(params(("read_file", schema.replace("path", "file"))))  # another schema: checked
    assert validate._tools_problem.cache_info().misses == after.misses + 1
