"""Prompt templates: the create field `prompt: {id, version, variables}` against templates the
operator defines in config, so a client can name a prompt instead of sending its text.

A template is `[prompts.<id>]` in tether.toml: `instructions` and/or `input` (messages,
`{role, content}` with `content` a string) holding `{{name}}` placeholders. Several versions live
under `[prompts.<id>.versions.<version>]`, with `default_version` naming the one a request
without `version` gets (default: the last one listed); a template without `versions` has the one
version "1". Everything is checked when the config loads (`PromptLibrary.from_config`).

Templates are scoped to tenants: `tenants = ["a", "b"]` on a template makes it exist only for
those tenants (the names API keys map to, `tether.auth`; an open server's one tenant is `""`).
A template without `tenants` is every tenant's. To a tenant outside its list a template does not
exist: naming it is the same 400 as naming no template at all, and that error lists only the ids
the caller may use, never another tenant's.

Applying one (`PromptLibrary.apply`, first thing in a create's preparation, before validation):
the template's instructions go before the request's own `instructions` (a blank line between),
its messages before the request's input, every placeholder replaced by its variable. A variable
is a string, or an input content part: `input_text` (its text), `input_image` or `input_file`
(only as the whole content of a template message, which then carries that part). An unknown id
or version, a placeholder without a variable, a variable the template does not use, or a part
where only text fits is a 400 naming `prompt.id`, `prompt.version` or `prompt.variables.<name>`.
The Response echoes `prompt` as sent. The expansion is bounded, counted before expanding: past
`max_request_bytes` in all it is 413 `request_too_large`, a message past `max_item_bytes` 400
`item_too_large`, both `param: prompt`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from tether import errors
from tether.errors import TetherError
from tether.protocol.json_codec import item_from_json
from tether.responses.v1 import items_pb2, request_pb2

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\}\}")
_ROLES = ("user", "developer", "system", "assistant")
_PART_TYPES = {"input_text", "input_image", "input_file"}


@dataclass(frozen=True)
class TemplateMessage:
    role: str
    content: str


@dataclass(frozen=True)
class PromptVersion:
    instructions: str | None
    input: tuple[TemplateMessage, ...]
    variables: frozenset[str]  # every placeholder it holds


@dataclass(frozen=True)
class PromptTemplate:
    id: str
    versions: Mapping[str, PromptVersion]
    default_version: str
    tenants: frozenset[str] | None = None  # who may use it; None: every tenant

    def visible_to(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


@dataclass
class PromptLibrary:
    templates: dict[str, PromptTemplate] = field(default_factory=dict)

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> PromptLibrary:
        """The `[prompts]` table; raises ValueError naming the key that is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError("[prompts] must be a table of templates")
        return cls({pid: _template(pid, spec) for pid, spec in data.items()})

    def visible_ids(self, tenant: str) -> list[str]:
        """The ids of the templates `tenant` may use, sorted."""
        return sorted(pid for pid, t in self.templates.items() if t.visible_to(tenant))

    def apply(self, params: request_pb2.ResponseCreateParams, tenant: str, max_bytes: int = 0,
              max_item_bytes: int = 0) -> int:  # fmt: skip
        """Expand `params.prompt` into `params.instructions` and `params.input` (see above), with
        the templates `tenant` may use. `max_bytes` (0 = no bound): the most UTF-8 bytes the
        template's expansion may add, and `max_item_bytes` the most one of its messages may hold,
        both checked before anything is expanded (413 `request_too_large` / 400 `item_too_large`,
        `param: prompt`). Returns the bytes it added (0 without `prompt`)."""
        if not params.HasField("prompt"):
            return 0
        prompt = params.prompt
        template = self.templates.get(prompt.id)
        if template is None or not template.visible_to(tenant):
            raise TetherError(
                errors.INVALID_REQUEST,
                f"Unknown prompt.id {prompt.id!r}: the prompts you can use are "
                + (", ".join(repr(k) for k in self.visible_ids(tenant)) or "none")
                + ".",
                param="prompt.id",
                status=400,
            )
        version_name = prompt.version if prompt.HasField("version") else template.default_version
        version = template.versions.get(version_name)
        if version is None:
            raise TetherError(
                errors.INVALID_REQUEST,
                f"Unknown prompt.version {version_name!r} of prompt {prompt.id!r} (versions: "
                f"{', '.join(template.versions)}).",
                param="prompt.version",
                status=400,
            )
        variables = _variables(prompt.variables_json)
        for name in sorted(version.variables - variables.keys()):
            raise _variable_error(
                name, f"Missing prompt.variables.{name}: prompt {prompt.id!r} uses {{{{{name}}}}}."
            )
        for name in sorted(variables.keys() - version.variables):
            raise _variable_error(
                name, f"Unknown prompt.variables.{name}: prompt {prompt.id!r} has no {{{{{name}}}}}."
            )
        size, largest = _expanded_bytes(version, variables)
        if max_item_bytes and largest > max_item_bytes:
            raise TetherError(
                errors.ITEM_TOO_LARGE,
                f"Prompt {prompt.id!r} with these variables makes a message of {largest} bytes; one item may hold at "
                f"most {max_item_bytes} (max_item_bytes).",
                param="prompt",
            )
        if max_bytes and size > max_bytes:
            raise TetherError(
                errors.REQUEST_TOO_LARGE,
                f"Prompt {prompt.id!r} with these variables expands to {size} bytes; the limit is {max_bytes} "
                "(max_request_bytes).",
                param="prompt",
            )
        if version.instructions is not None:
            text = _substitute(version.instructions, variables)
            params.instructions = (
                f"{text}\n\n{params.instructions}" if params.HasField("instructions") else text
            )
        if not version.input:
            return size
        items = [_message(m, variables) for m in version.input]
        if params.HasField("input_text"):
            items.append(
                items_pb2.Item(message=items_pb2.Message(role="user", content_text=params.input_text))
            )
            params.ClearField("input_text")
        items.extend(params.input)
        del params.input[:]
        params.input.extend(items)
        return size


def _expanded_bytes(version: PromptVersion, variables: Mapping[str, str | dict]) -> tuple[int, int]:
    """The UTF-8 size of a version's texts with every placeholder replaced, and of the largest of
    its messages, without building them (a large variable used many times would otherwise be
    copied that many times first)."""
    sizes = {
        name: len((value if isinstance(value, str) else value.get("text") or orjson.dumps(value).decode()).encode())
        for name, value in variables.items()
    }
    total = largest = 0
    for i, text in enumerate((version.instructions or "", *(m.content for m in version.input))):
        size = len(PLACEHOLDER.sub("", text).encode()) + sum(sizes.get(m.group(1), 0) for m in PLACEHOLDER.finditer(text))
        total += size
        if i:  # a message (the instructions are no item)
            largest = max(largest, size)
    return total, largest


def _variable_error(name: str, message: str) -> TetherError:
    return TetherError(errors.INVALID_REQUEST, message, param=f"prompt.variables.{name}", status=400)


def _variables(text: str) -> dict[str, str | dict]:
    if not text:
        return {}
    out = orjson.loads(text)  # the codec checked it is an object
    for name, value in out.items():
        if isinstance(value, str):
            continue
        if not isinstance(value, dict) or value.get("type") not in _PART_TYPES:
            raise _variable_error(
                name,
                f"prompt.variables.{name} must be a string or an input_text, input_image or "
                "input_file content part.",
            )
        if value["type"] == "input_text" and not isinstance(value.get("text"), str):
            raise _variable_error(name, f"prompt.variables.{name}: an input_text part needs a string 'text'.")
    return out


def _substitute(text: str, variables: Mapping[str, str | dict]) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1)
        value = variables[name]
        if isinstance(value, str):
            return value
        if value["type"] == "input_text":
            return value["text"]
        raise _variable_error(
            name,
            f"prompt.variables.{name} is an {value['type']} part; it can only be the whole "
            "content of a template message, not part of a text.",
        )

    return PLACEHOLDER.sub(one, text)


def _message(m: TemplateMessage, variables: Mapping[str, str | dict]) -> items_pb2.Item:
    whole = PLACEHOLDER.fullmatch(m.content.strip())
    value = variables.get(whole.group(1)) if whole else None
    msg = items_pb2.Message(role=m.role)
    if whole and isinstance(value, dict) and value["type"] in ("input_image", "input_file"):
        item = item_from_json(
            {"type": "message", "role": m.role, "content": [value]}, f"prompt.variables.{whole.group(1)}"
        )
        msg.content.append(item.message.content[0])
    else:
        msg.content_text = _substitute(m.content, variables)
    return items_pb2.Item(message=msg)


def _version(where: str, spec: Any) -> PromptVersion:
    if not isinstance(spec, Mapping):
        raise ValueError(f"[{where}] must be a table")
    unknown = set(spec) - {"instructions", "input"}
    if unknown:
        raise ValueError(f"unknown keys in [{where}]: {sorted(unknown)}")
    instructions = spec.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError(f"{where}.instructions must be a string")
    raw_input = spec.get("input", [])
    if not isinstance(raw_input, list):
        raise ValueError(f"{where}.input must be a list of messages")
    messages = []
    for i, m in enumerate(raw_input):
        if not isinstance(m, Mapping) or set(m) - {"role", "content"}:
            raise ValueError(f"{where}.input[{i}] must be a table with role and content")
        role, content = m.get("role", "user"), m.get("content")
        if role not in _ROLES:
            raise ValueError(f"{where}.input[{i}].role must be one of {', '.join(_ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"{where}.input[{i}].content must be a string")
        messages.append(TemplateMessage(role, content))
    if instructions is None and not messages:
        raise ValueError(f"[{where}] needs instructions or input")
    texts = [instructions or "", *(m.content for m in messages)]
    names = frozenset(n for t in texts for n in PLACEHOLDER.findall(t))
    return PromptVersion(instructions, tuple(messages), names)


def _tenants(where: str, spec: Mapping[str, Any]) -> frozenset[str] | None:
    if "tenants" not in spec:
        return None
    tenants = spec["tenants"]
    if not isinstance(tenants, list) or not all(isinstance(t, str) for t in tenants):
        raise ValueError(f"{where}.tenants must be a list of tenant names")
    return frozenset(tenants)


def _template(pid: str, spec: Any) -> PromptTemplate:
    where = f"prompts.{pid}"
    if not isinstance(spec, Mapping):
        raise ValueError(f"[{where}] must be a table")
    tenants = _tenants(where, spec)
    spec = {k: v for k, v in spec.items() if k != "tenants"}
    if "versions" not in spec:
        return PromptTemplate(pid, {"1": _version(where, spec)}, "1", tenants)
    unknown = set(spec) - {"versions", "default_version"}
    if unknown:
        raise ValueError(f"unknown keys in [{where}] (a template with versions): {sorted(unknown)}")
    raw = spec["versions"]
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(f"[{where}.versions] must be a non-empty table of versions")
    versions = {str(v): _version(f"{where}.versions.{v}", s) for v, s in raw.items()}
    default = str(spec.get("default_version", list(versions)[-1]))
    if default not in versions:
        raise ValueError(f"{where}.default_version {default!r} is not one of its versions")
    return PromptTemplate(pid, versions, default, tenants)
