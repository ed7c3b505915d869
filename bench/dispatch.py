"""Seconds per scheduler dispatch round with many queued jobs that no worker can run yet.

    python bench/dispatch.py                              # 10, 100, 1000 and 5000 queued jobs, 4 workers
    python bench/dispatch.py --queued 100,2000 --workers 8 --repeats 5

The scheduler runs `JobManager.dispatch_once` every second (and on every new job): it reconciles the
running jobs, then for each queued job works out which workers can run it (fit.py) and stores the
reason it waits. Here every queued job asks for two GPUs and every worker is a CPU, so each round
finds nothing to start: the steady state of a long queue. The store is a SQLite file, the workers are
in-process fakes that answer at once (no gRPC), so the rows time the scheduler's own work.

Rows:
- "first round": every job's spec parsed and fit against every worker, and its reason stored;
- "next rounds": nothing changed since (the same jobs, the same workers' capabilities): the fits
  are the ones worked out before (dispatch.py `Dispatcher.fits`);
- "next rounds, fits not kept": the same rounds with that memory cleared before each, which is what
  every round cost before it existed.

Each queue length is measured on `--repeats` fresh queues (at least 3; a store of its own each, the
lengths taking turns), one round of each kind per queue; each cell is the median [lowest-highest]
over those queues. Prints the load average before and after (the host may be shared: compare rows of
one invocation). It never fails on time: it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from repeats import check_repeats, spreads  # noqa: E402  (bench/repeats.py)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queued", default="10,100,1000,5000", help="comma list of queue lengths")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--repeats", type=check_repeats, default=3, help="fresh queues per length (>= 3)")
    args = p.parse_args(argv)
    args.queued = [int(n) for n in args.queued.split(",") if n.strip()]
    return args


class CpuWorkers:
    """Idle CPU trainer workers that never get a job (every queued job wants GPUs)."""

    def __init__(self, n: int) -> None:
        from rlvr.v1 import trainer_pb2

        self.addresses = [f"cpu{i}:50052" for i in range(n)]
        self.caps = trainer_pb2.WorkerCapabilities(
            device_kind="cpu", cpu_cores=16, memory_bytes=64 << 30, precisions=["fp32", "bf16"],
            quantizations=["full"], max_num_processes=8, cached_models=["rlvr-tiny"])

    async def status(self, address: str):  # -> WorkerState
        from rlvr.services.scheduler.workers import WorkerState

        return WorkerState(address=address, name=address, busy=False, job_id="", capabilities=self.caps)

    async def start(self, *args: object, **kwargs: object) -> str:
        raise AssertionError("no job fits a CPU worker here")

    async def cancel(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("nothing runs")


async def measure(queued: int, workers: int, folder: Path) -> dict[str, float]:
    """One fresh queue of `queued` jobs (a store in `folder`): the seconds of its first round, of the
    next round, and of a round with the fits cleared before it."""
    from rlvr.infra.schema import JobRow
    from rlvr.infra.store import Store
    from rlvr.jobspec import resolve_spec
    from rlvr.services.scheduler.convert import spec_to_json
    from rlvr.services.scheduler.jobs import JobManager
    from rlvr.v1 import common_pb2

    spec = common_pb2.JobSpec()
    spec.advanced.gpu_selection, spec.advanced.num_processes = "0,1", 2
    spec.grpo.group_size, spec.grpo.batch_size = 4, 8
    spec_json = spec_to_json(resolve_spec(spec).spec)
    folder.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{folder / f'q{queued}.db'}")
    store.create_all()
    for _ in range(queued):
        store.add_job(JobRow(name="wants-gpus", spec_json=spec_json, status="QUEUED", total_steps=10))
    jobs = JobManager(store, None, CpuWorkers(workers))

    async def timed(forget: bool) -> float:
        if forget:
            jobs.dispatcher.fits.clear()
        start = time.perf_counter()
        await jobs.dispatch_once()
        return time.perf_counter() - start

    try:
        first = await timed(False)
        kept = await timed(False)
        forgotten = await timed(True)
        waiting = store.list_jobs("QUEUED", 1, 0)
        assert waiting and waiting[0].queue_reason.startswith("no trainer worker can run it"), waiting
        return {"queued": queued, "first": first, "kept": kept, "forgotten": forgotten}
    finally:
        store.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    print(f"dispatch rounds, {args.workers} idle CPU workers, every queued job wanting 2 GPUs; "
          f"median [lowest-highest] of {args.repeats} fresh queues (seconds per round)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-dispatch-") as tmp:
        for repeat in range(args.repeats):
            for n in args.queued:  # interleaved: a slow spell of the host touches every length alike
                rows.append(asyncio.run(measure(n, args.workers, Path(tmp) / f"{repeat}")))
    table = {key: spreads(rows, key, by="queued") for key in ("first", "kept", "forgotten")}
    print(f"{'queued jobs':>12} {'first round':>26} {'next round':>26} {'fits not kept':>26}")
    for n in args.queued:
        print(f"{n:>12} " + " ".join(f"{table[key][n].cell(4):>26}" for key in table))
    print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
