"""The browser test's handling of a missing browser: a skip with a message here, a failure where
the browser is required (make test-browser, which CI runs)."""

from __future__ import annotations

import pytest
from _pytest.outcomes import Failed, Skipped

from test_browser import _missing


def test_missing_browser_skips_with_a_message(monkeypatch):
    monkeypatch.delenv("MOESPEC_REQUIRE_BROWSER", raising=False)
    with pytest.raises(Skipped, match="no Chromium found.*make test-browser"):
        _missing("no Chromium found")


def test_missing_browser_fails_where_required(monkeypatch):
    monkeypatch.setenv("MOESPEC_REQUIRE_BROWSER", "1")
    with pytest.raises(Failed, match="required.*no Chromium found"):
        _missing("no Chromium found")
