"""The team's calculator agent: a plain loop over the `openai` SDK's tool calling, with its own calculator tool.
Nothing here imports AgentFly: the job's gateway serves the policy and records every conversation.

    python examples/gateway_calculator/agent.py runs/gateway_calculator/gateway.json [WORKERS]

It takes rollouts from the job (GET /v1/samples with the job's key), runs each with the rollout's own key,
and ends it (POST /v1/rollouts/<id>/finish: the job's reward function scores the answer), until the job ends
and its key stops working.
"""

from __future__ import annotations

import ast
import json
import operator
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {
        "type": "string", "description": "Arithmetic with + - * / ( ) and integers, e.g. \"37*48\"."}},
        "required": ["expression"]}}}
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """The team's tool: + - * / on numbers, nothing else."""
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression: {expression!r}")
    try:
        value = walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def solve(client: OpenAI, messages: list[dict[str, Any]], max_turns: int = 3) -> str:
    """One rollout: ask, run the calculator calls, answer."""
    for _ in range(max_turns):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except json.JSONDecodeError:
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))})
    return ""


def worker(url: str, job_key: str) -> None:
    jobs = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {job_key}"}, timeout=600)
    while True:
        try:
            taken = jobs.get("/samples", params={"n": 1})
        except httpx.ConnectError:  # the job ended and its gateway with it
            return
        if taken.status_code == 401:  # the job ended: its keys are revoked
            return
        if taken.status_code == 429:  # between batches (the job is updating) or the engine is busy
            time.sleep(float(taken.headers.get("retry-after", "1")) / 4)
            continue
        taken.raise_for_status()
        for rollout in taken.json()["data"]:
            client = OpenAI(base_url=url, api_key=rollout["api_key"], max_retries=5)
            try:
                solve(client, list(rollout["messages"]))
            except Exception as exc:  # a turn refused (context full, limit reached): the rollout ends as it is
                print(f"rollout {rollout['rollout_id']}: {type(exc).__name__}: {exc}", file=sys.stderr)
            httpx.post(f"{url}/rollouts/{rollout['rollout_id']}/finish",
                       headers={"Authorization": f"Bearer {rollout['api_key']}"}, timeout=600)


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/gateway_calculator/gateway.json")
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    for _ in range(600):  # the job writes it once its gateway listens
        if path.exists():
            break
        time.sleep(0.5)
    endpoint = json.loads(path.read_text())
    threads = [threading.Thread(target=worker, args=(endpoint["url"], endpoint["job_key"])) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
