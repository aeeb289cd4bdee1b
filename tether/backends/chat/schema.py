"""Tool and response schemas reduced to a server's JSON-schema subset, or refused with a 400.

Cerebras compiles schemas into constrained decoding and accepts a subset (its structured-outputs
guide): types string/number/integer/boolean/object/array/null, `enum`, `const`, `properties`,
`required`, `additionalProperties`, `items`, `anyOf` (at most 5 branches), `$ref` into `$defs` /
`definitions`, `description`. Real 400s seen: "Invalid fields for schema with types ['string']:
{'format'}", "Extra top level keys found in JSON schema: {'allOf'}".

Reduction keeps the shape and drops what only annotates or narrows values (`format`, `pattern`,
length and range bounds, `title`, `default`, `examples`, `$schema`...): the arguments still parse
into the declared shape, the model is merely less constrained inside a value. A type list
(`"type": ["string", "null"]`) becomes `anyOf`. What changes the shape and cannot be expressed
(`allOf`, `oneOf`, `not`, conditionals, `items: true`, more than 5 `anyOf` branches,
`patternProperties`) is refused before the call with a 400 naming the tool and the path.
"""

from __future__ import annotations

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


def reduce_schema(schema: Any, subset: str, param: str, name: str) -> Any:
    """`schema` reduced to `subset` (only "cerebras" exists); raises a 400 TetherError otherwise."""
    if subset != "cerebras":
        raise ValueError(f"unknown schema subset {subset!r}")
    return _reduce(schema, param, name, "#")


def _refuse(name: str, param: str, path: str, what: str) -> TetherError:
    return TetherError(
        errors.UNSUPPORTED,
        f"schema {name!r} at {path}: {what} is outside the JSON-schema subset this backend supports "
        "(types, properties, required, enum, const, items, anyOf up to 5, $ref/$defs)",
        param=param,
    )


def _reduce(node: Any, param: str, name: str, path: str) -> Any:
    if isinstance(node, bool):
        if path.endswith("/items") and node is True:
            raise _refuse(name, param, path, "items: true")
        return node
    if not isinstance(node, dict):
        raise _refuse(name, param, path, f"a {type(node).__name__} where a schema object belongs")
    out: dict[str, Any] = {}
    for key, value in node.items():
        here = f"{path}/{key}"
        if key in _DROPPED:
            continue
        if key not in _KEPT:
            raise _refuse(name, param, here, repr(key))
        if key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise _refuse(name, param, here, f"{key} that is not an object")
            out[key] = {k: _reduce(v, param, name, f"{here}/{k}") for k, v in value.items()}
        elif key == "items":
            out[key] = _reduce(value, param, name, here)
        elif key == "additionalProperties":
            out[key] = value if isinstance(value, bool) else _reduce(value, param, name, here)
        elif key == "anyOf":
            if not isinstance(value, list) or not value:
                raise _refuse(name, param, here, "anyOf that is not a non-empty list")
            if len(value) > CEREBRAS_MAX_ANY_OF:
                raise _refuse(name, param, here, f"anyOf with {len(value)} branches (at most {CEREBRAS_MAX_ANY_OF})")
            out[key] = [_reduce(v, param, name, f"{here}/{i}") for i, v in enumerate(value)]
        else:
            out[key] = value
    types = out.get("type")
    if isinstance(types, list):
        if not types or len(types) > CEREBRAS_MAX_ANY_OF:
            raise _refuse(name, param, f"{path}/type", f"a type list of {len(types)}")
        del out["type"]
        branches = [{"type": t} for t in types]
        if "anyOf" in out:
            raise _refuse(name, param, f"{path}/type", "a type list next to anyOf")
        # Keywords that belong to one branch's type travel with it.
        for b in branches:
            if b["type"] == "object":
                for k in ("properties", "required", "additionalProperties"):
                    if k in out:
                        b[k] = out.pop(k)
            elif b["type"] == "array" and "items" in out:
                b["items"] = out.pop("items")
        out["anyOf"] = branches
    return out
