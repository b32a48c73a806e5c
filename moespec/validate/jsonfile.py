"""JSON read and checked against a JSON Schema (draft 2020-12, ``jsonschema``): the boundary check
of every JSON document a command reads (run manifests, sweep grids).

Errors name the file, the field as a path (``notebooks/2/wall_s``), what the schema expects and
what the document holds; a file that is not JSON names the line and column.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from .errors import InputError, describe


def field_path(parts) -> str:
    """``["notebooks", 2, "wall_s"]`` -> ``notebooks[2].wall_s``; the document itself: ``(top level)``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


_TYPE_WORDS = {"object": "an object", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "null"}


def _schema_words(schema: Mapping) -> str:
    """A (sub)schema in words: its type and size constraints."""
    names = schema.get("type", [])
    text = " or ".join(_TYPE_WORDS.get(n, n) for n in (names if isinstance(names, list) else [names])) or "a value"
    if "minItems" in schema:
        text += f" of at least {schema['minItems']} item(s)"
    if "minLength" in schema:
        text += f" of at least {schema['minLength']} character(s)"
    return text


def _expected(err) -> str:
    """What the schema asked for at the failing field, in words."""
    v, value = err.validator, err.validator_value
    if v == "type":
        return _schema_words({"type": value})
    if v in ("oneOf", "anyOf"):
        return " or ".join(_schema_words(sub) for sub in value)
    if v == "enum":
        return f"one of {value}"
    if v == "const":
        return f"{value!r}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        sign = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        return f"a number {sign} {value}"
    if v == "minItems":
        return f"a list of at least {value} item(s)"
    if v == "minLength":
        return f"a text of at least {value} character(s)"
    if v == "required":
        return f"the field(s) {value}"
    if v == "additionalProperties":
        return f"only the fields {sorted(err.schema.get('properties', {}))}"
    if v == "pattern":
        return f"a text matching {value!r}"
    return err.message


def check(document: Any, schema: Mapping, where: str, error: type[InputError] = InputError) -> Any:
    """Check ``document`` against ``schema``; raise ``error`` for the most relevant violation,
    naming ``where``, the field, what was expected and what was found. Returns the document."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    err = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if err is None:
        return document
    path = list(err.absolute_path)
    found = err.instance
    if err.validator == "required":
        missing = [k for k in err.validator_value if k not in (err.instance or {})]
        path, found = path + missing[:1], "nothing (the field is absent)"
        expected = "the field"
    elif err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        path, found = path + extra[:1], "an unknown field"
        expected = _expected(err)
    else:
        expected = _expected(err)
    shown = found if isinstance(found, str) and found.startswith(("nothing", "an unknown")) else describe(found)
    field = field_path(path)
    raise error(f"{where}: field {field}: expected {expected}; found {shown}",
                where=where, field=field, expected=expected, found=found)


def load(path: str | Path, what: str = "JSON file", error: type[InputError] = InputError) -> Any:
    """The JSON document in ``path``; refuses a missing file, non-UTF-8 bytes and invalid JSON
    (naming the line and column)."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{what}: {path} is missing or not a file", where=str(path))
    raw = path.read_bytes()
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte at offset {exc.start}); expected JSON", where=str(path)) from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                    where=str(path), field=f"line {exc.lineno}") from None


def read(path: str | Path, schema: Mapping, what: str = "JSON file", error: type[InputError] = InputError) -> Any:
    """:func:`load` then :func:`check`."""
    return check(load(path, what, error), schema, str(path), error)
