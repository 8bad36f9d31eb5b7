"""Smaller things a newcomer trips on, in the browser: "try it" with bad JSON shows what is wrong (replacing
the previous answer); the token page's curl example carries real entry ids; one nav item is lit per page."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import watch_for_problems
from tests.webapp.factories import builtin_entries
from tests.webapp.helpers import Daphne, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def entries(transactional_db: None) -> tuple[Any, Any]:
    return builtin_entries()


def test_try_it_with_bad_json_shows_the_error_in_place_of_the_previous_answer(
        alice: Any, entries: tuple[Any, Any], daphne: Daphne, browser_page: Any) -> None:
    tool, _ = entries
    page = browser_page
    sign_in(page, alice, daphne.url)
    problems = watch_for_problems(page, daphne.url)
    page.goto(f"{daphne.url}/registry/{tool.pk}/")
    page.fill("#id_arguments", '{"expression": ')
    page.click("text=Call the tool")
    page.wait_for_selector("#try-result .error", timeout=10_000)
    first = page.inner_text("#try-result")
    assert "JSON" in first, first
    page.fill("#id_arguments", "[1, 2]")
    page.click("text=Call the tool")
    page.wait_for_function("(old) => document.getElementById('try-result').innerText !== old", arg=first, timeout=10_000)
    assert page.inner_text("#try-result") != first
    assert [p for p in problems if "400" not in p] == []  # the 400 is the answer, shown to the user


def test_the_token_pages_example_names_real_entries_and_one_nav_item_is_lit(
        alice: Any, entries: tuple[Any, Any], daphne: Daphne, browser_page: Any) -> None:
    tool, reward = entries
    page = browser_page
    sign_in(page, alice, daphne.url)
    page.goto(f"{daphne.url}/accounts/token/")
    example = page.inner_text("pre.code >> nth=1")
    assert f'"tools": [{tool.pk}], "reward": {reward.pk}' in example and "ID" not in example
    assert page.eval_on_selector_all(".topbar nav a.active", "(links) => links.map((a) => a.textContent)") == ["Token"]
