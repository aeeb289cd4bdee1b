"""OpenAI Responses JSON <-> Tether protobuf, by hand and by table.

Shared by the WebSocket and HTTP bridges, so it sits on the per-event hot path. It therefore never
uses `google.protobuf.json_format` (2-4x slower per event, and not the OpenAI shape anyway: see
`tether_lab.bench_codec`). Each JSON object type has one field table (`_Codec`): a generic loop reads JSON
with it, and at import it is compiled into a straight-line writer, so the tables stay the single
description of the wire format while writing costs what a hand-written encoder would.

Faithfulness rules (a client's JSON object must come back unchanged, dict-equal):

* Unknown keys of a modelled object go to the owning message's `extra_json` and are merged back
  out. So do modelled keys whose JSON value the typed field cannot represent (the "stash"): a
  `null`, a default sent explicitly where absence and default look the same in proto3
  (`"id": ""`, `"include": []`), or a sub-object whose message has no `extra_json` and whose
  shape it cannot hold (`text.format` with unknown keys, `context_management` entries with a
  null threshold, reasoning summaries with extra keys). A stashed sub-object still fills the
  typed fields where it can, so the core sees the meaning; the JSON comes back from the stash.
* On the way out, client-made objects (request, items, tools, content parts) let `extra_json`
  win over typed fields, which is what makes the stash work. The Response object is built by
  the server, so there the typed fields win and `extra_json` only adds keys.
* Unknown item, content-part, tool and event types are kept whole in their `other` arms.
* Known normalisations (documented, harmless for every client): an item without `type` reads as
  `message` (with `role`) or `item_reference` (with `id` only) and is written with its type;
  `output_text` parts always carry `annotations` and `logprobs` (the SDK requires them), message
  `content` and reasoning `summary` are always written, other required keys read as their proto
  default when missing; the create body's `"type": "response.create"` is dropped (any other
  `type` value is an unknown key); keys of *events* that the proto does not model (e.g.
  `obfuscation`) are dropped by `event_from_json`, and so are unknown keys inside
  `usage`, `error` and `incomplete_details` of a Response. A Response's `error.code` is written
  as the API's code for Tether's (`errors.response_code`: `invalid_prompt`, `rate_limit_exceeded`
  or `server_error`), with Tether's own code next to it in `error.tether_code`; reading takes
  `tether_code` over `code`.

Errors: wrong JSON types raise `TetherError(INVALID_TYPE, param=<dotted path>)`; unparsable or
too deeply nested text raises `TetherError(INVALID_JSON)`. Semantics (does the model exist, may
this role appear here) are the core's business, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson
from google.protobuf.descriptor import FieldDescriptor

from tether import errors
from tether.errors import TetherError
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, response_pb2, service_pb2

__all__ = [
    "dumps",
    "loads",
    "params_from_json",
    "params_to_json",
    "item_from_json",
    "item_to_json",
    "response_from_json",
    "response_to_json",
    "event_to_json",
    "event_from_json",
    "event_type",
    "client_event_from_json",
    "client_event_to_json",
    "error_to_http_json",
    "compact_response_to_json",
    "compact_response_from_json",
    "input_items_to_json",
    "input_items_from_json",
    "DEFAULT_MAX_DEPTH",
]

# ---------------------------------------------------------------------------------------------
# JSON text: parse with a depth limit, serialise with orjson.
# ---------------------------------------------------------------------------------------------

DEFAULT_MAX_DEPTH = 64

_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_QUOTED = re.compile(rb'"[^"]*"')


# A JSON text kept in a string field is parsed to be written out again; a large one (a long
# answer's log probabilities are megabytes, and the events that end a message each carry them)
# is embedded as it is instead (`orjson.Fragment`: written verbatim, never parsed). The texts
# were written by Tether (from parsed JSON, or by `orjson.dumps`), so they are valid JSON.
# The generated encoders (`_Json.emit`) make the choice inline, without a function call per
# field: every event that carries the Response re-encodes its tools' schemas.
_VERBATIM_CHARS = 64 * 1024
_STORED_JSON = f"(loads(v) if len(v) < {_VERBATIM_CHARS} else verbatim(v))"  # the value of `v`, for serialising


def dumps(obj: Any) -> bytes:
    """Serialise to compact JSON bytes (orjson: keeps key order, UTF-8, no spaces)."""
    return orjson.dumps(obj)


def loads(data: bytes | bytearray | memoryview | str, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse JSON text, rejecting bad JSON and nesting deeper than `max_depth` with INVALID_JSON.

    orjson itself stops at depth 1024; a request that deep is an attack, not a request, and the
    codec recurses over what it is given (orjson cannot serialise beyond depth 255 either). The
    check works on the raw bytes, which orjson has just validated, with C-speed bytes methods
    only: drop escaped backslashes and quotes, keep only quotes and brackets (`translate`; if
    that holds no more opening brackets than `max_depth`, stop), drop the quoted segments
    (in-string brackets), and peel innermost `()` pairs with `replace`: the number of passes
    that empties the skeleton is exactly the nesting depth, and it stops after `max_depth`
    passes. Small events cost about a microsecond; a 25 KB Codex create body about half its
    parse time.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise TetherError(
            errors.INVALID_JSON, f"We could not parse the JSON body: {e}."
        ) from None
    if type(obj) in (dict, list) and _nesting_exceeds(data, max_depth):
        raise TetherError(
            errors.INVALID_JSON,
            f"The JSON body is nested deeper than the limit of {max_depth} levels.",
        )
    return obj


def _nesting_exceeds(data: bytes | bytearray | memoryview | str, max_depth: int) -> bool:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) <= 2 * max_depth:  # too short to nest deeper
        return False
    if b"\\" in raw:
        # Backslashes occur only inside strings, and pairing them from the left is JSON's escape
        # rule: after these two replaces every remaining quote delimits a string.
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Quotes and brackets only, `(` / `)` for either bracket kind (orjson checked the matching).
    # Removing a `""` pair (an empty string, or the gap between two strings) keeps the quote
    # parity, so the quoted segments that remain still hold exactly the in-string brackets.
    skeleton = raw.translate(_BRACKETS, _NOT_STRUCTURE)
    if skeleton.count(b"(") <= max_depth:  # most events and small bodies stop here
        return False
    skeleton = skeleton.replace(b'""', b"")
    if b'"' in skeleton:
        skeleton = _QUOTED.sub(b"", skeleton)
    for _ in range(max_depth):
        skeleton = skeleton.replace(b"()", b"")  # one pass peels one nesting level
        if not skeleton:
            return False
    return True


def _text(obj: Any) -> str:
    """JSON text for a proto string field (`other.json`, `*_json`), key order kept."""
    return orjson.dumps(obj).decode()


def _extra_text(extras: dict) -> str:
    """`extra_json` text. Top-level keys are sorted: the order in which leftovers are collected
    depends on where the typed fields sat in the input, and equal messages should compare equal
    (nested values keep their order)."""
    if len(extras) > 1:
        extras = {k: extras[k] for k in sorted(extras)}
    return orjson.dumps(extras).decode()


# ---------------------------------------------------------------------------------------------
# Type errors.
# ---------------------------------------------------------------------------------------------

_JSON_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a decimal",
    bool: "a boolean",
    dict: "an object",
    list: "an array",
    type(None): "null",
}


def _type_error(param: str, expected: str, value: Any) -> TetherError:
    got = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
    return TetherError(
        errors.INVALID_TYPE,
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        param=param,
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _require_object(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        if path:
            raise _type_error(path, "an object", value)
        got = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
        raise TetherError(errors.INVALID_TYPE, f"The body must be a JSON object, but got {got}.")
    return value


# ---------------------------------------------------------------------------------------------
# Field tables. A `_Codec` is the table of one JSON object type; each entry maps one JSON key.
#
# Reading runs one generic loop over the JSON keys. Writing is the hot path (every streamed
# event), and upb attribute access is cheap while Python calls are not, so each table is compiled
# once, at import, into one straight-line function: every field contributes the line or two a
# hand-written encoder would have (`out['delta'] = m.delta`). `_Codec.source` shows the result.
# ---------------------------------------------------------------------------------------------

# Emission policies: how absence and defaults are written, and read back.
ALWAYS = 0  # a required key: always written; missing on input reads as the proto default
NONEMPTY = 1  # written when not the proto default; the default sent explicitly is stashed
OPTIONAL = 2  # proto3 `optional` / message presence: written when present; null is stashed
NULLABLE = 3  # Response style: written as null when absent or empty; null reads as absent


class _Field:
    """One JSON key of an object.

    `decode` fills the message and returns False when the value must be stashed instead. `emit`
    returns the encoder's source lines for this key (message `m`, output dict `out`); objects the
    lines call are put in `ns` under names starting with `name`.
    """

    key: str
    attr: str
    policy: int = ALWAYS

    def bind(self, desc: Any) -> None:
        """Resolve against the owning message's descriptor (called once, at import)."""

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        raise NotImplementedError

    def emit(self, name: str, ns: dict) -> list[str]:
        raise NotImplementedError


def _is_str(v: Any) -> bool:
    return type(v) is str


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _is_number(v: Any) -> bool:
    return type(v) is float or type(v) is int


def _int_check(bits: int) -> Callable[[Any], bool]:
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)
    return lambda v: type(v) is int and lo <= v < hi


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(type(x) is str for x in v)


_C = FieldDescriptor
# cpp_type -> (check, expected-type phrase for errors)
_SCALAR_KINDS: dict[int, tuple[Callable[[Any], bool], str]] = {
    _C.CPPTYPE_STRING: (_is_str, "a string"),
    _C.CPPTYPE_BOOL: (_is_bool, "a boolean"),
    _C.CPPTYPE_DOUBLE: (_is_number, "a number"),
    _C.CPPTYPE_FLOAT: (_is_number, "a number"),
    _C.CPPTYPE_INT32: (_int_check(32), "a 32-bit integer"),
    _C.CPPTYPE_INT64: (_int_check(64), "a 64-bit integer"),
}


class _Scalar(_Field):
    """A scalar, `repeated string` or `map<string, scalar>` field; its kind comes from the proto."""

    def __init__(self, key: str, policy: int = ALWAYS, attr: str | None = None, fallback: Any = None) -> None:
        self.key, self.policy, self.attr = key, policy, attr or key
        # ALWAYS only: what to write when the proto holds its default (Response `truncation`).
        self.fallback = fallback

    def bind(self, desc: Any) -> None:
        fd = desc.fields_by_name[self.attr]
        self.presence = fd.has_presence
        a = self.attr
        if fd.is_repeated and fd.message_type is not None:  # map<string, scalar>
            check, expected = _SCALAR_KINDS[fd.message_type.fields_by_name["value"].cpp_type]
            self.check = lambda v: isinstance(v, dict) and all(map(check, v.values()))
            self.expected, self.conv = f"an object with values that are each {expected}", "dict"
            self.set = lambda m, v: getattr(m, a).update(v)
        elif fd.is_repeated:
            self.check, self.expected, self.conv = _is_str_list, "an array of strings", "list"
            self.set = lambda m, v: getattr(m, a).extend(v)
        else:
            self.check, self.expected = _SCALAR_KINDS[fd.cpp_type]
            self.conv = ""
            self.set = lambda m, v: setattr(m, a, v)

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        if not self.check(value):
            raise _type_error(_join(path, self.key), self.expected, value)
        if self.policy == NONEMPTY and not value:
            return False  # "" / [] / {} would read back as "absent"
        self.set(msg, value)
        return True

    def emit(self, name: str, ns: dict) -> list[str]:
        k, a = repr(self.key), self.attr
        v = f"{self.conv}(v)" if self.conv else "v"  # containers are copied out as list / dict
        if self.policy == ALWAYS:
            if self.fallback is None:
                return [f"out[{k}] = {self.conv}(m.{a})" if self.conv else f"out[{k}] = m.{a}"]
            ns[name] = self.fallback
            return [f"out[{k}] = m.{a} or {name}"]
        if self.policy == OPTIONAL:
            return [f"if m.HasField({a!r}): out[{k}] = m.{a}"]
        if self.policy == NULLABLE and self.presence:
            return [f"out[{k}] = m.{a} if m.HasField({a!r}) else None"]
        if self.policy == NULLABLE:
            return [f"v = m.{a}", f"out[{k}] = {v} if v else None"]
        return [f"v = m.{a}", f"if v: out[{k}] = {v}"]  # NONEMPTY


class _Json(_Field):
    """A JSON value kept as JSON text in a string field (`parameters`, `annotations`, ...).

    `shape` is the required JSON type (dict, list, or None for any). With ALWAYS an empty list is
    stored as "" (the proto's "empty means []") and "" is written as an empty `shape`.
    """

    def __init__(self, key: str, attr: str, shape: type | None, policy: int = ALWAYS) -> None:
        self.key, self.attr, self.shape, self.policy = key, attr, shape, policy
        self.expected = {dict: "an object", list: "an array"}.get(shape, "a JSON value")  # type: ignore[call-overload]  # shape None (any JSON value) takes the default

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        if self.shape is not None and not isinstance(value, self.shape):
            raise _type_error(_join(path, self.key), self.expected, value)
        if self.policy == ALWAYS and self.shape is list and not value:
            return True
        setattr(msg, self.attr, _text(value))
        return True

    def emit(self, name: str, ns: dict) -> list[str]:
        k, a = repr(self.key), self.attr
        if self.policy == NULLABLE:
            return [f"v = m.{a}", f"out[{k}] = {_STORED_JSON} if v else None"]
        if self.policy != ALWAYS:
            return [f"v = m.{a}", f"if v: out[{k}] = {_STORED_JSON}"]
        empty = "None" if self.shape is None else repr(self.shape())
        return [f"v = m.{a}", f"out[{k}] = {_STORED_JSON} if v else {empty}"]


class _Const(_Field):
    """A key with a fixed literal value (`"object": "response"`, `"logprobs": []`): written, never read."""

    def __init__(self, key: str, value: Any) -> None:
        self.key, self.value = key, value
        self.policy = NULLABLE if value is None else ALWAYS  # a null constant reads back as absent

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        return True

    def emit(self, name: str, ns: dict) -> list[str]:
        return [f"out[{self.key!r}] = {self.value!r}"]  # a literal: a fresh list each call


class _Custom(_Field):
    """A key with hand-written translation: `dec(msg, value, path) -> bool`, `enc(msg, out)`."""

    def __init__(
        self,
        key: str,
        dec: Callable[[Any, Any, str], bool],
        enc: Callable[[Any, dict], None],
        policy: int = ALWAYS,
    ) -> None:
        self.key, self.dec, self.enc, self.policy = key, dec, enc, policy

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        return self.dec(msg, value, _join(path, self.key))

    def emit(self, name: str, ns: dict) -> list[str]:
        ns[name] = self.enc
        return [f"{name}(m, out)"]


class _Codec:
    """The field table of one JSON object type: a generic reader and a compiled writer."""

    def __init__(
        self, cls: Any, *fields: _Field, skip: tuple[str, ...] = ("type",), typed_wins: bool = False
    ) -> None:
        desc = cls.DESCRIPTOR
        for f in fields:
            f.bind(desc)
        self.fields = {f.key: f for f in fields}
        self.skip = frozenset(skip)
        self.has_extra = "extra_json" in desc.fields_by_name
        self.encode: Callable[[Any, dict], dict] = self._compile(desc.name, fields, typed_wins)

    def _compile(
        self, name: str, fields: tuple[_Field, ...], typed_wins: bool
    ) -> Callable[[Any, dict], dict]:
        ns: dict[str, Any] = {"loads": orjson.loads, "verbatim": orjson.Fragment, "merge": _merge_extra}
        body = [line for i, f in enumerate(fields) for line in f.emit(f"f{i}", ns)]
        if self.has_extra:
            body.append(f"if m.extra_json: merge(out, m.extra_json, {typed_wins})")
        self.source = "\n    ".join([f"def encode_{name}(m, out):", *body, "return out"])
        exec(compile(self.source, f"<json_codec {name}>", "exec"), ns)
        return ns[f"encode_{name}"]

    def decode(self, d: dict, msg: Any, path: str) -> dict | None:
        """Fill `msg` from `d`; return what must go to `extra_json` (unknown or stashed keys)."""
        extras = None
        fields = self.fields
        for k, v in d.items():
            f = fields.get(k)
            if f is not None:
                if v is None:
                    if f.policy == NULLABLE:
                        continue
                elif f.decode(msg, v, path):
                    continue
            elif k in self.skip:
                continue
            if extras is None:
                extras = {}
            extras[k] = v
        return extras

    def decode_into(self, d: Any, msg: Any, path: str) -> bool:
        """Decode a whole sub-object; False if it has leftovers and no `extra_json` to hold them."""
        leftovers = self.decode(_require_object(d, path), msg, path)
        if not leftovers:
            return True
        if self.has_extra:
            msg.extra_json = _extra_text(leftovers)
            return True
        return False


def _merge_extra(out: dict, extra_json: str, typed_wins: bool = False) -> None:
    extra = orjson.loads(extra_json)
    if typed_wins:
        for k, v in extra.items():
            out.setdefault(k, v)
    else:
        out.update(extra)


class _Sub(_Field):
    """A nested object held in a sub-message (its leftovers go to its `extra_json` or get stashed)."""

    def __init__(self, key: str, codec: _Codec, policy: int = OPTIONAL, attr: str | None = None) -> None:
        self.key, self.codec, self.policy, self.attr = key, codec, policy, attr or key

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        sub = getattr(msg, self.attr)
        sub.SetInParent()
        return self.codec.decode_into(value, sub, _join(path, self.key))

    def emit(self, name: str, ns: dict) -> list[str]:
        ns[name] = self.codec.encode
        k, a = repr(self.key), self.attr
        if self.policy == ALWAYS:
            return [f"out[{k}] = {name}(m.{a}, {{}})"]
        if self.policy == NULLABLE:
            return [f"out[{k}] = {name}(m.{a}, {{}}) if m.HasField({a!r}) else None"]
        return [f"if m.HasField({a!r}): out[{k}] = {name}(m.{a}, {{}})"]


class _Inline(_Field):
    """A nested JSON object whose keys live in the parent message (`usage.input_tokens_details`)."""

    def __init__(self, key: str, codec: _Codec) -> None:
        self.key, self.codec = key, codec

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        path = _join(path, self.key)
        return not self.codec.decode(_require_object(value, path), msg, path)

    def emit(self, name: str, ns: dict) -> list[str]:
        ns[name] = self.codec.encode
        return [f"out[{self.key!r}] = {name}(m, {{}})"]


class _List(_Field):
    """A JSON array of objects held in a repeated message field.

    `dec(target, element, path) -> bool` fills one `add()`ed message (False: the element cannot
    be held, so the whole array is stashed); `enc(message) -> dict` writes one element.
    """

    def __init__(
        self,
        key: str,
        dec: Callable[[Any, Any, str], bool],
        enc: Callable[[Any], Any],
        policy: int = ALWAYS,
        attr: str | None = None,
    ) -> None:
        self.key, self.dec, self.enc, self.policy, self.attr = key, dec, enc, policy, attr or key

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        path = _join(path, self.key)
        if not isinstance(value, list):
            raise _type_error(path, "an array", value)
        if not value and self.policy == NONEMPTY:
            return False
        return _decode_list(getattr(msg, self.attr), value, path, self.dec)

    def emit(self, name: str, ns: dict) -> list[str]:
        ns[name] = self.enc
        k, a = repr(self.key), self.attr
        if self.policy == ALWAYS:
            return [f"out[{k}] = [{name}(x) for x in m.{a}]"]
        return [f"v = m.{a}", f"if v: out[{k}] = [{name}(x) for x in v]"]


def _decode_list(container: Any, values: list, path: str, dec: Callable[[Any, Any, str], bool]) -> bool:
    ok = True
    add = container.add
    for i, v in enumerate(values):
        if not dec(add(), v, f"{path}[{i}]"):
            ok = False
    return ok


class _Union:
    """A `type`-tagged object held in a oneof with an `other` arm (items, content parts, tools).

    Known types fill their arm and the wrapper's `extra_json`; unknown types keep the whole JSON
    object in `other` (with its `type` copied out so routing needs no parse).
    """

    def __init__(
        self, oneof: str, arms: dict[str, _Codec], infer: Callable[[dict], str] | None = None,
        wrapper: _Codec | None = None,
    ) -> None:  # fmt: skip
        self.oneof = oneof
        self.arms = arms  # JSON `type` -> codec; the oneof arm has the same name as the type
        self.writers = {t: codec.encode for t, codec in arms.items()}
        self.infer = infer
        # Keys every arm may carry, held by the wrapper message itself (an item's `agent`).
        self.wrapper = wrapper

    def decode(self, target: Any, d: Any, path: str) -> bool:
        _require_object(d, path)
        t = d.get("type")
        if type(t) is not str:
            if t is not None or "type" in d:
                raise _type_error(_join(path, "type"), "a string", t)
            t = self.infer(d) if self.infer else ""
        codec = self.arms.get(t)
        if codec is None:
            other = target.other
            other.type = t
            other.json = _text(d)
            return True
        sub = getattr(target, t)
        sub.SetInParent()
        leftovers = codec.decode(d, sub, path)
        if leftovers and self.wrapper is not None:
            leftovers = self.wrapper.decode(leftovers, target, path)
        if leftovers:
            target.extra_json = _extra_text(leftovers)
        return True

    def encode(self, target: Any) -> dict:
        name = target.WhichOneof(self.oneof)
        if name == "other":
            return orjson.loads(target.other.json)
        if name is None:
            raise ValueError(f"{type(target).__name__} has no `{self.oneof}` arm set")
        out = self.writers[name](getattr(target, name), {"type": name})
        if self.wrapper is not None:
            return self.wrapper.encode(target, out)  # its own keys, then `extra_json`
        if target.extra_json:
            _merge_extra(out, target.extra_json)
        return out


class _OneOf(_Field):
    """A key holding one `_Union` object in a sub-message (`item`, `part` of events)."""

    def __init__(self, key: str, union: _Union) -> None:
        self.key, self.union = key, union

    def decode(self, msg: Any, value: Any, path: str) -> bool:
        return self.union.decode(getattr(msg, self.key), value, _join(path, self.key))

    def emit(self, name: str, ns: dict) -> list[str]:
        ns[name] = self.union.encode
        return [f"out[{self.key!r}] = {name}(m.{self.key})"]


# ---------------------------------------------------------------------------------------------
# Content parts and items.
# ---------------------------------------------------------------------------------------------

_PART = _Union(
    "part",
    {
        "input_text": _Codec(items_pb2.InputText, _Scalar("text")),
        "output_text": _Codec(
            items_pb2.OutputText,
            _Scalar("text"),
            _Json("annotations", "annotations_json", list),
            _Json("logprobs", "logprobs_json", list),
        ),
        "input_image": _Codec(
            items_pb2.InputImage,
            _Scalar("image_url", OPTIONAL),
            _Scalar("file_id", OPTIONAL),
            _Scalar("detail", NONEMPTY),
        ),
        "input_file": _Codec(
            items_pb2.InputFile,
            *(_Scalar(k, OPTIONAL) for k in ("file_id", "file_data", "filename", "file_url")),
        ),
        "refusal": _Codec(items_pb2.Refusal, _Scalar("refusal")),
    },
)


def _content_dec(msg: items_pb2.Message, value: Any, path: str) -> bool:
    """`content`: a plain string (kept as a string) or an array of content parts."""
    if type(value) is str:
        msg.content_text = value
        return True
    if not isinstance(value, list):
        raise _type_error(path, "one of a string or array of content parts", value)
    return _decode_list(msg.content, value, path, _PART.decode)


def _content_enc(msg: items_pb2.Message, out: dict) -> None:
    if msg.HasField("content_text"):
        out["content"] = msg.content_text
    else:
        enc = _PART.encode
        out["content"] = [enc(p) for p in msg.content]


def _text_parts(part_type: str, attr: str, policy: int) -> _Custom:
    """Reasoning `summary` / `content`: `[{"type": part_type, "text": ...}]` held as strings.

    Parts with other keys or types cannot be held as strings: their texts still fill the field,
    and the whole array is stashed so it round-trips.
    """

    def dec(msg: Any, value: Any, path: str) -> bool:
        if not isinstance(value, list):
            raise _type_error(path, "an array", value)
        texts = getattr(msg, attr)
        exact = bool(value) or policy == ALWAYS  # an explicit `[]` for NONEMPTY is stashed
        for i, part in enumerate(value):
            _require_object(part, f"{path}[{i}]")
            text = part.get("text")
            if type(text) is not str:
                raise _type_error(f"{path}[{i}].text", "a string", text)
            texts.append(text)
            if exact and (len(part) != 2 or part.get("type") != part_type):
                exact = False
        return exact

    def enc(msg: Any, out: dict) -> None:
        texts = getattr(msg, attr)
        if texts or policy == ALWAYS:
            out[attr] = [{"type": part_type, "text": t} for t in texts]

    return _Custom(attr, dec, enc, policy)


# One tool of an `mcp_list_tools` item.
_MCP_TOOL_INFO = _Codec(
    items_pb2.McpToolInfo,
    _Scalar("name"),
    _Scalar("description", NULLABLE),
    _Json("input_schema", "input_schema_json", dict),
    _Json("annotations", "annotations_json", dict, NULLABLE),
    skip=(),
)


def _infer_item_type(d: dict) -> str:
    """Items may omit `type`: `{"role","content"}` is a message, `{"id"}` an item reference."""
    if "role" in d:
        return "message"
    return "item_reference" if "id" in d else ""


def _output_dec(msg: items_pb2.FunctionCallOutput, value: Any, path: str) -> bool:
    """function_call_output `output`: a string, or an array of content (kept as JSON text)."""
    if type(value) is str:
        msg.output_text = value
    elif isinstance(value, list):
        msg.output_json = _text(value)
    else:
        raise _type_error(path, "one of a string or array of content", value)
    return True


def _output_enc(msg: items_pb2.FunctionCallOutput, out: dict) -> None:
    arm = msg.WhichOneof("output")
    if arm == "output_text":
        out["output"] = msg.output_text
    elif arm == "output_json":
        out["output"] = orjson.loads(msg.output_json)


# `agent: {agent_name}`: the agent of a multi-agent response that produced an item or event.
_AGENT = _Codec(items_pb2.AgentRef, _Scalar("agent_name"), skip=())
_PARTS = _List("output", _PART.decode, _PART.encode)

_ITEM = _Union(
    "item",
    {
        "message": _Codec(
            items_pb2.Message,
            _Scalar("id", NONEMPTY),
            _Scalar("role", NONEMPTY),
            _Scalar("status", NONEMPTY),
            _Custom("content", _content_dec, _content_enc),
            _Scalar("phase", NONEMPTY),
        ),
        "function_call": _Codec(
            items_pb2.FunctionCall,
            _Scalar("id", NONEMPTY),
            _Scalar("call_id", NONEMPTY),
            _Scalar("name", NONEMPTY),
            _Scalar("arguments"),
            _Scalar("status", NONEMPTY),
        ),
        "function_call_output": _Codec(
            items_pb2.FunctionCallOutput,
            _Scalar("id", NONEMPTY),
            _Scalar("call_id", NONEMPTY),
            _Custom("output", _output_dec, _output_enc),
            _Scalar("status", NONEMPTY),
        ),
        "reasoning": _Codec(
            items_pb2.ReasoningItem,
            _Scalar("id", NONEMPTY),
            _text_parts("summary_text", "summary", ALWAYS),
            _text_parts("reasoning_text", "content", NONEMPTY),
            _Scalar("encrypted_content", OPTIONAL),
            _Scalar("status", NONEMPTY),
        ),
        "compaction": _Codec(
            items_pb2.CompactionItem,
            _Scalar("id", NONEMPTY),
            _Scalar("encrypted_content", NONEMPTY),
            _Scalar("created_by", NONEMPTY),
        ),
        "item_reference": _Codec(items_pb2.ItemReference, _Scalar("id", NONEMPTY)),
        "mcp_list_tools": _Codec(
            items_pb2.McpListTools,
            _Scalar("id", NONEMPTY),
            _Scalar("server_label"),
            _List("tools", lambda m, v, p: _MCP_TOOL_INFO.decode_into(v, m, p), lambda t: _MCP_TOOL_INFO.encode(t, {})),
            _Scalar("error", NULLABLE),
        ),
        "mcp_call": _Codec(
            items_pb2.McpCall,
            _Scalar("id", NONEMPTY),
            _Scalar("server_label"),
            _Scalar("name"),
            _Scalar("arguments"),
            _Scalar("output", NULLABLE),
            _Json("error", "error_json", dict, NULLABLE),
            _Scalar("status", NONEMPTY),
            _Scalar("approval_request_id", NULLABLE),
        ),
        "mcp_approval_request": _Codec(
            items_pb2.McpApprovalRequest,
            _Scalar("id", NONEMPTY),
            _Scalar("server_label"),
            _Scalar("name"),
            _Scalar("arguments"),
        ),
        "mcp_approval_response": _Codec(
            items_pb2.McpApprovalResponse,
            _Scalar("id", NONEMPTY),
            _Scalar("approval_request_id"),
            _Scalar("approve"),
            _Scalar("reason", NULLABLE),
        ),
        "multi_agent_call": _Codec(
            items_pb2.MultiAgentCall,
            _Scalar("id", NONEMPTY),
            _Scalar("action"),
            _Scalar("arguments"),
            _Scalar("call_id"),
        ),
        "multi_agent_call_output": _Codec(
            items_pb2.MultiAgentCallOutput,
            _Scalar("id", NONEMPTY),
            _Scalar("action"),
            _Scalar("call_id"),
            _PARTS,
        ),
        "agent_message": _Codec(
            items_pb2.AgentMessage,
            _Scalar("id", NONEMPTY),
            _Scalar("author"),
            _Scalar("recipient"),
            _List("content", _PART.decode, _PART.encode),
        ),
    },
    infer=_infer_item_type,
    wrapper=_Codec(items_pb2.Item, _Sub("agent", _AGENT), skip=()),
)


def item_from_json(d: dict, path: str = "input[0]") -> items_pb2.Item:
    """One input or output item; `path` names it in error params (`input[3]` -> `input[3].content`)."""
    item = items_pb2.Item()
    _ITEM.decode(item, d, path)
    return item


def item_to_json(item: items_pb2.Item) -> dict:
    return _ITEM.encode(item)


def _items_field(key: str, policy: int = ALWAYS, attr: str | None = None) -> _List:
    return _List(key, _ITEM.decode, _ITEM.encode, policy, attr)


# ---------------------------------------------------------------------------------------------
# The create body.
# ---------------------------------------------------------------------------------------------

_MCP_FILTER = _Codec(request_pb2.McpToolFilter, _Scalar("tool_names", NONEMPTY), _Scalar("read_only", OPTIONAL))


def _mcp_allowed_dec(msg: request_pb2.McpTool, value: Any, path: str) -> bool:
    """`allowed_tools`: a list of tool names, or `{"tool_names": [...], "read_only": bool}`."""
    if isinstance(value, list):
        if not _is_str_list(value):
            raise _type_error(path, "an array of strings", value)
        msg.allowed_names.names.extend(value)
        return True
    if not isinstance(value, dict):
        raise _type_error(path, "one of an array of tool names or a filter object", value)
    msg.allowed_filter.SetInParent()
    return _MCP_FILTER.decode_into(value, msg.allowed_filter, path)


def _mcp_allowed_enc(msg: request_pb2.McpTool, out: dict) -> None:
    arm = msg.WhichOneof("allowed")
    if arm == "allowed_names":
        out["allowed_tools"] = list(msg.allowed_names.names)
    elif arm == "allowed_filter":
        out["allowed_tools"] = _MCP_FILTER.encode(msg.allowed_filter, {})


_MCP_APPROVAL_FILTER = _Codec(
    request_pb2.McpApprovalFilter, _Sub("always", _MCP_FILTER), _Sub("never", _MCP_FILTER), skip=()
)


def _mcp_approval_dec(msg: request_pb2.McpTool, value: Any, path: str) -> bool:
    """`require_approval`: "always" | "never", or `{"always": filter, "never": filter}`."""
    if type(value) is str:
        msg.approval_mode = value
        return True
    if not isinstance(value, dict):
        raise _type_error(path, "one of a string or an approval filter object", value)
    msg.approval_filter.SetInParent()
    return _MCP_APPROVAL_FILTER.decode_into(value, msg.approval_filter, path)


def _mcp_approval_enc(msg: request_pb2.McpTool, out: dict) -> None:
    arm = msg.WhichOneof("approval")
    if arm == "approval_mode":
        out["require_approval"] = msg.approval_mode
    elif arm == "approval_filter":
        out["require_approval"] = _MCP_APPROVAL_FILTER.encode(msg.approval_filter, {})


_TOOL = _Union(
    "tool",
    {
        "function": _Codec(
            request_pb2.FunctionTool,
            _Scalar("name", NONEMPTY),
            _Scalar("description", OPTIONAL),
            _Json("parameters", "parameters_json", dict, NONEMPTY),
            _Scalar("strict", OPTIONAL),
        ),
        "mcp": _Codec(
            request_pb2.McpTool,
            _Scalar("server_label", NONEMPTY),
            _Scalar("server_url", OPTIONAL),
            _Scalar("server_description", OPTIONAL),
            _Scalar("headers", NONEMPTY),
            _Scalar("authorization", OPTIONAL),
            _Custom("allowed_tools", _mcp_allowed_dec, _mcp_allowed_enc),
            _Custom("require_approval", _mcp_approval_dec, _mcp_approval_enc),
            _Scalar("connector_id", OPTIONAL),
        ),
    },
)


def _tool_choice_dec(msg: Any, value: Any, path: str) -> bool:
    """`tool_choice`: a mode string, `{"type":"function","name":...}`, or any other form as JSON."""
    tc = msg.tool_choice
    if type(value) is str:
        tc.mode = value
    elif isinstance(value, dict):
        name = value.get("name")
        if len(value) == 2 and value.get("type") == "function" and type(name) is str:
            tc.function_name = name
        else:
            tc.other_json = _text(value)
    else:
        raise _type_error(path, "one of a string or object", value)
    return True


def _tool_choice_json(tc: request_pb2.ToolChoice) -> Any:
    arm = tc.WhichOneof("choice")
    if arm == "mode":
        return tc.mode
    if arm == "function_name":
        return {"type": "function", "name": tc.function_name}
    if arm == "other_json":
        return orjson.loads(tc.other_json)
    return None


def _tool_choice_enc(msg: Any, out: dict) -> None:
    choice = _tool_choice_json(msg.tool_choice)
    if choice is not None:
        out["tool_choice"] = choice


def _input_dec(msg: Any, value: Any, path: str) -> bool:
    """`input`: a plain string (`input_text`) or an array of items; `[]` is stashed."""
    if type(value) is str:
        msg.input_text = value
        return True
    if not isinstance(value, list):
        raise _type_error(path, "one of a string or array of input items", value)
    return bool(value) and _decode_list(msg.input, value, path, _ITEM.decode)


def _input_enc(msg: Any, out: dict) -> None:
    if msg.HasField("input_text"):
        out["input"] = msg.input_text
    elif msg.input:
        enc = _ITEM.encode
        out["input"] = [enc(i) for i in msg.input]


def _conversation_dec(msg: Any, value: Any, path: str) -> bool:
    """`conversation`: an id, or `{"id": ...}` (the object is stashed so it echoes unchanged)."""
    if type(value) is str:
        msg.conversation = value
        return bool(value)  # "" reads back as absent: stashed
    if isinstance(value, dict) and type(value.get("id")) is str:
        msg.conversation = value["id"]
        return False
    raise _type_error(path, "one of a string or an object with a string 'id'", value)


def _conversation_enc(msg: Any, out: dict) -> None:
    if msg.conversation:
        out["conversation"] = msg.conversation


def _ignore_create_type(msg: Any, value: Any, path: str) -> bool:
    """The WS `type` next to the body: dropped when it is `response.create`, else an unknown key."""
    return value == "response.create"


def _reasoning_codec(policy: int, typed_wins: bool) -> _Codec:
    return _Codec(
        request_pb2.ReasoningConfig,
        _Scalar("effort", policy),
        _Scalar("summary", policy),
        typed_wins=typed_wins,
    )


_TEXT_FORMAT = _Codec(
    request_pb2.TextFormat,
    _Scalar("type"),
    _Scalar("name", NONEMPTY),
    _Json("schema", "schema_json", dict, NONEMPTY),
    _Scalar("strict", OPTIONAL),
    _Scalar("description", OPTIONAL),
    skip=(),
)
_TEXT = _Codec(request_pb2.TextConfig, _Sub("format", _TEXT_FORMAT), _Scalar("verbosity", OPTIONAL))
_CONTEXT_MANAGEMENT = _Codec(
    request_pb2.ContextManagement, _Scalar("type"), _Scalar("compact_threshold", OPTIONAL), skip=()
)

_PROMPT = _Codec(
    request_pb2.Prompt,
    _Scalar("id"),
    _Scalar("version", OPTIONAL),
    _Json("variables", "variables_json", dict, NONEMPTY),
    skip=(),
)

_PARAMS = _Codec(
    request_pb2.ResponseCreateParams,
    _Custom("type", _ignore_create_type, lambda m, o: None),
    _Scalar("model", NONEMPTY),
    _Scalar("instructions", OPTIONAL),
    _Custom("input", _input_dec, _input_enc),
    _List("tools", _TOOL.decode, _TOOL.encode, NONEMPTY),
    _Custom("tool_choice", _tool_choice_dec, _tool_choice_enc),
    _Scalar("parallel_tool_calls", OPTIONAL),
    _Scalar("previous_response_id", NONEMPTY),
    _Scalar("store", OPTIONAL),
    _Scalar("generate", OPTIONAL),
    _Scalar("max_output_tokens", OPTIONAL),
    _Scalar("max_tool_calls", OPTIONAL),
    _Scalar("temperature", OPTIONAL),
    _Scalar("top_p", OPTIONAL),
    _Sub("reasoning", _reasoning_codec(OPTIONAL, typed_wins=False)),
    _Sub("text", _TEXT),
    _Scalar("metadata", NONEMPTY),
    _List(
        "context_management",
        lambda m, v, p: _CONTEXT_MANAGEMENT.decode_into(v, m, p),
        lambda m: _CONTEXT_MANAGEMENT.encode(m, {}),
        NONEMPTY,
    ),
    _Scalar("prompt_cache_key", NONEMPTY),
    _Scalar("include", NONEMPTY),
    _Scalar("user", NONEMPTY),
    _Scalar("safety_identifier", NONEMPTY),
    _Scalar("stream_id", NONEMPTY),
    _Scalar("truncation", NONEMPTY),
    _Scalar("service_tier", NONEMPTY),
    _Scalar("background", OPTIONAL),
    _Scalar("stream", OPTIONAL),
    _Custom("conversation", _conversation_dec, _conversation_enc),
    _Scalar("top_logprobs", OPTIONAL),
    _Sub("prompt", _PROMPT),
    _Sub("multi_agent", _Codec(request_pb2.MultiAgentConfig, _Scalar("enabled"),
                               _Scalar("max_concurrent_subagents", OPTIONAL), skip=())),  # fmt: skip
    skip=(),
)


def params_from_json(d: dict) -> request_pb2.ResponseCreateParams:
    """The create body (`POST /v1/responses`, or the WS `response.create` event with its `type`).

    `"type": "response.create"` is accepted and dropped, so WS callers need not strip it; any
    other `type` value is kept as an unknown key. Only JSON shapes and types are checked.
    """
    params = request_pb2.ResponseCreateParams()
    _PARAMS.decode_into(d, params, "")
    return params


def params_to_json(p: request_pb2.ResponseCreateParams) -> dict:
    """The create body, with exactly the keys that were set (no `type`)."""
    return _PARAMS.encode(p, {})


# ---------------------------------------------------------------------------------------------
# The Response object.
# ---------------------------------------------------------------------------------------------

_USAGE = _Codec(
    response_pb2.Usage,
    _Scalar("input_tokens"),
    _Inline(
        "input_tokens_details",
        _Codec(
            response_pb2.Usage, _Scalar("cached_tokens"), _Scalar("cache_write_tokens"), _Scalar("image_tokens", NONEMPTY)
        ),
    ),
    _Scalar("output_tokens"),
    _Inline(
        "output_tokens_details",
        _Codec(
            response_pb2.Usage,
            _Scalar("reasoning_tokens"),
            _Scalar("accepted_prediction_tokens", NONEMPTY),
            _Scalar("rejected_prediction_tokens", NONEMPTY),
        ),
    ),
    _Scalar("total_tokens"),
)

_DEFAULT_TEXT_FORMAT = {"type": "text"}


def _response_text_dec(r: response_pb2.Response, value: Any, path: str) -> bool:
    r.text.SetInParent()
    return _TEXT.decode_into(value, r.text, path)


def _response_text_enc(r: response_pb2.Response, out: dict) -> None:
    text = _TEXT.encode(r.text, {}) if r.HasField("text") else {}
    text.setdefault("format", dict(_DEFAULT_TEXT_FORMAT))
    out["text"] = text


def _response_tool_choice_enc(r: response_pb2.Response, out: dict) -> None:
    choice = _tool_choice_json(r.tool_choice)
    out["tool_choice"] = "auto" if choice is None else choice


_RESPONSE_NULL_KEYS = (
    "prompt_cache_retention",
    "prompt_cache_options",
    "prompt_cache_diagnostics",
    "access_programs",
    "image",
    "moderation",
    "input_transformations",
    "tool_usage",
)


def _response_tool_enc(tool: request_pb2.Tool) -> dict:
    """An echoed tool: a function tool always carries `description` and `strict` (null when the
    client did not set them), as the API's Response documents."""
    out = _TOOL.encode(tool)
    if out.get("type") == "function":
        out.setdefault("description", None)
        out.setdefault("strict", None)
    return out


def _response_error_code_dec(e: response_pb2.ResponseError, value: Any, path: str) -> bool:
    if type(value) is not str:
        raise _type_error(path, "a string", value)
    if not e.code:  # `tether_code`, read before or after, is the precise code
        e.code = value
    return True


def _tether_code_dec(e: response_pb2.ResponseError, value: Any, path: str) -> bool:
    if type(value) is not str:
        raise _type_error(path, "a string", value)
    if value:
        e.code = value
    return True


def _response_error_code_enc(e: response_pb2.ResponseError, out: dict) -> None:
    out["code"] = errors.response_code(e.code)
    out["tether_code"] = e.code


def _written_with_code(e: response_pb2.ResponseError, out: dict) -> None:
    """`tether_code` is written by the `code` encoder."""


# A Response's `error`: the API types `code` as a closed list, so `code` is the catalogue's
# `response_code` for Tether's code and `tether_code` (an extra key, which the SDK's models keep)
# is the precise one; reading takes `tether_code` when present.
_RESPONSE_ERROR = _Codec(
    response_pb2.ResponseError,
    _Custom("code", _response_error_code_dec, _response_error_code_enc),
    _Custom("tether_code", _tether_code_dec, _written_with_code),
    _Scalar("message"),
    _Scalar("retry_after_s", NONEMPTY),
)

_RESPONSE = _Codec(
    response_pb2.Response,
    _Scalar("id"),
    _Const("object", "response"),
    _Scalar("created_at"),
    _Scalar("status", NULLABLE),
    _Scalar("completed_at", NULLABLE),
    _Scalar("background"),
    _Sub("error", _RESPONSE_ERROR, NULLABLE),
    _Sub("incomplete_details", _Codec(response_pb2.IncompleteDetails, _Scalar("reason")), NULLABLE),
    _Scalar("instructions", NULLABLE),
    _Scalar("max_output_tokens", NULLABLE),
    _Scalar("max_tool_calls", NULLABLE),
    _Scalar("model"),
    _items_field("output"),
    _Scalar("parallel_tool_calls"),
    _Scalar("previous_response_id", NULLABLE),
    _Sub("reasoning", _reasoning_codec(NULLABLE, typed_wins=True), ALWAYS),
    _Scalar("store"),
    _Scalar("temperature"),
    _Custom("text", _response_text_dec, _response_text_enc),
    _Custom("tool_choice", _tool_choice_dec, _response_tool_choice_enc),
    _List("tools", _TOOL.decode, _response_tool_enc),
    _Scalar("top_p"),
    _Scalar("truncation", fallback="disabled"),
    _Sub("usage", _USAGE, NULLABLE),
    _Scalar("user", NULLABLE),
    _Scalar("metadata"),
    _Scalar("prompt_cache_key", NULLABLE),
    _Scalar("safety_identifier", NULLABLE),
    _Scalar("service_tier", NULLABLE),
    _Sub(
        "backend_timing",
        _Codec(
            response_pb2.BackendTiming,
            *(_Scalar(k) for k in ("queue_time", "prompt_time", "completion_time", "total_time")),
        ),
    ),
    _Sub(
        "server_timing",
        _Codec(
            response_pb2.ServerTiming, _Scalar("stages_ms"), _Scalar("overhead_ms"), _Scalar("usage_sources", NONEMPTY)
        ),
    ),
    _Sub("conversation", _Codec(response_pb2.ConversationRef, _Scalar("id")), NULLABLE),
    _Scalar("top_logprobs"),
    _Sub("prompt", _PROMPT, NULLABLE),
    # Documented keys Tether has no value for: their defaults (penalties are not applied; images,
    # moderation and access programs are refused).
    _Const("presence_penalty", 0.0),
    _Const("frequency_penalty", 0.0),
    *(_Const(k, None) for k in _RESPONSE_NULL_KEYS),
    skip=(),
    typed_wins=True,
)


def response_to_json(r: response_pb2.Response) -> dict:
    """The Response object as OpenAI returns it: every documented key, null where unset.

    Defaults: `text` {"format":{"type":"text"}}, `tool_choice` "auto", `truncation` "disabled",
    `reasoning` {"effort": null, "summary": null}; `usage` is null until set. The Tether
    extensions `backend_timing` and `server_timing` ({"stages_ms": {...}, "overhead_ms": x})
    appear only when set.
    """
    return _RESPONSE.encode(r, {})


def response_from_json(d: dict) -> response_pb2.Response:
    """The inverse of `response_to_json` (nulls read as unset; `object` is implied)."""
    r = response_pb2.Response()
    _RESPONSE.decode_into(d, r, "")
    return r


# ---------------------------------------------------------------------------------------------
# Server events.
# ---------------------------------------------------------------------------------------------


_RESPONSE_EVENT = _Codec(events_pb2.ResponseEvent, _Sub("response", _RESPONSE, ALWAYS))
_OUTPUT_ITEM_EVENT = _Codec(
    events_pb2.OutputItemEvent,
    _Scalar("output_index"),
    _OneOf("item", _ITEM),
)
_CONTENT_PART_EVENT = _Codec(
    events_pb2.ContentPartEvent,
    _Scalar("item_id"),
    _Scalar("output_index"),
    _Scalar("content_index"),
    _OneOf("part", _PART),
)


def _text_event(cls: Any, text_key: str, *, logprobs: bool) -> _Codec:
    """output_text / refusal / reasoning_text delta and done events share two messages."""
    attr = "delta" if text_key == "delta" else "text"
    fields: list[_Field] = [
        _Scalar("item_id"),
        _Scalar("output_index"),
        _Scalar("content_index"),
        _Scalar(text_key, attr=attr),
    ]
    if logprobs:
        fields.append(_Json("logprobs", "logprobs_json", list))
    return _Codec(cls, *fields)


def _summary_part_dec(m: events_pb2.ReasoningSummaryPartEvent, value: Any, path: str) -> bool:
    text = _require_object(value, path).get("text", "")
    if type(text) is not str:
        raise _type_error(f"{path}.text", "a string", text)
    m.text = text
    return True


def _summary_part_enc(m: events_pb2.ReasoningSummaryPartEvent, out: dict) -> None:
    out["part"] = {"type": "summary_text", "text": m.text}


_SUMMARY_PART_EVENT = _Codec(
    events_pb2.ReasoningSummaryPartEvent,
    _Scalar("item_id"),
    _Scalar("output_index"),
    _Scalar("summary_index"),
    _Custom("part", _summary_part_dec, _summary_part_enc),
)


def _summary_text_event(cls: Any, text_key: str) -> _Codec:
    return _Codec(
        cls, _Scalar("item_id"), _Scalar("output_index"), _Scalar("summary_index"), _Scalar(text_key)
    )


_STEER_REF = _Codec(events_pb2.SteerRef, _Scalar("id"), _Scalar("previous_response_id"))


def _error_codec(*keys: str) -> _Codec:
    return _Codec(
        events_pb2.Error, *(_Scalar(k, ALWAYS if k == "message" else NULLABLE) for k in keys), skip=()
    )


_ERROR_BODY = _error_codec("type", "code", "message", "param")  # WS `error.error`, steer.failed `error`
_ERROR_FLAT = _error_codec("code", "message", "param")  # the HTTP SSE `error` event
_ERROR_STATUS = _error_codec("status")  # the WS envelope's top-level `status`


def _error_body(err: events_pb2.Error) -> dict:
    """`{"type","code","message","param"}` with nulls for empty code/param."""
    return {
        "type": err.type or errors.error_type_for(err.status or 400),
        "code": err.code or None,
        "message": err.message,
        "param": err.param or None,
    }


def _steer_failed_steer_dec(m: events_pb2.SteerFailedEvent, value: Any, path: str) -> bool:
    d = _require_object(value, path)
    steer = {k: v for k, v in d.items() if k != "input"}
    _STEER_REF.decode(steer, m.steer, path)
    if "input" in d:
        _input_dec(m, d["input"], f"{path}.input")
    return True


def _steer_failed_steer_enc(m: events_pb2.SteerFailedEvent, out: dict) -> None:
    steer: dict[str, Any] = {}
    _input_enc(m, steer)
    steer.setdefault("input", [])
    steer["previous_response_id"] = m.steer.previous_response_id
    if m.steer.id:
        steer["id"] = m.steer.id
    out["steer"] = steer


def _steer_failed_error_dec(m: events_pb2.SteerFailedEvent, value: Any, path: str) -> bool:
    _ERROR_BODY.decode(_require_object(value, path), m.error, path)
    return True


def _steer_failed_error_enc(m: events_pb2.SteerFailedEvent, out: dict) -> None:
    e = m.error
    body = {"code": e.code, "message": e.message, "type": e.type or "invalid_request_error"}
    if e.param:
        body["param"] = e.param
    out["error"] = body


_STEER_SUB = _Sub("steer", _STEER_REF, ALWAYS)
# `response.inject.failed`'s `error`: `{code, message}`, as the beta contract has it.
_INJECT_ERROR = _Codec(events_pb2.Error, _Scalar("code"), _Scalar("message"), skip=())

_MCP_ITEM_EVENT = _Codec(events_pb2.McpItemEvent, _Scalar("item_id"), _Scalar("output_index"))

# oneof arm -> (JSON type, codec). The one table that names every modelled event.
_EVENT_ARMS: dict[str, tuple[str, _Codec | None]] = {
    "created": ("response.created", _RESPONSE_EVENT),
    "in_progress": ("response.in_progress", _RESPONSE_EVENT),
    "completed": ("response.completed", _RESPONSE_EVENT),
    "failed": ("response.failed", _RESPONSE_EVENT),
    "incomplete": ("response.incomplete", _RESPONSE_EVENT),
    "queued": ("response.queued", _RESPONSE_EVENT),
    "output_item_added": ("response.output_item.added", _OUTPUT_ITEM_EVENT),
    "output_item_done": ("response.output_item.done", _OUTPUT_ITEM_EVENT),
    "content_part_added": ("response.content_part.added", _CONTENT_PART_EVENT),
    "content_part_done": ("response.content_part.done", _CONTENT_PART_EVENT),
    "output_text_delta": (
        "response.output_text.delta",
        _text_event(events_pb2.TextDeltaEvent, "delta", logprobs=True),
    ),
    "output_text_done": (
        "response.output_text.done",
        _text_event(events_pb2.TextDoneEvent, "text", logprobs=True),
    ),
    "refusal_delta": (
        "response.refusal.delta",
        _text_event(events_pb2.TextDeltaEvent, "delta", logprobs=False),
    ),
    "refusal_done": (
        "response.refusal.done",
        _text_event(events_pb2.TextDoneEvent, "refusal", logprobs=False),
    ),
    "function_call_arguments_delta": (
        "response.function_call_arguments.delta",
        _Codec(
            events_pb2.FunctionCallArgumentsDeltaEvent,
            _Scalar("item_id"),
            _Scalar("output_index"),
            _Scalar("delta"),
        ),
    ),
    "function_call_arguments_done": (
        "response.function_call_arguments.done",
        _Codec(
            events_pb2.FunctionCallArgumentsDoneEvent,
            _Scalar("item_id"),
            _Scalar("output_index"),
            _Scalar("name"),
            _Scalar("arguments"),
        ),
    ),
    "custom_tool_call_input_delta": (
        "response.custom_tool_call_input.delta",
        _Codec(
            events_pb2.CustomToolCallInputDeltaEvent,
            _Scalar("item_id"),
            _Scalar("output_index"),
            _Scalar("delta"),
        ),
    ),
    "custom_tool_call_input_done": (
        "response.custom_tool_call_input.done",
        _Codec(
            events_pb2.CustomToolCallInputDoneEvent,
            _Scalar("item_id"),
            _Scalar("output_index"),
            _Scalar("input"),
        ),
    ),
    "reasoning_text_delta": (
        "response.reasoning_text.delta",
        _text_event(events_pb2.TextDeltaEvent, "delta", logprobs=False),
    ),
    "reasoning_text_done": (
        "response.reasoning_text.done",
        _text_event(events_pb2.TextDoneEvent, "text", logprobs=False),
    ),
    "reasoning_summary_part_added": ("response.reasoning_summary_part.added", _SUMMARY_PART_EVENT),
    "reasoning_summary_part_done": ("response.reasoning_summary_part.done", _SUMMARY_PART_EVENT),
    "reasoning_summary_text_delta": (
        "response.reasoning_summary_text.delta",
        _summary_text_event(events_pb2.ReasoningSummaryTextDeltaEvent, "delta"),
    ),
    "reasoning_summary_text_done": (
        "response.reasoning_summary_text.done",
        _summary_text_event(events_pb2.ReasoningSummaryTextDoneEvent, "text"),
    ),
    "compaction_compacting": (
        "response.compaction.compacting",
        _Codec(events_pb2.CompactionCompactingEvent, _Scalar("item_id"), _Scalar("output_index")),
    ),
    "mcp_call_arguments_delta": (
        "response.mcp_call_arguments.delta",
        _Codec(
            events_pb2.FunctionCallArgumentsDeltaEvent,
            _Scalar("item_id"),
            _Scalar("output_index"),
            _Scalar("delta"),
        ),
    ),
    "mcp_call_arguments_done": (
        "response.mcp_call_arguments.done",
        _Codec(
            events_pb2.McpCallArgumentsDoneEvent,
            _Scalar("item_id"),
            _Scalar("output_index"),
            _Scalar("arguments"),
        ),
    ),
    **{
        f"mcp_{what}_{stage}": (f"response.mcp_{what}.{stage}", _MCP_ITEM_EVENT)
        for what in ("call", "list_tools")
        for stage in ("in_progress", "completed", "failed")
    },
    "error": ("error", None),  # transport-dependent shape: `_error_event_json`
    "steer_accepted": ("response.steer.accepted", _Codec(events_pb2.SteerAcceptedEvent, _STEER_SUB)),
    "steer_pending": (
        "response.steer.pending",
        _Codec(
            events_pb2.SteerPendingEvent,
            _STEER_SUB,
            _Scalar("reason"),
            _Json("required_input", "required_input_json", list),
        ),
    ),
    "steer_failed": (
        "response.steer.failed",
        _Codec(
            events_pb2.SteerFailedEvent,
            _Custom("error", _steer_failed_error_dec, _steer_failed_error_enc),
            _Custom("steer", _steer_failed_steer_dec, _steer_failed_steer_enc),
        ),
    ),
    "inject_created": ("response.inject.created", _Codec(events_pb2.InjectCreatedEvent, _Scalar("response_id"))),
    "inject_failed": (
        "response.inject.failed",
        _Codec(
            events_pb2.InjectFailedEvent,
            _Scalar("response_id"),
            _items_field("input"),
            _Sub("error", _INJECT_ERROR, ALWAYS),
        ),
    ),
}
_EVENT_BY_TYPE = {t: arm for arm, (t, _) in _EVENT_ARMS.items()}
# Reads the envelope keys only (event_from_json ignores its leftovers).
_ENVELOPE = _Codec(events_pb2.ServerEvent, _Scalar("sequence_number"), _Scalar("stream_id", NULLABLE),
                   _Sub("agent", _AGENT))  # fmt: skip


def event_type(ev: events_pb2.ServerEvent) -> str:
    """The JSON `type` of an event (the SSE `event:` line) without building the JSON."""
    arm = ev.WhichOneof("event")
    if arm == "other":
        return ev.other.type
    return _EVENT_ARMS[arm][0]  # type: ignore[index]  # a server event always has its arm set


def event_to_json(ev: events_pb2.ServerEvent, *, ws: bool) -> dict:
    """One server event as its JSON object: `sequence_number` always, `stream_id` when set.

    `ws` picks the `error` shape: the WebSocket envelope (`status` + nested `error`) or the flat
    HTTP SSE event. `response_id` is a gRPC convenience and never written.
    """
    arm = ev.WhichOneof("event")
    if arm == "other":
        out = orjson.loads(ev.other.json)
    elif arm == "error":
        out = _error_event_json(ev.error.error, ws)
        if ev.error.event_id:
            out["event_id"] = ev.error.event_id
    elif arm is None:
        raise ValueError("ServerEvent has no event arm set")
    else:
        agent = ev.agent.agent_name if ev.HasField("agent") else ""
        return arm_to_json(arm, getattr(ev, arm), ev.sequence_number, ev.stream_id, agent)
    out["sequence_number"] = ev.sequence_number
    if ev.stream_id:
        out["stream_id"] = ev.stream_id
    if ev.HasField("agent"):  # a multi-agent response's error
        out["agent"] = {"agent_name": ev.agent.agent_name}
    return out


def arm_to_json(arm: str, payload: Any, sequence_number: int, stream_id: str, agent: str = "") -> dict:
    """One event from its arm's payload: the protobuf message, or any object with the same
    attributes (the outbox's merged text deltas, encoded without building a message first).
    `agent`: the multi-agent response's agent it reports (its `agent` key), "" for none."""
    t, codec = _EVENT_ARMS[arm]
    out = codec.encode(payload, {"type": t})  # type: ignore[union-attr]  # only `error` has no codec, and it never comes here
    out["sequence_number"] = sequence_number
    if stream_id:
        out["stream_id"] = stream_id
    if agent:
        out["agent"] = {"agent_name": agent}
    return out


def _error_event_json(err: events_pb2.Error, ws: bool) -> dict:
    if ws:
        return {"type": "error", "status": err.status or 400, "error": _error_body(err)}
    return {"type": "error", "code": err.code or None, "message": err.message, "param": err.param or None}


def event_from_json(d: dict) -> events_pb2.ServerEvent:
    """The inverse of `event_to_json` (either error shape); unknown types go to `other` whole."""
    _require_object(d, "")
    t = d.get("type")
    if type(t) is not str:
        raise TetherError(errors.INVALID_REQUEST, "The event has no string 'type'.", param="type")
    ev = events_pb2.ServerEvent()
    _ENVELOPE.decode(d, ev, "")
    arm = _EVENT_BY_TYPE.get(t)
    if arm is None:
        ev.other.type = t
        ev.other.json = _text(d)
    elif arm == "error":
        err = ev.error.error
        if type(d.get("event_id")) is str:
            ev.error.event_id = d["event_id"]
        body = d.get("error")
        if isinstance(body, dict):  # WS envelope
            _ERROR_BODY.decode(body, err, "error")
            _ERROR_STATUS.decode(d, err, "")
        else:
            _ERROR_FLAT.decode(d, err, "")
    else:
        sub = getattr(ev, arm)
        sub.SetInParent()
        _EVENT_ARMS[arm][1].decode(d, sub, "")  # type: ignore[union-attr]  # only `error` has no codec (decoded above)
    return ev


# ---------------------------------------------------------------------------------------------
# Client events (WebSocket).
# ---------------------------------------------------------------------------------------------

_STEER_REQUEST = _Codec(
    service_pb2.SteerRequest,
    _Scalar("previous_response_id"),
    _Custom("input", _input_dec, _input_enc),
)
_APPEND_REQUEST = _Codec(service_pb2.AppendRequest, _items_field("input"))
_CANCEL_REQUEST = _Codec(service_pb2.CancelRequest, _Scalar("response_id"))
_PROCESSED_REQUEST = _Codec(service_pb2.ProcessedRequest, _Scalar("response_id"))
_INJECT_REQUEST = _Codec(service_pb2.InjectRequest, _Scalar("response_id"), _items_field("input"))

# client event type -> (SessionRequest arm, codec). `create` uses `_PARAMS` (which drops `type`).
_CLIENT_EVENTS: dict[str, tuple[str, _Codec]] = {
    "response.create": ("create", _PARAMS),
    "response.steer": ("steer", _STEER_REQUEST),
    "response.append": ("append", _APPEND_REQUEST),
    "response.processed": ("processed", _PROCESSED_REQUEST),
    "response.cancel": ("cancel", _CANCEL_REQUEST),
    "response.inject": ("inject", _INJECT_REQUEST),
}
_CLIENT_TYPES = {arm: t for t, (arm, _) in _CLIENT_EVENTS.items()}


def client_event_from_json(d: dict) -> service_pb2.SessionRequest:
    """A WebSocket client event.

    `response.create` carries the create body next to `type`; `response.steer` reads
    `previous_response_id` and `input` (string or items); `response.append` reads `input` and keeps
    other keys (`client_metadata`) in `extra_json`; `response.inject` reads `response_id` and
    `input` (items); `response.processed` and the Tether extension `response.cancel` read
    `response_id`. Unknown keys of steer/inject/processed/cancel are ignored.
    """
    _require_object(d, "")
    t = d.get("type")
    if type(t) is not str:
        raise TetherError(
            errors.INVALID_REQUEST, "The event must have a string 'type'.", param="type"
        )
    entry = _CLIENT_EVENTS.get(t)
    if entry is None:
        raise TetherError(errors.UNKNOWN_EVENT_TYPE, f"Unknown event type '{t}'", param="type")
    arm, codec = entry
    req = service_pb2.SessionRequest()
    event_id = d.get("event_id")
    if event_id is not None:
        if type(event_id) is not str:
            raise _type_error("event_id", "a string", event_id)
        req.event_id = event_id
        d = {k: v for k, v in d.items() if k != "event_id"}
    sub = getattr(req, arm)
    sub.SetInParent()
    codec.decode_into(d, sub, "")  # leftovers of messages without `extra_json` are dropped
    return req


def client_event_to_json(req: service_pb2.SessionRequest) -> dict:
    """The inverse of `client_event_from_json` (for clients of the WS bridge and tests)."""
    arm = req.WhichOneof("event")
    if arm is None:
        raise ValueError("SessionRequest has no event arm set")
    codec = _CLIENT_EVENTS[_CLIENT_TYPES[arm]][1]
    out = codec.encode(getattr(req, arm), {"type": _CLIENT_TYPES[arm]})
    if req.event_id:
        out["event_id"] = req.event_id
    return out


# ---------------------------------------------------------------------------------------------
# HTTP bodies.
# ---------------------------------------------------------------------------------------------


_COMPACT = _Codec(
    service_pb2.CompactResponseResponse,
    _Scalar("id"),
    _Const("object", "response.compaction"),
    _Scalar("created_at"),
    _items_field("output"),
    _Sub("usage", _USAGE, ALWAYS),
)
_INPUT_ITEMS = _Codec(
    service_pb2.ListInputItemsResponse,
    _Const("object", "list"),
    _items_field("data"),
    _Scalar("first_id", NULLABLE),
    _Scalar("last_id", NULLABLE),
    _Scalar("has_more"),
)


_CONVERSATION = _Codec(
    service_pb2.Conversation,
    _Scalar("id"),
    _Const("object", "conversation"),
    _Scalar("created_at"),
    _Scalar("metadata"),
)
_CONVERSATION_ITEMS = _Codec(
    service_pb2.ListConversationItemsResponse,
    _Const("object", "list"),
    _items_field("data"),
    _Scalar("first_id", NULLABLE),
    _Scalar("last_id", NULLABLE),
    _Scalar("has_more"),
)
# Request bodies: `POST /v1/conversations`, `POST /v1/conversations/{id}` (metadata), `POST
# /v1/conversations/{id}/items`. Null reads as absent; any other key is 400 unknown_parameter.
_CONVERSATION_BODIES = {
    service_pb2.CreateConversationRequest: _Codec(
        service_pb2.CreateConversationRequest, _items_field("items"), _Scalar("metadata", NULLABLE), skip=()
    ),
    service_pb2.UpdateConversationRequest: _Codec(
        service_pb2.UpdateConversationRequest, _Scalar("metadata", NULLABLE), skip=()
    ),
    service_pb2.CreateConversationItemsRequest: _Codec(
        service_pb2.CreateConversationItemsRequest, _items_field("items"), skip=()
    ),
}


def conversation_to_json(c: service_pb2.Conversation) -> dict:
    """`{"id","object":"conversation","created_at","metadata"}`."""
    return _CONVERSATION.encode(c, {})


def conversation_items_to_json(page: service_pb2.ListConversationItemsResponse) -> dict:
    """A list page of conversation items (first/last ids null when empty)."""
    return _CONVERSATION_ITEMS.encode(page, {})


def conversation_body_from_json(cls: Any, d: dict) -> Any:
    """One of the conversation request bodies (`cls` names which), strictly: unknown keys are
    400 `unknown_parameter`, as for a create."""
    msg = cls()
    leftovers = _CONVERSATION_BODIES[cls].decode(_require_object(d, ""), msg, "")
    for key, value in (leftovers or {}).items():
        if value is not None or key not in _CONVERSATION_BODIES[cls].fields:
            raise TetherError(errors.UNKNOWN_PARAMETER, f"Unknown parameter: '{key}'.", param=key)
    return msg


def error_to_http_json(err: events_pb2.Error) -> dict:
    """The HTTP error body: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": _error_body(err)}


def compact_response_to_json(r: service_pb2.CompactResponseResponse) -> dict:
    """`POST /v1/responses/compact`: `{"id","object":"response.compaction","created_at","output","usage"}`."""
    return _COMPACT.encode(r, {})


def compact_response_from_json(d: dict) -> service_pb2.CompactResponseResponse:
    r = service_pb2.CompactResponseResponse()
    _COMPACT.decode_into(d, r, "")
    return r


def input_items_to_json(r: service_pb2.ListInputItemsResponse) -> dict:
    """`GET /v1/responses/{id}/input_items`: a list page (first/last ids null when empty)."""
    return _INPUT_ITEMS.encode(r, {})


def input_items_from_json(d: dict) -> service_pb2.ListInputItemsResponse:
    r = service_pb2.ListInputItemsResponse()
    _INPUT_ITEMS.decode_into(d, r, "")
    return r
