"""Where a Generate call's time goes, as the rollout server logs it and the trainer's client records it
(bench/rollout_gap.py lines the two up): the server's "generate done" line names the call, counts what
it sent, and its parts add up to its total; the client's timestamps fall around the server's on the
host's one monotonic clock."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from test_trainer_rollout import rollout_service

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/fixtures_trainer.py

PARTS = ("validate_s", "engine_s", "decode_s", "build_s", "send_s")


async def test_a_generate_call_is_timed_by_the_server_and_the_client(
    tmp_path: Path, tiny_model: str, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers import AutoTokenizer

    from rlvr.peers.types import BASE_MODEL, Sampling
    from rlvr.services.trainer.job.rollouts import ServiceGenerator

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompts = [tokenizer.encode(q, add_special_tokens=False) for q in ("What is 2+3?", "What is 7+1?", "1+1?")]
    caplog.set_level(logging.INFO, logger="rlvr.rollout")
    async with rollout_service(tmp_path, tiny_model, "transformers") as address:
        generator = ServiceGenerator(address)
        try:
            generator.step = 7
            batch = await asyncio.to_thread(generator.generate, prompts, Sampling(temperature=1.0, max_tokens=32,
                                                                                  seed=3, group_size=4), BASE_MODEL)
        finally:
            generator.close()
    lines = [r for r in caplog.records if r.getMessage() == "generate done"]
    assert len(lines) == 1
    line = vars(lines[0])
    assert line["request_id"] == "trainer-step-7" and line["prompts"] == 3 and line["completions"] == 12
    assert line["tokens"] == sum(len(c) for c in batch.completion_ids)
    assert all(line[p] >= 0 for p in PARTS) and line["engine_s"] > 0 and line["decode_s"] > 0
    assert sum(line[p] for p in PARTS) <= line["total_s"] + 1e-3

    call = generator.last_call
    assert call is not None and call.request_id == "trainer-step-7"
    # one clock: sent, then received by the server, which finished before the client's last message
    assert call.sent <= line["received_monotonic"] <= call.first_response <= call.last_response <= call.done
    assert line["received_monotonic"] + line["engine_s"] <= call.last_response
