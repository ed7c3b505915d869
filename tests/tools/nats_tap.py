"""A NATS client that knows nothing of rlvr: it replays a JetStream subject from a stream sequence
to the end and counts the messages per subject and the Nats-Msg-Id values seen more than once.
nats-py only; run as `python tests/tools/nats_tap.py URL SUBJECT [START_SEQ]` (the URL may carry
`USER:PASSWORD@`). Prints one `SUBJECT: COUNT` line per subject, then `duplicated ids N`."""

from __future__ import annotations

import asyncio
import collections
import sys

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import ConsumerConfig, DeliverPolicy


async def tap(url: str, subject: str, start_seq: int) -> int:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        sub = await js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                 config=ConsumerConfig(opt_start_seq=start_seq))
        per_subject: collections.Counter[str] = collections.Counter()
        ids: collections.Counter[str] = collections.Counter()
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except NatsTimeout:  # the replay reached the end of the stream
                break
            per_subject[msg.subject] += 1
            ids[(msg.headers or {}).get("Nats-Msg-Id", "")] += 1
        for name, count in sorted(per_subject.items()):
            print(f"{name}: {count}")
        print(f"duplicated ids {sum(1 for key, n in ids.items() if key and n > 1)}")
        return 0
    finally:
        await nc.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(tap(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1)))
