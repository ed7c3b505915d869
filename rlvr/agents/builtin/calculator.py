"""``calculator_agent``: the ``calculator`` environment's task written as an agent program.

Plain `openai` client code (the `agent` declaration aside): it offers one tool, ``calculate``, runs
the calls the model makes and sends their results back, until the model answers without a call or
has made ``MAX_TURNS`` calls; then the job's reward (Math Pairs) scores the last answer. It asks for
the same prompt, tool and turns as the ``calculator`` environment, so its episodes render token for
token as that environment's do (tests/test_agents.py checks it), and it learns as they do
(docs/measurements/learning.md).

The same function runs against any OpenAI-compatible server, outside rlvr::

    python -m rlvr.agents.builtin.calculator --base-url http://localhost:8000/v1 --model NAME "What is 17 * 23?"
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from typing import Any

import openai

from rlvr.agents import AgentRow, agent
from rlvr.environments.builtin.calculator import evaluate
from rlvr.tasks.base import NUMBER_INSTRUCTION

MAX_TURNS = 4
INSTRUCTION = "You may call the calculate tool to do arithmetic. " + NUMBER_INSTRUCTION
TOOLS: list[Any] = [{
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluates an arithmetic expression exactly and returns its value.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {
                "type": "string",
                "description": 'numbers with + - * / and parentheses, e.g. "(3 + 4) * (5 + 6)"'}},
            "required": ["expression"],
        },
        "return": {"type": "string"},
    },
}]


def calculate(name: str, arguments: str) -> str:
    """One tool call's result as the model reads it (an error as text, never an exception)."""
    if name != "calculate":
        return f"error: no tool named {name!r}; the tools: calculate"
    try:
        args = json.loads(arguments or "{}")
        return evaluate(str(args["expression"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: calculate failed: {type(exc).__name__}: {exc}"


@agent("calculator_agent", display_name="Calculator (agent program)", version="1", instruction=INSTRUCTION,
       default_benchmark="rlvr-math-pairs-heldout", max_turns=MAX_TURNS, timeout_seconds=120)
async def calculator_agent(client: openai.AsyncOpenAI, row: AgentRow, model: str = "policy",
                           show: Callable[[str], None] | None = None) -> None:
    """The calculator task as plain OpenAI client code: a calculate tool, scored by the job's reward."""
    messages: list[Any] = list(row.messages)
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        choice = reply.choices[0]
        messages.append(choice.message.model_dump(exclude_none=True))
        if show:
            show(f"assistant: {choice.message.content!r} tool calls: {choice.message.tool_calls}")
        if not choice.message.tool_calls or choice.finish_reason == "length":
            break
        for call in choice.message.tool_calls:
            fn = getattr(call, "function", None)  # a function call (the only kind the endpoint makes)
            result = calculate(fn.name, fn.arguments) if fn else "error: not a function call"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if show:
                show(f"tool call {call.id}: {result}")
    return None  # the job's reward scores the last answer


def main() -> None:
    parser = argparse.ArgumentParser(description="Runs the calculator agent once against an OpenAI-compatible server.")
    parser.add_argument("--base-url", required=True, help="e.g. http://localhost:8000/v1 (vLLM's `vllm serve`)")
    parser.add_argument("--model", required=True, help="the model name the server serves")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("question")
    args = parser.parse_args()
    row = AgentRow(prompt=args.question, messages=[{"role": "user", "content": f"{args.question}\n\n{INSTRUCTION}"}])
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key)
    asyncio.run(calculator_agent(client, row, model=args.model, show=print))


if __name__ == "__main__":
    main()
