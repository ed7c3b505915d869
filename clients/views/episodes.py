"""An episode turn by turn, for the console and the CLI: from its transcript (a step sample's
`completion` of a job with an environment, an evaluation row's `completion`) or from the episode
JSON an evaluation row keeps (`QuestionResult.episode`), as one list of entries both show alike.

The transcript is rlvr/episodes/scoring.py's `transcript`: one line per event, each starting with
its marker, `[turn N] ` (the assistant's turn), `[tool NAME] ` (a tool call's result, or
`error: ...`), `[environment] ` (the environment's reply) or `[failed] ` (why the episode failed);
a line without a marker continues the entry above it (a turn's text over several lines). The JSON
says more: each tool call's arguments, a turn's tokens, finish reason and reward, how the episode
ended.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

KINDS = ("assistant", "tool", "environment", "failed", "text")

_MARKER = re.compile(r"\[(?:turn (?P<turn>\d+)|tool (?P<tool>[^\]\n]*)|(?P<env>environment)|(?P<failed>failed))\] ?")


@dataclass(frozen=True)
class Entry:
    kind: str  # one of KINDS ("text": words before the first marker, or a completion that is no transcript)
    label: str  # "Turn 2", "Tool calculate", "Environment", "Failed"
    text: str
    error: bool = False  # a tool call that failed, or the episode's failure
    detail: str = ""  # what the JSON adds: a tool call's arguments, a turn's tokens and finish reason


def is_transcript(text: str) -> bool:
    """Whether `text` reads as an episode transcript (it starts with its first turn's marker)."""
    return text.startswith("[turn ")


def from_transcript(text: str) -> list[Entry]:
    """The transcript's entries in order (`[]` for an empty one)."""
    entries: list[dict[str, Any]] = []
    for line in text.split("\n"):
        m = _MARKER.match(line)
        if m is None:
            if entries:
                entries[-1]["text"] += "\n" + line
            else:
                entries.append({"kind": "text", "label": "", "text": line})
            continue
        rest = line[m.end():]
        if m["turn"] is not None:
            entries.append({"kind": "assistant", "label": f"Turn {int(m['turn'])}", "text": rest})
        elif m["tool"] is not None:
            entries.append({"kind": "tool", "label": f"Tool {m['tool']}", "text": rest,
                            "error": rest.startswith("error: ")})
        elif m["env"] is not None:
            entries.append({"kind": "environment", "label": "Environment", "text": rest})
        else:
            entries.append({"kind": "failed", "label": "Failed", "text": rest, "error": True})
    return [Entry(**e) for e in entries if e["kind"] != "text" or e["text"].strip()]


def from_episode(episode: str | dict[str, Any]) -> list[Entry]:
    """The entries of an episode's JSON (rlvr/episodes/scoring.py's `episode_record`); `[]` when it
    is empty or not an episode (the caller then shows the transcript)."""
    if isinstance(episode, str):
        try:
            episode = json.loads(episode) if episode.strip() else {}
        except ValueError:
            return []
    if not isinstance(episode, dict) or not isinstance(episode.get("turns"), list):
        return []
    entries = []
    for number, turn in enumerate(episode["turns"], 1):
        if not isinstance(turn, dict):
            continue
        facts = []
        if turn.get("sampled_tokens"):
            facts.append(f"{turn['sampled_tokens']} tokens")
        if turn.get("finish_reason") and turn["finish_reason"] != "stop":
            facts.append(f"cut ({turn['finish_reason']})")
        if turn.get("reward") is not None:
            facts.append(f"reward {turn['reward']:g}" if isinstance(turn["reward"], int | float)
                         else f"reward {turn['reward']}")
        entries.append(Entry("assistant", f"Turn {number}", str(turn.get("assistant") or ""), detail=" · ".join(facts)))
        for call in turn.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            error = str(call.get("error") or "")
            arguments = call.get("arguments")
            detail = json.dumps(arguments, ensure_ascii=False, sort_keys=True) if arguments else ""
            entries.append(Entry("tool", f"Tool {call.get('name') or '?'}",
                                 f"error: {error}" if error else str(call.get("result") or ""),
                                 error=bool(error), detail=detail))
        if turn.get("reply") is not None:
            entries.append(Entry("environment", "Environment", str(turn["reply"])))
    if episode.get("error"):
        entries.append(Entry("failed", "Failed", str(episode["error"]), error=True))
    return entries


def ending(episode: str | dict[str, Any]) -> str:
    """How the episode ended, in a few words ("3 turns, ended by answer, 2 tool calls (1 error)"),
    from its JSON; "" when there is none."""
    if isinstance(episode, str):
        try:
            episode = json.loads(episode) if episode.strip() else {}
        except ValueError:
            return ""
    if not isinstance(episode, dict) or not isinstance(episode.get("turns"), list):
        return ""
    turns = len(episode["turns"])
    words = [f"{turns} turn{'' if turns == 1 else 's'}"]
    if episode.get("ended_by"):
        words.append(f"ended by {episode['ended_by']}")
    calls, errors = int(episode.get("tool_calls") or 0), int(episode.get("tool_errors") or 0)
    if calls:
        words.append(f"{calls} tool call{'' if calls == 1 else 's'}" + (f" ({errors} failed)" if errors else ""))
    if episode.get("truncated"):
        words.append("truncated")
    return ", ".join(words)


def text_lines(entries: list[Entry]) -> list[str]:
    """The entries as plain text, one block per entry (the CLI's view): `Turn 1: ...`, with the
    continuation lines indented."""
    lines = []
    for e in entries:
        head = f"{e.label}: " if e.label else ""
        body = e.text.replace("\n", "\n    ")
        lines.append(f"{head}{body}" + (f"  ({e.detail})" if e.detail else ""))
    return lines
