"""The gateway over real HTTP, driven by the official ``openai`` SDK: OpenAI's schema, token-exact trajectories,
rollouts and rewards, and the limits that keep many clients safe."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest

from agentfly.engines import HFEngine, Sampling
from agentfly.gateway import GatewayLimits
from agentfly.rollout.render import ChatRenderer

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
SAMPLE = {"id": "q1", "question": "What is 2 + 3?", "answer": "5"}


def take(server: Any, n: int = 1) -> list[dict[str, Any]]:
    response = httpx.get(f"{server.url}/samples?n={n}", headers={"Authorization": f"Bearer {server.gateway.job_key}"})
    response.raise_for_status()
    return list(response.json()["data"])


def agent_loop(client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool = False) -> list[dict[str, Any]]:
    """A plain tool loop as teams write it with the SDK (no AgentFly import)."""
    for _ in range(4):
        if stream:
            content, calls = "", {}
            for chunk in client.chat.completions.create(model="policy", messages=messages, tools=[ADD], stream=True):
                delta = chunk.choices[0].delta
                content += delta.content or ""
                for call in delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""
            message: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = list(calls.values())
        else:
            reply = client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        if not message.get("tool_calls"):
            return messages
        for call in message["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])})
    return messages


def assert_token_exact(traj: Any, calls: list[Any]) -> None:
    """The trajectory is the engine's own samples and what it was prompted with, nothing re-derived: every
    prompt the engine saw is the sequence so far, every turn is exactly what it sampled, with its logprobs,
    and the mask is 1 there and 0 everywhere else."""
    assert len(traj.turns) == len(calls)
    sampled = set()
    for turn, (prompt, generation) in zip(traj.turns, calls, strict=True):
        assert traj.token_ids[: turn.start] == prompt
        assert traj.token_ids[turn.start: turn.end] == generation.token_ids
        assert traj.logprobs[turn.start: turn.end] == generation.logprobs
        sampled |= set(range(turn.start, turn.end))
    assert traj.loss_mask == [1 if i in sampled else 0 for i in range(len(traj.token_ids))]
    assert all(lp == 0.0 for i, lp in enumerate(traj.logprobs) if i not in sampled)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
def test_an_sdk_tool_loop_is_recorded_token_exact_with_tool_calls_in_openai_format(serve, turns_engine, stream):
    engine = turns_engine([CALL, "The answer is 5."])
    server = serve(engine)
    ids = server.gateway.hand_out([SAMPLE], 1, Sampling(max_new_tokens=160))
    [handout] = take(server)
    client = openai.OpenAI(base_url=server.url, api_key=handout["api_key"])
    messages = agent_loop(client, list(handout["messages"]), stream=stream)

    assert messages[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert messages[2]["content"] == "5" and messages[-1]["content"] == "The answer is 5."
    httpx.post(f"{server.url}/rollouts/{handout['rollout_id']}/reward", json={"reward": 1.0},
               headers={"Authorization": f"Bearer {handout['api_key']}"}).raise_for_status()
    [traj] = server.gateway.wait(ids)
    assert_token_exact(traj, engine.calls)
    tokenizer = engine.tokenizer
    # The first prompt is the template's render of the client's first messages; the sampled turns are the
    # engine's char-level ids, which a re-encoding of their text would not give back.
    assert traj.token_ids[: traj.prompt_length] == ChatRenderer(tokenizer, [ADD]).prompt_ids(handout["messages"])
    first = engine.calls[0][1].token_ids
    assert tokenizer(tokenizer.decode(first[:-1]), add_special_tokens=False)["input_ids"] != first[:-1]
    assert traj.reward == 1.0 and traj.final_answer == "The answer is 5." and traj.failure is None
    assert [(c.name, c.arguments, c.observation) for c in traj.tool_calls] == [("add", {"a": 2, "b": 3}, "5")]
    assert traj.turns[0].tool_calls == ["add"]


def test_a_client_that_changes_earlier_messages_starts_a_counted_segment_and_is_never_trained_on_edited_text(
        serve, turns_engine):
    engine = turns_engine(["First answer.", "Second answer."])
    server = serve(engine)
    ids = server.gateway.hand_out([SAMPLE], 1, Sampling(max_new_tokens=160))
    [handout] = take(server)
    client = openai.OpenAI(base_url=server.url, api_key=handout["api_key"])
    messages = list(handout["messages"])
    reply = client.chat.completions.create(model="policy", messages=messages)
    # The client rewrites the model's answer before continuing (a summarised or edited history).
    edited = [*messages, {"role": "assistant", "content": "Something the model never said."},
              {"role": "user", "content": "Go on."}]
    client.chat.completions.create(model="policy", messages=edited)
    assert reply.choices[0].message.content == "First answer."
    httpx.post(f"{server.url}/rollouts/{handout['rollout_id']}/reward", json={"reward": 0.5},
               headers={"Authorization": f"Bearer {handout['api_key']}"}).raise_for_status()
    [traj] = server.gateway.wait(ids)
    assert traj.reward_metrics["gateway/mismatches"] == 1.0 and server.gateway.counters["mismatches"] == 1
    # What is trained is the last segment: the edited text is prompt (mask 0), only the new turn is sampled.
    assert_token_exact(traj, engine.calls[1:])
    text = engine.tokenizer.decode(traj.token_ids[: traj.turns[0].start])
    assert "Something the model never said." in text and traj.num_turns == 1


def test_with_on_mismatch_reject_a_changed_history_is_answered_409_and_the_rollout_keeps_its_conversation(
        serve, turns_engine):
    engine = turns_engine(["First answer.", "Second answer."])
    server = serve(engine, limits=GatewayLimits(on_mismatch="reject"))
    server.gateway.hand_out([SAMPLE], 1, Sampling(max_new_tokens=160))
    [handout] = take(server)
    client = openai.OpenAI(base_url=server.url, api_key=handout["api_key"], max_retries=0)
    messages = list(handout["messages"])
    reply = client.chat.completions.create(model="policy", messages=messages)
    with pytest.raises(openai.ConflictError, match="message 1 \\(assistant\\) differs"):
        client.chat.completions.create(model="policy", messages=[
            *messages, {"role": "assistant", "content": "edited"}, {"role": "user", "content": "Go on."}])
    kept = [*messages, reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    assert client.chat.completions.create(model="policy", messages=kept).choices[0].message.content == "Second answer."


def test_a_rollout_whose_client_disappears_ends_as_client_lost_and_stays_out_of_training(serve, turns_engine):
    from trainer.collect import infra_kept

    server = serve(turns_engine(["Thinking..."]), limits=GatewayLimits(idle_timeout=2.0))
    ids = server.gateway.hand_out([SAMPLE], 2, Sampling(max_new_tokens=64))
    [stays] = take(server)
    httpx.post(f"{server.url}/rollouts/{stays['rollout_id']}/reward", json={"reward": 1.0},
               headers={"Authorization": f"Bearer {server.gateway.job_key}"}).raise_for_status()
    [gone] = take(server)  # one turn, then its agent is gone
    openai.OpenAI(base_url=server.url, api_key=gone["api_key"]).chat.completions.create(
        model="policy", messages=gone["messages"])
    rewarded, lost = server.gateway.wait(ids, poll=0.1)  # returns: the reaper ended the silent one
    assert server.gateway.counters["client_lost"] == 1
    assert lost.failure == "client_lost" and "idle_timeout" in (lost.failure_reason or "")
    assert rewarded.failure is None and rewarded.reward == 1.0
    assert lost.num_turns == 1 and infra_kept([lost, rewarded], [0, 0], "exclude") == [False, True]
    # Its key is revoked with it.
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url, api_key=gone["api_key"], max_retries=0).chat.completions.create(
            model="policy", messages=gone["messages"])


def test_rollouts_left_in_the_queue_end_as_no_client_once_no_agent_takes_any_while_a_slow_agent_is_never_cut_off(
        serve, turns_engine):
    server = serve(turns_engine([]), limits=GatewayLimits(take_timeout=1.5))
    ids = server.gateway.hand_out([SAMPLE], 4, Sampling(max_new_tokens=8))
    job = {"Authorization": f"Bearer {server.gateway.job_key}"}
    for _ in range(3):  # a slow agent: one rollout a second, so the last it takes has queued for 3 s
        time.sleep(1.0)
        [handout] = take(server)
        httpx.post(f"{server.url}/rollouts/{handout['rollout_id']}/reward", json={"reward": 1.0},
                   headers=job).raise_for_status()
    # ... then it stops: the rollout still queued ends once 1.5 s pass with nothing taken.
    *served, untaken = server.gateway.wait(ids, poll=0.1)
    assert [t.reward for t in served] == [1.0, 1.0, 1.0] and all(t.failure is None for t in served)
    assert untaken.failure == "no_client" and "take_timeout" in (untaken.failure_reason or "")
    assert untaken.infra_failed and untaken.num_turns == 0
    assert server.gateway.counters["no_client"] == 1
    assert server.gateway.stats()["queued"] == 0


def test_a_saturated_engine_answers_429_with_retry_after_and_serves_the_rest(serve, tiny_model_dir):
    server = serve(HFEngine(tiny_model_dir), limits=GatewayLimits(max_inflight=1))
    server.gateway.hand_out([SAMPLE], 6, Sampling(max_new_tokens=200, seed=0))
    handouts = take(server, 6)

    async def one(handout: dict[str, Any]) -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as http:
            return await http.post(f"{server.url}/chat/completions", headers={
                "Authorization": f"Bearer {handout['api_key']}"}, json={
                "model": "policy", "messages": handout["messages"], "max_tokens": 200})

    async def all_at_once() -> list[httpx.Response]:
        return list(await asyncio.gather(*(one(h) for h in handouts)))

    responses = asyncio.run(all_at_once())
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 429 in codes, codes
    busy = next(r for r in responses if r.status_code == 429)
    assert busy.headers["retry-after"] == "1" and busy.json()["error"]["code"] == "engine_saturated"


def test_keys_are_scoped_to_their_rollout_and_job_and_revoked_when_the_job_ends(serve, turns_engine):
    server = serve(turns_engine([]))
    other = serve(turns_engine([]))
    server.gateway.hand_out([SAMPLE], 2, Sampling(max_new_tokens=16))
    a, b = take(server, 2)
    auth = {"Authorization": f"Bearer {a['api_key']}"}
    denied = httpx.post(f"{server.url}/rollouts/{b['rollout_id']}/reward", json={"reward": 1.0}, headers=auth)
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "permission_denied"
    # A rollout key cannot take samples, another job's key means nothing here, and no key is refused.
    assert httpx.get(f"{server.url}/samples", headers=auth).status_code == 401
    foreign = {"Authorization": f"Bearer {other.gateway.job_key}"}
    assert httpx.get(f"{server.url}/samples", headers=foreign).status_code == 401
    assert httpx.get(f"{server.url}/models").status_code == 401
    job = server.gateway.job_key
    server.gateway.close()  # the job ended: the endpoint may still answer, but no key of the job opens it
    for key in (job, a["api_key"]):
        response = httpx.post(f"{server.url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                              json={"model": "policy", "messages": a["messages"]})
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/samples", headers={"Authorization": f"Bearer {job}"}).status_code == 401


def test_a_key_past_its_request_limit_gets_429_quota_exceeded(serve, turns_engine):
    server = serve(turns_engine(["One.", "Two."]), limits=GatewayLimits(max_requests=1))
    server.gateway.hand_out([SAMPLE], 1, Sampling(max_new_tokens=16))
    [handout] = take(server)
    client = openai.OpenAI(base_url=server.url, api_key=handout["api_key"], max_retries=0)
    reply = client.chat.completions.create(model="policy", messages=handout["messages"])
    with pytest.raises(openai.RateLimitError, match="its 1 requests"):
        client.chat.completions.create(model="policy", messages=[
            *handout["messages"], reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "more"}])


def test_completions_extend_the_rollout_token_exactly_and_models_lists_the_policy(serve, turns_engine):
    engine = turns_engine([" four", " five"])
    server = serve(engine)
    ids = server.gateway.hand_out([SAMPLE], 1, Sampling(max_new_tokens=16))
    [handout] = take(server)
    client = openai.OpenAI(base_url=server.url, api_key=handout["api_key"])
    assert [m.id for m in client.models.list().data] == ["policy"]
    first = client.completions.create(model="policy", prompt="Count: one two three")
    assert first.choices[0].text.startswith(" four")
    client.completions.create(model="policy", prompt="Count: one two three" + first.choices[0].text + " and")
    httpx.post(f"{server.url}/rollouts/{handout['rollout_id']}/finish",
               headers={"Authorization": f"Bearer {handout['api_key']}"}).raise_for_status()
    [traj] = server.gateway.wait(ids)
    assert_token_exact(traj, engine.calls)


def test_turn_rewards_come_by_api_and_the_jobs_reward_function_scores_a_finished_rollout(serve, turns_engine):
    from agentfly.rewards.builtin.math import math_equal

    server = serve(turns_engine(["The answer is 5."]), reward=math_equal)
    ids = server.gateway.hand_out([SAMPLE], 1, Sampling(max_new_tokens=32))
    [handout] = take(server)
    client = openai.OpenAI(base_url=server.url, api_key=handout["api_key"])
    client.chat.completions.create(model="policy", messages=handout["messages"])
    auth = {"Authorization": f"Bearer {handout['api_key']}"}
    httpx.post(f"{server.url}/rollouts/{handout['rollout_id']}/reward", json={"reward": 0.25, "turn": 0,
                                                                            "reason": "polite"},
               headers=auth).raise_for_status()
    bad = httpx.post(f"{server.url}/rollouts/{handout['rollout_id']}/reward", json={"reward": "high"}, headers=auth)
    assert bad.status_code == 400 and "finite number" in bad.json()["error"]["message"]
    done = httpx.post(f"{server.url}/rollouts/{handout['rollout_id']}/finish", headers=auth)
    assert done.json()["reward"] == 1.0
    [traj] = server.gateway.wait(ids)
    assert traj.reward == 1.0 and traj.rewards_per_turn() == [0.25]


def test_logprobs_asked_for_are_the_engines_own_sampling_logprobs(serve, turns_engine):
    engine = turns_engine(["Five."])
    server = serve(engine)
    server.gateway.hand_out([SAMPLE], 1, Sampling(max_new_tokens=16))
    [handout] = take(server)
    client = openai.OpenAI(base_url=server.url, api_key=handout["api_key"])
    reply = client.chat.completions.create(model="policy", messages=handout["messages"], logprobs=True)
    [(_, generation)] = engine.calls
    assert [t.logprob for t in reply.choices[0].logprobs.content] == generation.logprobs
    assert reply.usage.completion_tokens == len(generation.token_ids)


def test_with_the_jobs_key_an_x_rollout_id_header_names_the_rollout_a_request_drives(serve, turns_engine):
    engine = turns_engine(["Five."])
    server = serve(engine)
    ids = server.gateway.hand_out([SAMPLE], 2, Sampling(max_new_tokens=16))
    client = openai.OpenAI(base_url=server.url, api_key=server.gateway.job_key,
                           default_headers={"X-Rollout-Id": ids[1]})
    reply = client.chat.completions.with_raw_response.create(
        model="policy", messages=[{"role": "user", "content": SAMPLE["question"]}])
    assert reply.headers["x-rollout-id"] == ids[1]
    server.gateway.set_reward(ids[0], 0.0)
    server.gateway.set_reward(ids[1], 1.0)
    untouched, driven = server.gateway.wait(ids)
    assert driven.num_turns == 1 and untouched.num_turns == 0
