"""Tool and response schemas reduced to a server's JSON-schema subset, or refused with a 400.

Cerebras compiles schemas into constrained decoding and accepts a subset (its structured-outputs
guide): types string/number/integer/boolean/object/array/null, `enum`, `const`, `properties`,
`required`, `additionalProperties`, `items`, `anyOf` (at most 5 branches), `$ref` into `$defs`,
`description`. Real 400s seen: "Invalid fields for schema with types ['string']:
{'format'}", "Extra top level keys found in JSON schema: {'allOf'}".

API version 2 (the one the adapter pins, `X-Cerebras-Version-Patch: 2`) refuses the older
`definitions` keyword: it is renamed `$defs` and every `$ref` into it (`#/definitions/X`) follows.
With `strict: true` version 2 wants `additionalProperties: false` on every object: where a schema
leaves it out it is added (what a strict schema means anyway: no keys but the declared ones);
where it says `true` or gives a schema for extra keys, strict decoding cannot keep that promise
and the schema is refused with a 400 naming the tool (or `text.format`) and the path. `required`
is left as written: version 2 lets properties outside it be absent from the output.

Reduction keeps the shape and drops what only annotates or narrows values (`format`, `pattern`,
length and range bounds, `title`, `default`, `examples`, `$schema`...): the arguments still parse
into the declared shape, the model is merely less constrained inside a value. A type list
(`"type": ["string", "null"]`) becomes `anyOf`. What changes the shape and cannot be expressed
(`allOf`, `oneOf`, `not`, conditionals, `items: true`, more than 5 `anyOf` branches,
`patternProperties`) is refused before the call with a 400 naming the tool and the path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether import errors
from tether.errors import TetherError

CEREBRAS_MAX_ANY_OF = 5
_KEPT = frozenset(
    {"type", "enum", "const", "properties", "required", "additionalProperties", "items", "anyOf", "$ref",
     "$defs", "definitions", "description"}
)  # fmt: skip
_DROPPED = frozenset(
    {"format", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
     "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "uniqueItems", "minProperties",
     "maxProperties", "title", "default", "examples", "$schema", "$id", "$comment", "deprecated",
     "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "nullable"}
)  # fmt: skip


def reduce_schema(schema: Any, subset: str, param: str, name: str, *, strict: bool = False) -> Any:
    """`schema` reduced to `subset` (only "cerebras" exists), with `definitions` renamed `$defs`
    and, when `strict`, closed objects; raises a 400 TetherError otherwise."""
    if subset != "cerebras":
        raise ValueError(f"unknown schema subset {subset!r}")
    return _reduce(schema, _Where(param, name, strict), "#")


@dataclass(frozen=True)
class _Where:
    """What a refusal names (the request parameter, the tool or format name) and the mode."""

    param: str
    name: str
    strict: bool


_OLD_DEFS = "#/definitions/"


def _ref(value: Any) -> Any:
    """A `$ref` into `definitions` pointed at the same schema under `$defs`."""
    if isinstance(value, str) and value.startswith(_OLD_DEFS):
        return "#/$defs/" + value[len(_OLD_DEFS) :]
    return value


_OUTSIDE = (
    "is outside the JSON-schema subset this backend supports "
    "(types, properties, required, enum, const, items, anyOf up to 5, $ref/$defs)"
)
_NOT_STRICT = (
    "is what a strict schema cannot have on this backend (every object needs additionalProperties: "
    "false); set strict to false or close the object"
)


def _refuse(where: _Where, path: str, what: str, why: str = _OUTSIDE) -> TetherError:
    return TetherError(errors.UNSUPPORTED, f"schema {where.name!r} at {path}: {what} {why}", param=where.param)


def _reduce(node: Any, where: _Where, path: str) -> Any:
    if isinstance(node, bool):
        if path.endswith("/items") and node is True:
            raise _refuse(where, path, "items: true")
        return node
    if not isinstance(node, dict):
        raise _refuse(where, path, f"a {type(node).__name__} where a schema object belongs")
    out: dict[str, Any] = {}
    for key, value in node.items():
        here = f"{path}/{key}"
        if key in _DROPPED:
            continue
        if key not in _KEPT:
            raise _refuse(where, here, repr(key))
        if key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise _refuse(where, here, f"{key} that is not an object")
            reduced = {k: _reduce(v, where, f"{here}/{k}") for k, v in value.items()}
            if key == "properties":
                out[key] = reduced
                continue
            defs = out.setdefault("$defs", {})
            for k, v in reduced.items():
                if k in defs:
                    raise _refuse(where, here, f"{k!r} defined under both definitions and $defs")
                defs[k] = v
        elif key == "$ref":
            out[key] = _ref(value)
        elif key == "items":
            out[key] = _reduce(value, where, here)
        elif key == "additionalProperties":
            out[key] = value if isinstance(value, bool) else _reduce(value, where, here)
        elif key == "anyOf":
            if not isinstance(value, list) or not value:
                raise _refuse(where, here, "anyOf that is not a non-empty list")
            if len(value) > CEREBRAS_MAX_ANY_OF:
                raise _refuse(where, here, f"anyOf with {len(value)} branches (at most {CEREBRAS_MAX_ANY_OF})")
            out[key] = [_reduce(v, where, f"{here}/{i}") for i, v in enumerate(value)]
        else:
            out[key] = value
    types = out.get("type")
    if isinstance(types, list):
        if not types or len(types) > CEREBRAS_MAX_ANY_OF:
            raise _refuse(where, f"{path}/type", f"a type list of {len(types)}")
        del out["type"]
        branches = [{"type": t} for t in types]
        if "anyOf" in out:
            raise _refuse(where, f"{path}/type", "a type list next to anyOf")
        # Keywords that belong to one branch's type travel with it.
        for b in branches:
            if b["type"] == "object":
                for k in ("properties", "required", "additionalProperties"):
                    if k in out:
                        b[k] = out.pop(k)
                if where.strict:
                    _close(b, where, path)
            elif b["type"] == "array" and "items" in out:
                b["items"] = out.pop("items")
        out["anyOf"] = branches
    elif where.strict and (types == "object" or "properties" in out):
        _close(out, where, path)
    return out


def _close(obj: dict[str, Any], where: _Where, path: str) -> None:
    """A strict schema's object: `additionalProperties: false` (added where left out)."""
    extra = obj.setdefault("additionalProperties", False)
    if extra is not False:
        what = "additionalProperties: true" if extra is True else "a schema for additional properties"
        raise _refuse(where, f"{path}/additionalProperties", what, _NOT_STRICT)
