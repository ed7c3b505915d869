"""Seconds to fetch a folder from a trainer worker over TrainerService/FetchFolder (loopback gRPC).

    python bench/folder_fetch.py                 # a 256 MiB file and 20 small ones
    python bench/folder_fetch.py --mib 64

A trainer service runs in this process (no job, no auth) with the folder under its artifact root;
`rlvr.peers.folders.fetch_folder` writes it to another folder, each file checked against its sha256.
Rows: a local copy (shutil.copytree) for scale; the first fetch (every byte sent); a fetch of the
folder held already (nothing sent: both sides hash every file); a fetch broken off once half of the
big file has arrived, then resumed (the bytes the resumed call sent). The four rows run `--repeats`
times (at least 3), in turn (copy, first, held, resumed, then the next round, each round into fresh
folders); each cell is the median [lowest-highest] over the rounds. `--mib` must be at least two
transfer chunks (2 MiB), or the cut-off fetch would hold the whole big file before it is cut. Prints
the load average before and after (the host may be shared: compare rows of one invocation). It never
fails on time.
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
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)

MIN_MIB = 2  # two chunks of rlvr.transfer.CHUNK_SIZE (1 MiB): the cut lands inside the big file


def check_mib(mib: str) -> int:
    """`--mib`, refused below MIN_MIB (argparse's type=)."""
    try:
        value = int(mib)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mib: {mib!r} is not a whole number") from None
    if value < MIN_MIB:
        raise argparse.ArgumentTypeError(f"--mib must be at least {MIN_MIB} (two 1 MiB chunks: the resumed row cuts "
                                         "the big file after its first half)")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=check_mib, default=256, help=f"size of the big file (>= {MIN_MIB})")
    p.add_argument("--repeats", type=check_repeats, default=3, help="rounds of the four rows (>= 3)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "folder_fetch.json"))
    return p.parse_args(argv)


ROWS = {"copy": "local copy (shutil.copytree)", "first": "first fetch", "held": "fetch of a folder held already",
        "resumed": "resumed after {cut} MiB of big.bin"}


@dataclass(frozen=True)
class Run:
    """One row's timing in one round."""

    row: str  # a ROWS key
    repeat: int
    seconds: float
    sent: int  # bytes
    cut_mib: int | None = None  # the resumed row: MiB of big.bin held when the fetch was cut off


async def run(mib: int, tmp: Path, repeats: int) -> list[Run]:
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
    rows: list[Run] = []

    settings = TrainerSettings(port=0, artifact_root=root, nats_url="", worker_name="bench")
    async with ServiceRunner(build_service(settings), settings) as runner:
        client = AsyncTrainerClient(make_channel(runner.address, aio=True))
        for repeat in range(1, repeats + 1):
            work = tmp / f"round-{repeat}"
            started = time.perf_counter()
            shutil.copytree(folder, work / "copy")
            rows.append(Run("copy", repeat, time.perf_counter() - started, total))
            dest = work / "fetched"
            started = time.perf_counter()
            first = await fetch_folder(client, "jobs/bench", dest)
            rows.append(Run("first", repeat, time.perf_counter() - started, total))
            assert len(first.received) == 21
            started = time.perf_counter()
            again = await fetch_folder(client, "jobs/bench", dest)
            rows.append(Run("held", repeat, time.perf_counter() - started, 0))
            assert again.received == []

            cut = work / "cut"
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
            rows.append(Run("resumed", repeat, time.perf_counter() - started, total - sent_before,
                            sent_before // 2**20))
            assert "big.bin" in resumed.received
            shutil.rmtree(work)  # three copies of the folder per round: not kept for the next
        await client.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-fetch-") as tmp:
        rows = asyncio.run(run(args.mib, Path(tmp), args.repeats))
    print(f"load average after: {os.getloadavg()}")
    print(f"a {args.mib} MiB file and 20 of 4 KiB; median [lowest-highest] of {args.repeats} rounds")
    print("| what | seconds | bytes sent | MiB/s |\n|---|---|---|---|")
    summary = []
    for key, label in ROWS.items():
        mine = [r for r in rows if r.row == key]
        seconds = Spread.of([r.seconds for r in mine])
        sent = Spread.of([r.sent for r in mine])
        rate = Spread.of([r.sent / 2**20 / r.seconds for r in mine]) if sent.median else Spread.of([])
        what = label.format(cut="/".join(str(c) for c in sorted({r.cut_mib for r in mine if r.cut_mib is not None})))
        # the bytes are the same every round but where the cut-off fetch stopped differs: then its range
        sent_cell = (f"{sent.median:,.0f}" if sent.low == sent.high
                     else f"{sent.median:,.0f} [{sent.low:,.0f}-{sent.high:,.0f}]")
        print(f"| {what} | {seconds.cell(3)} | {sent_cell} | {rate.cell(0)} |")
        summary.append({"what": what, "seconds": seconds.to_json(), "bytes": sent.to_json(),
                        "mib_per_s": rate.to_json(), "runs": [asdict(r) for r in mine]})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"mib": args.mib, "repeats": args.repeats, "rows": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
