"""Seconds to fetch a folder from a trainer worker over TrainerService/FetchFolder (loopback gRPC).

    python bench/folder_fetch.py                 # a 256 MiB file and 20 small ones
    python bench/folder_fetch.py --mib 64

A trainer service runs in this process (no job, no auth) with the folder under its artifact root;
`rlvr.peers.folders.fetch_folder` writes it to another folder, each file checked against its sha256.
Rows: a local copy (shutil.copytree) for scale; the first fetch (every byte sent); a fetch of the
folder held already (nothing sent: both sides hash every file); a fetch broken off once half of the
big file has arrived, then resumed (the bytes the resumed call sent). Prints the load average before
and after (the host may be shared: compare rows of one invocation). It never fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="size of the big file")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "folder_fetch.json"))
    return p.parse_args(argv)


async def run(mib: int, tmp: Path) -> list[tuple[str, float, int]]:
    from rlvr.common.client import make_channel
    from rlvr.peers.clients import AsyncTrainerClient
    from rlvr.peers.folders import fetch_folder
    from rlvr.services.common.server import ServiceRunner
    from rlvr.services.trainer.server import build_service
    from rlvr.services.trainer.settings import TrainerSettings
    from rlvr.transfer import FolderWriter

    root = tmp / "worker"
    folder = root / "jobs" / "bench"
    folder.mkdir(parents=True)
    with (folder / "big.bin").open("wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1024 * 1024))
    for i in range(20):
        (folder / f"small-{i:02d}.json").write_bytes(os.urandom(4096))
    total = sum(p.stat().st_size for p in folder.iterdir())
    rows: list[tuple[str, float, int]] = []
    started = time.perf_counter()
    shutil.copytree(folder, tmp / "copy")
    rows.append(("local copy (shutil.copytree)", time.perf_counter() - started, total))

    settings = TrainerSettings(port=0, artifact_root=root, nats_url="", worker_name="bench")
    async with ServiceRunner(build_service(settings), settings) as runner:
        client = AsyncTrainerClient(make_channel(runner.address, aio=True))
        dest = tmp / "fetched"
        started = time.perf_counter()
        first = await fetch_folder(client, "jobs/bench", dest)
        rows.append(("first fetch", time.perf_counter() - started, total))
        assert len(first.received) == 21
        started = time.perf_counter()
        again = await fetch_folder(client, "jobs/bench", dest)
        rows.append(("fetch of a folder held already", time.perf_counter() - started, 0))
        assert again.received == []

        cut = tmp / "cut"
        writer = FolderWriter(cut, "jobs/bench")
        stream = client.fetch_folder(writer.request())
        async for chunk in stream:
            await asyncio.to_thread(writer.add, chunk)
            if chunk.path == "big.bin" and chunk.offset + len(chunk.data) >= mib * 1024 * 1024 // 2:
                stream.cancel()
                break
        request = writer.request()
        sent_before = request.resume_offset
        started = time.perf_counter()
        resumed = await fetch_folder(client, "jobs/bench", cut)
        rows.append((f"resumed after {sent_before // 2**20} MiB of big.bin", time.perf_counter() - started,
                     total - sent_before))
        assert "big.bin" in resumed.received
        await client.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-fetch-") as tmp:
        rows = asyncio.run(run(args.mib, Path(tmp)))
    print(f"load average after: {os.getloadavg()}")
    print("| what | seconds | bytes sent | MiB/s |\n|---|---|---|---|")
    for what, seconds, sent in rows:
        rate = f"{sent / 2**20 / seconds:.0f}" if sent else "-"
        print(f"| {what} | {seconds:.2f} | {sent:,} | {rate} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([{"what": w, "seconds": s, "bytes": b} for w, s, b in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
