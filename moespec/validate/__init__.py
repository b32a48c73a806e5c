"""Checks of what moespec reads, where it enters: one validation layer per boundary.

Each module checks one kind of input, with the schema tools the project depends on, and every
refusal is an :class:`InputError` naming the file (or option), the row or field, what was
expected and what was found:

* :mod:`.tables`: CSV tables with typed columns (counts, ranges, non-empty, parseable);
* :mod:`.jsonfile`: JSON documents against a JSON Schema (``jsonschema``, draft 2020-12);
* :mod:`.runs`: run manifests and run status (running, failed, interrupted, a stale ``running``);
* :mod:`.parameters`: notebook parameters, typed from their defaults, with their ranges;
* :mod:`.outputs`: output paths checked before the work, private folders;
* :mod:`.reference`: the papers' published tables recognised by a content digest;
* :mod:`.invariants`: what the theory needs of its inputs (byte shares, a trace that fits its model);
* :mod:`.run_identity`: the stamp a run writes into its files, and the check that files read
  together are of one run, one machine, one subject and, per state, of their machine state.
"""

from .errors import InputError, refuse

__all__ = ["InputError", "refuse"]
