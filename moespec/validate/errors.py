"""The one error type of bad input, and the one way its message is written.

Every refusal at a boundary (a file, a command-line option, a notebook parameter, a grid entry)
names where the bad value is (the file, or the option), the field (row and column, a JSON path,
a parameter name), what was expected and what was found: ``FILE: FIELD: expected X; found Y``.
The parts are kept as attributes, so that callers and tests can read them without parsing text.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input. ``where`` (the file or option), ``field``, ``expected`` and ``found`` are the
    parts of the message (None where a part does not apply)."""

    def __init__(self, message: str, *, where=None, field=None, expected=None, found=None):
        super().__init__(message)
        self.where, self.field, self.expected, self.found = where, field, expected, found


def describe(value, limit: int = 80) -> str:
    """A found value in a message: its repr, cut to ``limit`` characters."""
    text = repr(value.item() if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def refuse(where, field, expected: str, found, *, hint: str = "", error: type[InputError] = InputError,
           found_is_text: bool = False):
    """Raise ``error`` with the message ``WHERE: FIELD: expected EXPECTED; found FOUND[. HINT]``.
    ``found`` is shown with :func:`describe` unless ``found_is_text``."""
    shown = str(found) if found_is_text else describe(found)
    head = f"{where}: {field}" if field else f"{where}"
    message = f"{head}: expected {expected}; found {shown}" + (f". {hint}" if hint else "")
    raise error(message, where=str(where), field=field, expected=expected, found=found)
