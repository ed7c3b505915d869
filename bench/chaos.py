"""Chaos on a whole loop: every part of a running `rlvr up` killed, NATS down for a minute, the
artifact disk filled and the store's connections dropped, and the loop must end exactly as an
undisturbed run of the same seed.

    python bench/chaos.py                                   # seeds 0 and 1, PostgreSQL, every fault
    python bench/chaos.py --seeds 0 --faults quick --rounds 2   # one seed, the short list (make test-all)
    python bench/chaos.py --database sqlite --no-disk       # SQLite, the artifacts on the host's disk

Per seed, two loops of `--rounds` rounds (target out of reach, so both end ROUNDS_SPENT), each on a
stack of its own: `rlvr up` as a child process (embedded NATS, the five services, the rollout server
on vLLM, supervised: a dead part is started again by `rlvr up` itself, never by this script), its
own database (a fresh PostgreSQL database on `--postgres`, or SQLite under the stack's folder) and
its artifacts on a small filesystem of their own (a tmpfs of `--disk-mb` MiB, root only). The first
loop runs undisturbed; the second gets the faults, each fired once when the loop reaches its moment
(the baseline evaluation, a round's training step, an evaluation, the gap between rounds):

- `kill:<part>`: SIGKILL of a service's process (`rlvr up` restarts it), of the job's training
  process, or of the NATS server;
- `nats-outage`: the NATS server frozen (SIGSTOP) for `--outage-s` seconds (60), then resumed:
  every client sees a server that does not answer, for a minute;
- `disk-full`: the artifact filesystem filled to the last byte until the job says so (its status
  message names the disk) or `--disk-wait-s`, then freed;
- `store-drop`: every connection of the stack to its PostgreSQL database terminated
  (pg_terminate_backend); skipped on SQLite.

Then it compares the chaos run with the calm one: the loop's status, rounds and scores, every stored
metric point of every round's job (step by step, the timing columns left out), each round's adapter
byte for byte, and that no step is missing or stored twice; after `rlvr up` stops, that no process
of either stack is left. Prints one table per seed (fault, where it fired, recovery seconds: from
the fault until the part answers again and the loop moves on) and the comparison; writes JSON
(`--out`). It measures; it exits 1 only when a comparison fails, so `make test-all` can run it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from faults import job_spec  # noqa: E402  (bench/faults.py)

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
TIMING_COLUMNS = {"generate_seconds", "score_seconds", "train_seconds", "sync_seconds", "step_seconds", "created_at"}
# The sampler/trainer logprob gap measures the engine's own fp32 numerics, which move in their last
# bits with how vLLM batches the requests of the moment (a restarted engine, an evaluation beside):
# compared within GAP_TOLERANCE, far below fp32's epsilon at 1 (1.2e-7); every other column exactly.
GAP_COLUMNS = ("logprob_gap", "logprob_gap_max")
GAP_TOLERANCE = 1e-7


TRAINING, BENCHMARKING, DONE = 0, 1, 2  # a round's phases, in the order a loop goes through them


@dataclass
class Fault:
    """One fault, fired once: the first time the loop is at or past its moment (round, phase,
    step), so a moment passed between two polls (a quick step, a scheduler away) is not skipped."""

    name: str
    moment: tuple[int, int, int]  # (round: 0 = the baseline, phase, step)
    fired_at: float | None = None
    fired_where: str = ""
    recovered_s: float | None = None
    note: str = ""
    settled: bool = False  # recovered, given up on, or skipped: the next fault may fire

    @property
    def where(self) -> str:
        r, phase, step = self.moment
        if r == 0:
            return "baseline evaluation"
        if phase == BENCHMARKING:
            return f"R{r} evaluation"
        return f"R{r} step {step}" if step else f"R{r} start (between rounds)"

    def due(self, view: LoopView) -> bool:
        return view.status in OPEN and view.position() >= self.moment


OPEN = ("QUEUED", "TRAINING", "BENCHMARKING")


@dataclass
class LoopView:
    """What the watcher saw of the loop at one poll."""

    status: str = ""
    round: int = 0  # the last round's index (0: none yet, the baseline)
    round_status: str = ""
    step: int = 0
    job_id: str = ""
    job_message: str = ""
    seen: dict[str, Any] = field(default_factory=dict)

    def position(self) -> tuple[int, int, int]:
        if self.round == 0:
            return (0, BENCHMARKING if self.status == "BENCHMARKING" else TRAINING, 0)
        phase = {"TRAINING": TRAINING, "BENCHMARKING": BENCHMARKING}.get(self.round_status, DONE)
        return (self.round, phase, self.step if phase == TRAINING else 0)

    def __str__(self) -> str:
        if self.round == 0:
            return f"baseline ({self.status.lower()})"
        return f"R{self.round} {self.round_status.lower()}" + (f" step {self.step}" if self.round_status == "TRAINING" else "")


def schedule(kind: str) -> list[Fault]:
    """The faults of a chaos run, in the order a loop reaches them (rounds of at least 8 steps)."""
    full = [
        Fault("kill:benchmark", (0, BENCHMARKING, 0)),
        Fault("kill:trainer", (1, TRAINING, 2)),
        Fault("kill:job", (1, TRAINING, 4)),
        Fault("kill:reward", (1, TRAINING, 6)),
        Fault("kill:rollout", (1, BENCHMARKING, 0)),
        Fault("kill:scheduler", (2, TRAINING, 0)),
        Fault("kill:nats", (2, TRAINING, 2)),
        Fault("nats-outage", (2, TRAINING, 4)),
        Fault("kill:benchmark", (2, BENCHMARKING, 0)),
        Fault("disk-full", (3, TRAINING, 2)),
        Fault("store-drop", (3, TRAINING, 5)),
        Fault("kill:scheduler", (3, BENCHMARKING, 0)),
    ]
    if kind == "full":
        return full
    quick = ("kill:trainer", "kill:rollout", "kill:scheduler", "kill:nats")
    return [f for f in full if f.name in quick and f.moment[0] < 3]


# ------------------------------------------------------------------------------------------ the stack
class UpStack:
    """`rlvr up` as a child process on a home of its own, its artifacts on a tmpfs when asked."""

    def __init__(self, home: Path, args: argparse.Namespace, database_url: str) -> None:
        self.home, self.args, self.database_url = home, args, database_url
        self.artifacts = home / "artifacts"
        self.mounted = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / "up.log"

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        if self.args.disk_mb:
            self.artifacts.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.args.disk_mb}m", "tmpfs", str(self.artifacts)],
                           check=True)
            self.mounted = True
        cmd = [sys.executable, "-m", "rlvr.clients.cli", "up", "--home", str(self.home), "--base-port", "0",
               "--no-web", "--model", self.args.model, "--memory-fraction", "0.1", "--log-format", "text",
               "--start-timeout", "900"]
        if self.database_url:
            cmd += ["--database-url", self.database_url]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.home)
        deadline = time.monotonic() + 600
        while "rlvr is up" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rlvr up did not come up; see {self.log}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def state(self) -> dict[str, Any]:
        return json.loads((self.home / "stack.json").read_text())

    def pid(self, service: str) -> int:
        return int(self.state()["pids"][service])

    def nats_pid(self) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = [p for p in processes() if "nats-server" in p[1] and str(self.home) in p[1]]
            if pids:
                return pids[0][0]
            time.sleep(0.5)
        raise RuntimeError(f"no nats-server of {self.home} runs")

    def client(self) -> Any:
        from rlvr.clients.sdk import ClientSettings, connect

        return connect(ClientSettings.for_stack(self.home))

    def stop(self) -> list[str]:
        """SIGTERM to `rlvr up` (it stops every part), then what is left of this stack: [] when nothing."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        time.sleep(2)
        left = [f"{pid} {cmd[:120]}" for pid, cmd in processes() if str(self.home) in cmd]
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.artifacts)], check=False)
        return left


def processes() -> list[tuple[int, str]]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                if cmd:
                    out.append((int(proc.name), cmd))
    return out


def job_process_pid(job_id: str) -> int | None:
    for pid, cmd in processes():
        if "rlvr.services.trainer.process.job_process" in cmd and job_id in cmd:
            return pid
    return None


def serving(stack: UpStack, service: str) -> bool:
    from rlvr.peers.base import check_health

    with contextlib.suppress(Exception):
        return check_health(stack.state()["addresses"][service], timeout=1.0) == "SERVING"
    return False


def nats_answers(stack: UpStack) -> bool:
    """NATS answers a client's handshake (`rlvr status`'s check); a frozen one accepts the
    connection but is silent."""
    from rlvr.infra.nats_server import check_nats

    with contextlib.suppress(OSError, ValueError, KeyError):
        return check_nats(stack.state()["nats_url"], timeout=1.0) == "SERVING"
    return False


# ------------------------------------------------------------------------------------------- the loop
def loop_spec(args: argparse.Namespace, seed: int) -> Any:
    from rlvr.v1 import scheduler_pb2 as S

    job = job_spec(args, "", seed)  # bench/faults.py's job: the loop names each round's itself
    return S.LoopSpec(name=f"chaos seed {seed}", job=job, benchmark="rlvr-math-pairs-heldout", target=100.0,
                      max_rounds=args.rounds, give_up_after=args.rounds, min_gain=0.0, benchmark_limit=args.eval_n)


def view_of(client: Any, loop_id: str) -> LoopView | None:
    from rlvr.v1 import scheduler_pb2 as S

    try:
        loop = client.scheduler.get_loop(S.GetLoopRequest(id=loop_id), timeout=5)
    except Exception:  # noqa: BLE001 (the scheduler is being restarted: poll again)
        return None
    v = LoopView(status=S.LoopStatus.Name(loop.status).removeprefix("LOOP_STATUS_"))
    if loop.rounds:
        r = loop.rounds[-1]
        v.round, v.round_status = r.index, S.RoundStatus.Name(r.status).removeprefix("ROUND_STATUS_")
        v.step, v.job_id = r.current_step, r.job_id
        if r.job_id:
            with contextlib.suppress(Exception):
                job = client.scheduler.get_job(S.GetJobRequest(id=r.job_id), timeout=5)
                # what the job says of itself (its error, queue reason, status message), not its spec
                v.job_message = " ".join(str(getattr(job, f.name)) for f in job.DESCRIPTOR.fields
                                         if f.name not in ("spec", "adapter", "summary", "tracking"))
    v.seen["loop"] = loop
    return v


def run_loop(stack: UpStack, args: argparse.Namespace, seed: int, faults: list[Fault]) -> dict[str, Any]:
    """One loop to its end on `stack`, firing `faults` as it goes; its result, ready to compare."""
    from rlvr.v1 import scheduler_pb2 as S

    client = stack.client()
    loop_id = client.scheduler.create_loop(S.CreateLoopRequest(spec=loop_spec(args, seed))).loop.id
    started = time.monotonic()
    pending = list(faults)
    view: LoopView | None = None
    while True:
        got = view_of(client, loop_id)
        if got is not None:
            view = got
            if view.status in ("TARGET_REACHED", "ROUNDS_SPENT", "PLATEAUED", "FAILED", "STOPPED"):
                break
            # One fault at a time: the next only once the last one is recovered from (or skipped),
            # so each recovery is its own and no fault lands on a part still coming back.
            last = next((f for f in reversed(faults) if f.fired_at is not None), None)
            if pending and (last is None or last.settled) and pending[0].due(view):
                fault = pending.pop(0)
                fault.fired_where = str(view)
                print(f"  {time.monotonic() - started:6.0f}s  {fault.name:<15} at {view}", flush=True)
                fire(stack, fault, view, client, loop_id)
        if time.monotonic() - started > args.timeout:
            raise RuntimeError(f"loop {loop_id} did not end within {args.timeout:.0f} s (last seen: {view})")
        time.sleep(0.3)
    for fault in pending:
        fault.note = "never due"
    loop = view.seen["loop"]
    client.close()
    return {"loop": loop, "seconds": time.monotonic() - started, "faults": faults}


def fire(stack: UpStack, fault: Fault, view: LoopView, client: Any, loop_id: str) -> None:
    """Injects one fault and waits (in a thread, so the loop is still watched) for its recovery."""
    fault.fired_at = time.monotonic()
    kind, _, part = fault.name.partition(":")
    back: Callable[[], bool]
    step_at = view.step

    def moved_on() -> bool:  # the loop went past the moment of the fault
        now = view_of(client, loop_id)
        return now is not None and (now.round, now.step, now.status) != (view.round, step_at, view.status)

    if kind == "kill" and part == "job":
        pid = job_process_pid(view.job_id)
        if pid is None:
            fault.note, fault.settled = "no job process found", True
            return
        os.kill(pid, signal.SIGKILL)
        back = moved_on
    elif kind == "kill" and part == "nats":
        os.kill(stack.nats_pid(), signal.SIGKILL)
        time.sleep(0.5)
        back = lambda: nats_answers(stack)  # noqa: E731
    elif kind == "kill":
        os.kill(stack.pid(part), signal.SIGKILL)
        time.sleep(0.5)
        back = lambda: serving(stack, part)  # noqa: E731
    elif kind == "nats-outage":
        pid = stack.nats_pid()
        os.kill(pid, signal.SIGSTOP)
        time.sleep(stack.args.outage_s)
        os.kill(pid, signal.SIGCONT)
        fault.fired_at = time.monotonic()  # recovery counts from the end of the outage
        back = lambda: nats_answers(stack) and moved_on()  # noqa: E731
    elif kind == "disk-full":
        if not stack.mounted:
            fault.note, fault.settled = "skipped: the artifacts are not on a disk of their own (--no-disk)", True
            return
        heard: list[str] = []  # the job's status events (a wait for space is a RUNNING notice)
        threading.Thread(target=listen, args=(stack, view.job_id, heard), daemon=True).start()
        filler = fill_disk(stack.artifacts)
        said = ""
        deadline = time.monotonic() + stack.args.disk_wait_s
        while time.monotonic() < deadline and not said:
            said = next((m for m in heard if "no space left on" in m and str(stack.artifacts) in m), "")
            time.sleep(0.5)
        filler.unlink()
        fault.note = f"the job said: {said[:160]}" if said else f"the job said nothing of the disk in {stack.args.disk_wait_s:.0f} s"
        fault.fired_at = time.monotonic()  # recovery counts from the freeing
        back = moved_on
    elif kind == "store-drop":
        if not stack.database_url.startswith("postgresql"):
            fault.note, fault.settled = "skipped: SQLite", True
            return
        fault.note = f"{drop_connections(stack.database_url)} connections terminated"
        back = moved_on
    else:
        raise ValueError(fault.name)

    def wait() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if back():
                fault.recovered_s = round(time.monotonic() - (fault.fired_at or 0.0), 1)
                break
            time.sleep(0.3)
        fault.settled = True

    threading.Thread(target=wait, daemon=True).start()


def listen(stack: UpStack, job_id: str, heard: list[str]) -> None:
    """Appends each status message of the job (WatchJob, live) to `heard` until it ends."""
    with contextlib.suppress(Exception):
        client = stack.client()
        for event in client.scheduler.watch(job_id, from_start=False, timeout=600):
            if event.HasField("status") and event.status.message:
                heard.append(event.status.message)


def fill_disk(root: Path) -> Path:
    """A file that takes every free byte of `root`'s filesystem (written unbuffered: a buffered file
    would fail again at its close, flushing what the full disk refused)."""
    path = root / ".chaos-filler"
    with open(path, "wb", buffering=0) as fh:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while fh.write(b"\0" * size):
                    pass
    return path


def new_database(args: argparse.Namespace, name: str) -> str:
    import psycopg

    plain = args.postgres.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(plain, connect_timeout=5, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return args.postgres.rsplit("/", 1)[0] + f"/{name}"


def drop_connections(url: str) -> int:
    import psycopg

    database = url.rsplit("/", 1)[1].split("?")[0]
    admin = url.replace("postgresql+psycopg://", "postgresql://", 1).rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, connect_timeout=5, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                            "AND pid <> pg_backend_pid()", (database,)).fetchall()
    return len(rows)


# ------------------------------------------------------------------------------------------ comparing
def stored(stack: UpStack, loop: Any) -> dict[str, Any]:
    """Per round: the stored metric points (timing columns left out) and the adapter's bytes."""
    from rlvr.infra.store import Store

    url = stack.database_url or f"sqlite:///{stack.home / 'rlvr.db'}"
    rounds = []
    with Store(url) as store:
        for r in loop.rounds:
            points = [{k: v for k, v in p.model_dump().items() if k not in TIMING_COLUMNS and k != "job_id"}
                      for p in store.metric_points(r.job_id)]
            job = store.get_job(r.job_id)
            adapter = Path(job.adapter_path, "adapter_model.safetensors") if job and job.adapter_path else None
            rounds.append({"index": r.index, "score": r.score if r.HasField("score") else None,
                           "status": r.status, "points": points,
                           "adapter": adapter.read_bytes() if adapter is not None and adapter.is_file() else None})
    return {"status": loop.status, "baseline": loop.baseline_score, "rounds": rounds}


def same_point(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two stored steps alike: every column equal, the logprob gap within GAP_TOLERANCE."""
    if {k: v for k, v in a.items() if k not in GAP_COLUMNS} != {k: v for k, v in b.items() if k not in GAP_COLUMNS}:
        return False
    for k in GAP_COLUMNS:
        x, y = a.get(k), b.get(k)
        if (x is None) != (y is None) or (x is not None and abs(x - y) > GAP_TOLERANCE):
            return False
    return True


def compare(calm: dict[str, Any], chaos: dict[str, Any], steps: int) -> list[tuple[str, bool, str]]:
    """(what, same, detail) for each thing the chaos run must share with the calm one."""
    from rlvr.v1 import scheduler_pb2 as S

    rows = [("loop status", calm["status"] == chaos["status"],
             f"{S.LoopStatus.Name(calm['status'])} / {S.LoopStatus.Name(chaos['status'])}"),
            ("baseline score", calm["baseline"] == chaos["baseline"], f"{calm['baseline']} / {chaos['baseline']}"),
            ("rounds", len(calm["rounds"]) == len(chaos["rounds"]), f"{len(calm['rounds'])} / {len(chaos['rounds'])}")]
    for a, b in zip(calm["rounds"], chaos["rounds"], strict=False):
        r = f"R{a['index']}"
        rows.append((f"{r} score", a["score"] == b["score"], f"{a['score']} / {b['score']}"))
        got = [p["step"] for p in b["points"]]
        rows.append((f"{r} steps stored once", sorted(got) == list(range(1, steps + 1)),
                     f"{len(set(got))} of {steps}, {len(got) - len(set(got))} twice"))
        diff = [p["step"] for p, q in zip(a["points"], b["points"], strict=False) if not same_point(p, q)]
        same = len(a["points"]) == len(b["points"]) and not diff
        gaps = [abs(p[k] - q[k]) for p, q in zip(a["points"], b["points"], strict=False) for k in GAP_COLUMNS
                if p.get(k) is not None and q.get(k) is not None]
        rows.append((f"{r} metric points", same, (f"equal (logprob gap within {max(gaps):.1e})" if gaps else "equal")
                     if same else f"differ at steps {diff[:5]}"))
        rows.append((f"{r} adapter bytes", a["adapter"] is not None and a["adapter"] == b["adapter"],
                     "identical" if a["adapter"] == b["adapter"] else "differ"))
    return rows


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1", help="comma-separated; one calm and one chaos loop each")
    p.add_argument("--faults", choices=("full", "quick"), default="full")
    p.add_argument("--model", default="rlvr-tiny-small")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=16, help="GRPO steps per round (at least 8 for the full schedule)")
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--eval-n", type=int, default=100, help="benchmark questions per evaluation")
    p.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    p.add_argument("--postgres", default=POSTGRES, help="a PostgreSQL server's URL; each run gets a database of its own")
    p.add_argument("--disk-mb", type=int, default=256, help="the artifacts' tmpfs in MiB (root only)")
    p.add_argument("--no-disk", action="store_true", help="keep the artifacts on the host's disk (no disk-full fault)")
    p.add_argument("--outage-s", type=float, default=60.0, help="how long NATS is frozen")
    p.add_argument("--disk-wait-s", type=float, default=90.0, help="how long the disk stays full at most")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds a loop may take")
    p.add_argument("--home", type=Path, default=None, help="folder for the stacks (default: a temporary one)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "chaos.json")
    args = p.parse_args(argv)
    if args.no_disk or os.geteuid() != 0:
        args.disk_mb = 0
    if args.faults == "full" and args.steps < 8:
        p.error(f"--steps: {args.steps} is too few for the full schedule; allowed: >= 8")
    return args


def run_seed(args: argparse.Namespace, base: Path, seed: int) -> dict[str, Any]:
    results = {}
    for kind in ("calm", "chaos"):
        name = f"chaos_s{seed}_{kind}_{os.getpid()}"
        url = new_database(args, name) if args.database == "postgresql" else ""
        stack = UpStack(base / name, args, url)
        faults = schedule(args.faults) if kind == "chaos" else []
        print(f"seed {seed}, {kind} loop on {stack.home} ({args.database})", flush=True)
        try:
            stack.start()
            run = run_loop(stack, args, seed, faults)
            time.sleep(3)  # the recovery watchers' last polls
            results[kind] = {**stored(stack, run["loop"]), "seconds": run["seconds"], "faults": run["faults"]}
        finally:
            left = stack.stop()
        results[kind]["left"] = left
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = (args.home or Path(tempfile.mkdtemp(prefix="rlvr-chaos-"))).resolve()
    report: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}, "seeds": {}}
    ok = True
    for seed in [int(s) for s in args.seeds.split(",")]:
        res = run_seed(args, base, seed)
        rows = compare(res["calm"], res["chaos"], args.steps)
        rows.append(("no process left", not res["calm"]["left"] and not res["chaos"]["left"],
                     "; ".join(res["calm"]["left"] + res["chaos"]["left"])[:200] or "none"))
        print(f"\nseed {seed}: calm loop {res['calm']['seconds']:.0f} s, chaos loop {res['chaos']['seconds']:.0f} s")
        print(f"{'fault':<16}{'due at':<28}{'fired at':<28}{'recovered s':>12}  note")
        for f in res["chaos"]["faults"]:
            rec = f"{f.recovered_s:.1f}" if f.recovered_s is not None else ("-" if f.fired_at is None else "no")
            print(f"{f.name:<16}{f.where:<28}{f.fired_where or '-':<28}{rec:>12}  {f.note}")
        print(f"\n{'chaos against calm':<28}{'same':<6}detail")
        for what, same, detail in rows:
            print(f"{what:<28}{'yes' if same else 'NO':<6}{detail}")
        faults = res["chaos"]["faults"]
        # a fault that never fired (the loop ended first) or never recovered makes the run no proof
        unfired = [f.name for f in faults if f.fired_at is None and not f.note.startswith("skipped")]
        unrecovered = [f.name for f in faults if f.fired_at is not None and f.recovered_s is None
                       and not f.note.startswith("skipped")]
        if unfired or unrecovered:
            print(f"not fired: {unfired or 'none'}; not recovered: {unrecovered or 'none'}")
        ok &= all(same for _, same, _ in rows) and not unfired and not unrecovered
        report["seeds"][seed] = {
            "calm_s": res["calm"]["seconds"], "chaos_s": res["chaos"]["seconds"],
            "faults": [{"name": f.name, "due": f.where, "fired_at": f.fired_where, "recovered_s": f.recovered_s,
                        "note": f.note, "fired": f.fired_at is not None} for f in res["chaos"]["faults"]],
            "compare": [{"what": w, "same": s, "detail": d} for w, s, d in rows]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}; stacks in {base}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
