"""The key-chain example launched from the launch form, watched on the dashboard as it learns: a real browser
(Debian's Chromium via Playwright), Daphne, the session's real Celery worker training the shipped warm start
with GRPO, and the ``kv`` store resource answering every lookup. Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp.helpers import ROOT, Daphne, off_loop, sign_in_with_the_form, wait_for_js

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = ROOT / "test-artifacts"
WARM_START = ROOT / "examples" / "key_chain" / "warm_start"

# One chart line's raw points, as Plotly holds them on the page.
RAW_LINE = """([id, name]) => {
    const t = (document.getElementById(id).data || []).find((t) => t.meta === 'raw' && (!name || t.name === name));
    return t ? Array.from(t.y) : [];
}"""
# The viewer's tool-call table of the selected trajectory: [tool, observation] per call.
CALLS = """() => [...document.querySelectorAll('#rollout-view table.tool-calls tbody tr')]
    .map((tr) => [tr.children[1].innerText, tr.children[3].innerText.trim()])"""


@pytest.mark.timeout(900)
def test_the_key_chain_job_launched_from_the_form_shows_success_rising_more_calls_and_the_stores_chain(
        alice_for_the_server: Any, builtins: dict[str, Any], daphne: Daphne, browser_page: Any) -> None:
    from playwright.sync_api import expect

    from webapp.jobs.models import TrainingJob

    assert {"lookup", "chain_answer"} <= set(builtins), "the worker registers the key-chain tool and reward"
    page, web = browser_page, daphne.url
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_default_timeout(30_000)
    sign_in_with_the_form(page, web, next_path="/jobs/launch/")
    expect(page.locator("h1")).to_have_text("Launch a training job")

    # The recipe of examples/key_chain/grpo.yaml, smaller: 8 prompts (the same 8 every step, as the example's
    # fixed-seed test) x 4 rollouts at temperature 0.7 and lr 1e-4, from the shipped warm start.
    page.fill("#id_name", "key chain from the browser")
    page.select_option("#id_model_source", "path")
    page.fill("#id_model_path", str(WARM_START))
    page.select_option("#id_task", "key_chain")
    page.fill("#id_task_size", "8")
    page.get_by_label("calculator (built-in)").uncheck()
    page.get_by_label("lookup (built-in)").check()
    page.select_option("#id_reward", label="chain_answer (built-in)")
    for field, value in {"steps": "60", "prompts_per_step": "8", "group_size": "4", "max_turns": "6",
                         "max_new_tokens": "32", "learning_rate": "0.0001", "temperature": "0.7",
                         "eval_size": "4", "save_every": "0"}.items():
        page.fill(f"#id_{field}", value)
    page.click("#launch-button")
    expect(page.locator("#job-status")).to_have_attribute("data-status", "running", timeout=120_000)
    job = off_loop(lambda: TrainingJob.objects.order_by("-pk").first())
    assert job.config["data"]["task"] == "key_chain" and job.config["rollout"]["tools"] == [
        "agentfly.tools.builtin.lookup:lookup"], job.config

    page.click("#dashboard-link")
    wait_for_js(page, "() => document.getElementById('connection').dataset.state === 'live'", timeout=30_000)
    # Success climbs above its first points, and the agent learns to keep looking up: more calls a trajectory.
    wait_for_js(page, curves_rose_js(0.15, 0.3), timeout=600_000)
    success = page.evaluate(RAW_LINE, ["chart-accuracy", ""])
    calls = page.evaluate(RAW_LINE, ["chart-tool_calls", "tool calls mean"])
    turns = page.evaluate(RAW_LINE, ["chart-tool_calls", "turns mean"])
    assert turns and len(turns) == len(calls), "the turns line is drawn with the calls"
    axis = page.evaluate("() => document.getElementById('chart-tool_calls').layout.yaxis.title.text")
    assert "turns" in axis and "calls" in axis, axis
    # The rollouts' stores come from the worker's kv pool: made once, leased by every rollout's first lookup.
    wait_for_js(page, "() => document.querySelectorAll('#pool-stats tbody tr').length > 0", timeout=60_000)
    pool = [c.strip() for c in page.locator("#pool-stats tbody tr").first.locator("td").all_inner_texts()]
    assert pool[0] == "kv" and int(pool[5]) >= 1, pool  # name, ..., created
    page.screenshot(path=str(ARTIFACTS / "key-chain-dashboard.png"), full_page=True)

    # The viewer, best trajectory first: at least 3 lookups, each answered from the rollout's store, the walk
    # carried from turn to turn (next: k.. until final: ...).
    page.select_option("#sample-order", "best")
    walked = f"() => {{ const c = ({CALLS})(); return c.length >= 3 && c[c.length - 1][1].startsWith('final: '); }}"
    wait_for_js(page, walked, timeout=120_000)
    page.uncheck("#sample-follow")  # hold this step while it is read
    wait_for_js(page, walked, timeout=10_000)
    chain = page.evaluate(CALLS)
    assert len(chain) >= 3 and all(tool == "lookup" for tool, _ in chain), chain
    assert all(obs.startswith("next: k") for _, obs in chain[:-1]), chain
    assert chain[-1][1].startswith("final: "), chain
    assert chain[-1][1].removeprefix("final: ") in page.inner_text("#rollout-view .final-answer"), chain
    page.locator("#rollout-view").screenshot(path=str(ARTIFACTS / "key-chain-rollout.png"))

    page.once("dialog", lambda dialog: dialog.accept())  # the dashboard asks before it cancels
    page.click("#cancel-button")
    wait_for_js(page, "() => document.getElementById('job-status').dataset.status === 'cancelled'", timeout=180_000)
    assert not page.errors, page.errors
    print(f"success {success}\ncalls {calls}\nturns {turns}\nchain {chain}")


def curves_rose_js(success_by: float, calls_by: float) -> str:
    """Both curves have risen: held in the page, so the wait polls one function."""
    return f"""() => {{
        const raw = (id, name) => {{
            const t = (document.getElementById(id).data || []).find((t) => t.meta === 'raw' && (!name || t.name === name));
            return t ? Array.from(t.y) : [];
        }};
        const rose = (y, by) => {{
            if (y.length < 6) return false;
            const m = (a) => a.reduce((s, v) => s + v, 0) / a.length;
            return m(y.slice(-3)) >= m(y.slice(0, 3)) + by;
        }};
        return rose(raw('chart-accuracy', ''), {success_by}) && rose(raw('chart-tool_calls', 'tool calls mean'), {calls_by});
    }}"""
