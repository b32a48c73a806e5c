"""One function per paper table, grouped by topic; each returns a pandas DataFrame built from
measurements of the current run (published rows, when shown, carry a ``source`` column)."""
