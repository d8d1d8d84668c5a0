"""Progress of long work: log lines off a terminal, and silence when there is nothing to do."""

from __future__ import annotations

import logging

import pytest

from cortex._revision_helpers.progress_v1 import progress


def test_nothing_to_do_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cortex"), progress("pages", 0, unit="pages") as step:
        step(0)
    assert caplog.records == []


def test_off_a_terminal_work_is_logged_with_its_count(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cortex"), progress("pages", 3, unit="pages") as step:
        step(3)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == "pages: 3 pages to do"
    assert lines[-1].startswith("pages: 3/3 pages (100%)")
