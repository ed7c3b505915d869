"""Trained heads as rewards: a Head job's adapter under the service's head roots scores completions by
the key `head_<job id>` (docs/head.md).

A completion's score is the head's output on `rlvr.heads.sample_text(prompt, completion)`: the
probability of the head's reward class (classification), or its number clipped to 0-1
(regression). The keys are found by looking, each time the catalog is asked for (a cheap read of
each adapter's safetensors header): a Head job that completes is a reward from then on, with no
restart. A head is loaded on first use (its base model and adapter, on this service's CPU) and kept
while its folder is there (loaded again when its weights change); scoring runs in a thread, one batch
at a time per head.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlvr.heads import HeadInfo, HeadScorer, head_key, read_head, sample_text
from rlvr.rewards.combine import TermError, TermResult, error_text
from rlvr.rewards.registry import KEY_RE, RewardInfo, RewardOutput, Sample

log = logging.getLogger("rlvr.reward.heads")

@dataclass(frozen=True)
class FoundHead:
    folder: Path
    info: HeadInfo
    stamp: float  # the weights' mtime: a head rewritten since it was loaded is loaded again


class Heads:
    """The heads under `roots` (each an artifact root: <root>/jobs/<id>/adapter) and their scorers.
    Scans run one at a time (`scan` is what the catalog is made of: a listed key is a found head);
    a scorer is loaded once per head, one batch at a time, and dropped when its head is gone."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = [Path(r) for r in roots]
        self._found: dict[str, FoundHead] = {}
        self._scorers: dict[str, tuple[float, HeadScorer]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()  # _found, _scorers and _locks
        self._scanning = threading.Lock()  # one scan at a time: the newest result is the last written

    def scan(self) -> dict[str, RewardInfo]:
        """The heads there now, as reward declarations by key. A folder that does not read as a head
        (being written, a cut file, another job's adapter) is left out, never an error."""
        with self._scanning:
            found: dict[str, FoundHead] = {}
            for root in self.roots:
                for weights in sorted(root.glob("jobs/*/adapter/adapter_model.safetensors")):
                    folder = weights.parent
                    key = head_key(folder.parent.name)
                    if not KEY_RE.match(key) or key in found:
                        continue
                    try:
                        info = read_head(folder)
                        stamp = weights.stat().st_mtime
                    except Exception as e:  # noqa: BLE001  # one bad folder never hides the others
                        log.debug("%s: not read as a head: %s", folder, e)
                        continue
                    if info is not None:
                        found[key] = FoundHead(folder, info, stamp)
            with self._lock:
                self._found = found
                for gone in set(self._scorers) - set(found):  # a deleted job's head: its memory back
                    del self._scorers[gone]
            return {key: self.info(key, head) for key, head in found.items()}

    @staticmethod
    def info(key: str, head: FoundHead) -> RewardInfo:
        job = head.folder.parent.name
        what = (f"the probability of class {head.info.reward_label!r}" if head.info.task == "classification"
                else "its number, clipped to 0-1")
        return RewardInfo(
            key=key, display_name=f"Head of job {job}",
            description=f"A {head.info.task} head trained by job {job} on {head.info.base_model}: scores the prompt "
                        f"and completion with {what}.",
            source=f"head {head.folder}", order=2000)

    def _scorer(self, key: str) -> HeadScorer:
        from rlvr.models import resolve_model

        with self._lock:
            head = self._found.get(key)
        if head is None:
            self.scan()  # listed by a scan since replaced: look again
            with self._lock:
                head = self._found.get(key)
        if head is None:
            raise LookupError(f"{key}: no Head job's adapter has this key any more")
        stamp = (head.folder / "adapter_model.safetensors").stat().st_mtime  # a head rewritten since: again
        with self._lock:
            loaded = self._scorers.get(key)
        if loaded is None or loaded[0] != stamp:
            log.info("loading head %s from %s on %s", key, head.folder, head.info.base_model)
            loaded = (stamp, HeadScorer(resolve_model(head.info.base_model), head.folder))
            with self._lock:
                self._scorers[key] = loaded
        return loaded[1]

    def _score(self, key: str, samples: Sequence[Sample]) -> list[TermResult]:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        try:
            with lock:  # one load and one batch at a time per head
                scores = self._scorer(key).scores([sample_text(s.prompt, s.completion) for s in samples])
        except Exception as e:  # a head that cannot load or score fails its items, never the call
            reason = TermError(f"{key}: {error_text(e)}")
            return [reason] * len(samples)
        return [RewardOutput(score) for score in scores]

    async def score(self, key: str, samples: Sequence[Sample]) -> list[TermResult]:
        return await asyncio.to_thread(self._score, key, samples)
