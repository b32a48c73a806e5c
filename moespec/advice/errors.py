"""The error of ``moespec advise``: an input is missing, flagged or malformed."""

from __future__ import annotations

from moespec.validate.errors import InputError


class AdviceInputError(InputError):
    """An input of ``advise`` is missing, flagged or malformed; the message names it (file, field,
    expected, found)."""
