"""The launch form in a real browser: after a refused launch the presets bar is still on offer beside the
errors, and the fields show and hide by the rules the page carries from the schema (max staleness for async
rollouts, the RL settings unless the job is a warm start alone). Debian's Chromium via Playwright, Daphne."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp.helpers import Daphne, sign_in_with_the_form

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_after_a_refused_launch_the_presets_bar_still_offers_every_example_and_one_fills_the_form(
        alice_for_the_server: Any, daphne: Daphne, browser_page: Any) -> None:
    from playwright.sync_api import expect

    from webapp.jobs.forms import PRESETS

    page = browser_page
    page.set_default_timeout(30_000)
    sign_in_with_the_form(page, daphne.url, next_path="/jobs/launch/")
    page.fill("#id_name", "refused")
    page.fill("#id_steps", "0")
    page.click("#launch-button")
    expect(page.locator("#form-summary")).to_be_visible()
    expect(page.locator('.error[data-field="steps"]')).to_contain_text("steps=0 must be between 1 and 100000")
    presets = page.locator("#presets a[data-preset]")
    expect(presets).to_have_count(len(PRESETS))
    page.click('#presets a[data-preset="key_chain"]')
    expect(page.locator("#id_name")).to_have_value("key-chain-grpo")
    expect(page.locator("#id_task")).to_have_value("key_chain")
    assert not page.errors, page.errors


def test_the_fields_follow_the_rules_the_page_carries_from_the_schema(
        alice_for_the_server: Any, daphne: Daphne, browser_page: Any) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.set_default_timeout(30_000)
    sign_in_with_the_form(page, daphne.url, next_path="/jobs/launch/")
    staleness, credit = page.locator('.field[data-field="max_staleness"]'), page.locator('.field[data-field="credit"]')
    warm_start = page.locator("#warm-start-fields")
    expect(staleness).to_be_hidden()
    expect(credit).to_be_visible()
    expect(warm_start).to_be_hidden()
    page.select_option("#id_rollout_mode", "async")
    expect(staleness).to_be_visible()
    page.select_option("#id_kind", "sft")
    expect(staleness).to_be_hidden()
    expect(credit).to_be_hidden()
    expect(warm_start).to_be_visible()
    expect(page.locator('.field[data-field="max_new_tokens"]')).to_be_visible()  # the evaluation generates with it
    page.select_option("#id_kind", "sft_then_rl")
    expect(staleness).to_be_visible()
    expect(warm_start).to_be_visible()
    assert not page.errors, page.errors
