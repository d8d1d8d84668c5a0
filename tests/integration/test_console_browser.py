"""The operator console in a real Chromium (Debian's /usr/bin/chromium, driven by Playwright).

Against a real uvicorn on a real database: sign in as an every-tenant
operator, find a paused session of each of two tenants, answer one through
its generated form (a refused answer first: its error shows beside the
field and nothing is written), abort the other, read both in the audit
trail, and sign out. Host text holding HTML and script is shown as text,
and no script runs. No browser is ever downloaded: without Chromium the
tests skip locally and fail under CI.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import Database
from tests.console_web import paused, run_async, served, session_state, token

CHROMIUM = os.environ.get("CORTEX_TEST_CHROMIUM", "/usr/bin/chromium")
# Set to a folder (docs/) to save the screenshots docs/console.md shows.
SHOTS = os.environ.get("CORTEX_CONSOLE_SCREENSHOTS")
XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def _browser_or_skip() -> Any:
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "Playwright is not installed (pip install playwright; it is in the dev extra)"
    if reason is None and not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        reason = f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must not skip the browser tests)")
        pytest.skip(reason)
    return sync_playwright


@pytest.fixture(scope="module", params=["", "/ops"], ids=["at the root", "mounted beneath /ops"])
def prefix(request: pytest.FixtureRequest) -> str:
    """Where a host serves cortex's app: at its root, or mounted beneath a path of its own."""
    found: str = request.param
    return found


@pytest.fixture(scope="module")
def page(database: Database, prefix: str) -> Iterator[Any]:
    sync_playwright = _browser_or_skip()
    with served(database, prefix) as base_url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        context = browser.new_context(
            base_url=base_url + prefix + "/", viewport={"width": 1280, "height": 900}
        )
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()


@pytest.fixture
def world(database: Database) -> dict[str, str]:
    x = uuid.uuid4().hex[:8]
    acme, globex = f"acme{x}", f"globex{x}"
    made = {
        "x": x,
        "acme_tenant": acme,
        "globex_tenant": globex,
        "acme": run_async(
            paused(database.app_url, f"{acme}/support/u1", f"Refund {x} acme", "Approve $40?")
        ),
        "globex": run_async(
            paused(database.app_url, f"{globex}/sales/u9", f"Refund {x} globex", "Approve $90?")
        ),
        "xss": run_async(
            paused(database.app_url, f"{acme}/support/u2", f"{XSS} {x}", XSS, {"html": XSS})
        ),
    }
    return made


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def test_an_operator_answers_aborts_and_signs_out(
    page: Any, world: dict[str, str], database: Database, prefix: str
) -> None:
    from playwright.sync_api import expect

    x = world["x"]
    seen: list[tuple[str, int]] = []
    page.on("response", lambda r: seen.append((urlsplit(r.url).path, r.status)))
    page.goto("console/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Operator token").fill(token("*", subject="ada@ops"))
    page.get_by_label("Operator token").press("Enter")  # the keyboard signs in
    expect(page.get_by_text("Signed in as")).to_be_visible()

    page.get_by_label("Search").fill(x)
    page.get_by_role("button", name="Filter").click()
    table = page.get_by_role("table", name="Paused sessions")
    expect(table).to_be_visible()
    expect(table.get_by_role("link", name=world["acme"])).to_be_visible()
    expect(table.get_by_role("link", name=world["globex"])).to_be_visible()
    _shot(page, "console-list.png")

    # A wrong answer: the browser lets 500 through (exclusiveMaximum has no HTML
    # attribute), the server refuses it beside the field, and nothing is written.
    table.get_by_role("link", name=world["acme"]).click()
    expect(page.get_by_role("heading", name=f"Session {world['acme']}")).to_be_visible()
    form = page.get_by_role("form", name="Answer approve-refund")
    form.get_by_label("approved").check()
    form.get_by_label("amount").fill("500")
    form.get_by_role("button", name="Resume").click()
    amount = page.get_by_role("form", name="Answer approve-refund").get_by_label("amount")
    expect(amount).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#q1-f-amount-error")).to_contain_text("500")
    assert session_state(database, world["acme"])[:2] == ("paused", 2)
    _shot(page, "console-session.png")

    form = page.get_by_role("form", name="Answer approve-refund")
    form.get_by_label("amount").fill("40")
    form.get_by_role("button", name="Resume").click()
    expect(page.get_by_role("status")).to_contain_text("The answer was recorded")
    assert session_state(database, world["acme"])[:2] == ("idle", 3)
    expect(page.get_by_text("Answer to approve-refund")).to_be_visible()
    trail = page.get_by_role("table", name="Operator actions on this session, newest first")
    expect(trail.get_by_role("row").filter(has_text="InvalidInput")).to_have_count(1)
    expect(trail.get_by_role("row").filter(has_text="resume").filter(has_text="ok")).to_have_count(
        1
    )

    page.get_by_role("link", name="All waiting sessions").click()
    page.get_by_label("Search").fill(x)
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("link", name=world["globex"]).click()
    page.get_by_label("Reason").fill("customer withdrew")
    page.get_by_role("button", name="Abort").click()
    expect(page.get_by_role("status")).to_contain_text("The session was aborted")
    assert session_state(database, world["globex"])[0] == "aborted"
    trail = page.get_by_role("table", name="Operator actions on this session, newest first")
    expect(
        trail.get_by_role("row").filter(has_text="abort").filter(has_text="ada@ops")
    ).to_have_count(1)

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("status")).to_contain_text("You are signed out")
    page.goto("console/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    # Every page, form, redirect and stylesheet stayed beneath the host's prefix.
    assert all(path.startswith(prefix + "/console/") for path, _ in seen), seen
    assert (prefix + "/console/static/console.css", 200) in seen
    assert not [path for path, status in seen if status == 404]


def test_host_html_is_text_and_no_script_runs(page: Any, world: dict[str, str]) -> None:
    from playwright.sync_api import expect

    page.goto("console/sign-in")
    page.get_by_label("Operator token").fill(token(world["acme_tenant"]))
    page.get_by_role("button", name="Sign in").click()
    page.goto(f"console/?search={world['x']}")
    expect(page.get_by_role("cell", name=f"{XSS} {world['x']}")).to_be_visible()
    page.get_by_role("link", name=world["xss"]).click()
    expect(page.locator(".asked")).to_have_text(XSS)
    page.get_by_text("Payload").first.click()
    expect(page.locator("details pre").first).to_contain_text("<script>")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("script").count() == 0
    assert page.locator("main img").count() == 0
    page.get_by_role("button", name="Sign out").click()
