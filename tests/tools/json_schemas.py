"""JSON schemas for the structured-output tests: formats, anyOf, $ref, additionalProperties,
patterns, enums, const, array and number bounds, nesting. Strings are bounded so that a small
model's reply always ends inside max_tokens."""
from __future__ import annotations

from typing import Any

S = {"type": "string", "maxLength": 24}
N = {"type": "integer", "minimum": -999, "maximum": 999}

SCHEMAS: dict[str, dict[str, Any]] = {
    "integer in range": {"type": "integer", "minimum": 3, "maximum": 9},
    "boolean": {"type": "boolean"},
    "short string": {"type": "string", "minLength": 2, "maxLength": 12},
    "number bounds": {"type": "number", "exclusiveMinimum": 0, "maximum": 100,
                      "multipleOf": 0.5},
    "enum": {"enum": ["low", "medium", "high"]},
    "const": {"const": "fixed"},
    "null or integer": {"type": ["null", "integer"], "minimum": 0, "maximum": 9},
    "date": {"type": "string", "format": "date"},
    "date-time": {"type": "string", "format": "date-time", "maxLength": 30},
    "time": {"type": "string", "format": "time", "maxLength": 20},
    "email": {"type": "string", "format": "email", "maxLength": 30},
    "uuid": {"type": "string", "format": "uuid"},
    "ipv4": {"type": "string", "format": "ipv4"},
    "pattern": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "object strict": {"type": "object", "properties": {"a": N, "b": S},
                      "required": ["a", "b"], "additionalProperties": False},
    "object optional": {"type": "object", "properties": {"x": S, "y": N},
                        "required": ["x"], "additionalProperties": False},
    "array bounds": {"type": "array", "items": N, "minItems": 2,
                     "maxItems": 4},
    "array of enums": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1,
                       "maxItems": 3},
    "tuple": {"type": "array", "prefixItems": [N, S], "items": False,
              "minItems": 2},
    "anyOf": {"anyOf": [N, {"type": "object", "properties": {"name": S},
                                               "required": ["name"],
                                               "additionalProperties": False}]},
    "oneOf-like anyOf of objects": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"},
                                          "r": {"type": "integer", "minimum": 0,
                                                "maximum": 99}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"},
                                          "side": {"type": "integer", "minimum": 1, "maximum": 99}},
         "required": ["kind", "side"], "additionalProperties": False}]},
    "ref": {"$defs": {"point": {"type": "object", "properties": {
        "x": N, "y": N}, "required": ["x", "y"],
        "additionalProperties": False}},
        "type": "object", "properties": {"from": {"$ref": "#/$defs/point"},
                                         "to": {"$ref": "#/$defs/point"}},
        "required": ["from", "to"], "additionalProperties": False},
    "ref chain": {"$defs": {"leaf": {"enum": ["x", "y"]},
                            "pair": {"type": "object", "properties": {
                                "left": {"$ref": "#/$defs/leaf"},
                                "right": {"$ref": "#/$defs/leaf"}},
                                "required": ["left", "right"], "additionalProperties": False}},
                  "$ref": "#/$defs/pair"},
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": S, "roles": {"type": "array", "items": {"enum": ["admin", "dev"]},
                             "maxItems": 2}}, "required": ["name", "roles"],
        "additionalProperties": False}}, "required": ["user"], "additionalProperties": False},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": N}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "boolean"}},
                         "required": ["b"]}],
              "properties": {"a": N, "b": {"type": "boolean"}}, "additionalProperties": False},
    "patternProperties": {"type": "object", "patternProperties": {"^[a-z]{1,8}$": N},
                          "additionalProperties": False, "maxProperties": 3},
    "multipleOf": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 50},
    "string enum in object": {"type": "object", "properties": {
        "status": {"enum": ["open", "closed"]}, "count": {"type": "integer", "minimum": 0,
                                                           "maximum": 99}},
        "required": ["status", "count"], "additionalProperties": False},
    "array of objects": {"type": "array", "items": {"type": "object", "properties": {
        "id": N, "label": S}, "required": ["id", "label"],
        "additionalProperties": False}, "minItems": 1, "maxItems": 3},
    "nullable field": {"type": "object", "properties": {"note": {"anyOf": [S, {"type": "null"}]}},
                       "required": ["note"], "additionalProperties": False},
    "pattern in object": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[a-f0-9]{6}$"},
        "when": {"type": "string", "format": "date"}},
        "required": ["code", "when"], "additionalProperties": False},
    "integer bounds negative": {"type": "integer", "minimum": -20, "maximum": -10},
    "min properties": {"type": "object", "patternProperties": {"^[a-z]{1,8}$": S},
                       "additionalProperties": False, "minProperties": 2, "maxProperties": 3},
    "object of strings": {"type": "object", "patternProperties": {"^[a-z]{1,8}$": S},
                          "additionalProperties": False, "maxProperties": 3},
    "array of arrays": {"type": "array", "items": {"type": "array", "items": {
        "type": "boolean"}, "maxItems": 2}, "minItems": 1, "maxItems": 2},
}
