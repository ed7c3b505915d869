"""The gap between the rollout server and its own engine: the same prompts and sampling three ways.

    python bench/rollout_gap.py                                   # rlvr-tiny, every workload, every path
    python bench/rollout_gap.py --workloads step --paths engine,server --repeats 7
    python bench/rollout_gap.py --workloads step --paths engine,server,engine-vllm-ops,server-vllm-ops

Paths, one after the other (never two engines at once), each with the same adapter live (a random
rank-`--lora-rank` PEFT LoRA on every linear layer, the trainer's shape) and the trainer's prompts
(`rlvr.services.trainer.job.runner.training_prompts` of a Math Pairs job, as token ids):

- engine: vLLM's own `vllm.LLM.generate` in a child process of this bench, built with the rollout
  server's engine settings (`VLLMBackend.engine_kwargs`: fp32, LoRA on, chunked prefill off on CPU,
  eager on CPU, the zero base LoRA is not needed since every request names the adapter), one call per
  step's batch: the engine's limit on this machine;
- server: the rollout server (`python -m rlvr.services.rollout.main --backend vllm`) in its own process,
  called by the trainer's own client (`rlvr.services.trainer.job.rollouts.ServiceGenerator`, adapter pushed with
  `publish_adapter`) from this process; each call's split comes from the server's "generate done" log
  line (`rlvr.services.rollout.server.GenerateTiming`) lined up with the client's `CallTiming` on the host's
  monotonic clock: request (client send -> server received), validate, engine, decode, build, send,
  stream (the server's last write -> the client's last message), reassembly (-> the RolloutBatch);
- transformers: the same server on `--backend transformers` (one torch thread, `--hf-threads`);
- engine-vllm-ops, server-vllm-ops (not by default): the engine and the server with vLLM's own CPU
  LoRA ops (RLVR_VLLM_LORA_OPS=vllm), as they ran before `rlvr.vllm_lora_ops`.

Workloads: "step" is a training step's batch of bench/trainer_step.py (4 prompts x 8 completions,
48 tokens, temperature 1, seeded); the others change one thing each. The server always returns
logprobs (the trainer needs them), so the "no logprobs" workload runs on the engine path only.
One warm-up call per workload and path, then --repeats timed calls (at least 3); the seconds column
is the median [lowest-highest] over them, the other columns medians. The paths run one after the
other (each its own engine or server, never two at once), so they are not interleaved. The load
average is printed before and after: the host is shared, so compare rows of one invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # make_lora, the tests' LoRA maker
sys.path.insert(0, str(ROOT / "bench"))

from repeats import Spread, check_repeats  # noqa: E402  (bench/repeats.py)

ADAPTER = "bench-gap"


@dataclass(frozen=True)
class Workload:
    prompts: int = 4
    n: int = 8
    max_tokens: int = 48
    temperature: float = 1.0
    seeded: bool = True
    logprobs: bool = True
    note: str = ""


WORKLOADS = {
    "step": Workload(note="a training step's batch"),
    "step-nolp": Workload(logprobs=False, note="no logprobs (engine only)"),
    "step-unseeded": Workload(seeded=False, note="no seed"),
    "greedy": Workload(temperature=0.0, note="temperature 0 (n=1 in the engine, repeated)"),
    "n16": Workload(n=16, note="16 completions per prompt"),
    "long": Workload(max_tokens=128, note="128 tokens"),
}
PATHS = ("engine", "server", "transformers", "engine-vllm-ops", "server-vllm-ops")
DEFAULT_PATHS = ("engine", "server", "transformers")
SPLIT = ("request", "validate", "engine", "decode", "build", "send", "stream", "reassembly")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="rlvr-tiny", help="rlvr-tiny[-test], a hub id or a model folder")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS),
                   help=f"comma list of {', '.join(PATHS)} (*-vllm-ops: with vLLM's own CPU LoRA ops, "
                        "RLVR_VLLM_LORA_OPS=vllm, as before rlvr.vllm_lora_ops)")
    p.add_argument("--repeats", type=check_repeats, default=5,
                   help="timed calls per workload and path (>= 3; median and range)")
    p.add_argument("--lora-rank", type=int, default=4, help="rank of the adapter every path generates with")
    p.add_argument("--server-rank", type=int, default=0,
                   help="the rollout server's --max-lora-rank (0 = its default); the engine path uses the same")
    p.add_argument("--memory", type=float, default=0.3, help="vLLM's memory fraction (engine and server)")
    p.add_argument("--hf-threads", type=int, default=1, help="OMP_NUM_THREADS of the transformers server")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rollout_gap.json")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)  # internal: the engine path's process
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.paths = [x for x in args.paths.split(",") if x]
    if bad := [w for w in args.workloads if w not in WORKLOADS]:
        p.error(f"--workloads: unknown {bad}; choose from {', '.join(WORKLOADS)}")
    if bad := [x for x in args.paths if x not in PATHS]:
        p.error(f"--paths: unknown {bad}; choose from {', '.join(PATHS)}")
    return args


# ------------------------------------------------------------------------------------------ inputs
def prompt_ids(model: str, count: int) -> list[list[int]]:
    """The first `count` training prompts of a Math Pairs job on `model`, as the trainer sends them."""
    from transformers import AutoTokenizer

    from rlvr.services.trainer.job.config import job_config
    from rlvr.services.trainer.job.runner import training_prompts

    tokenizer = AutoTokenizer.from_pretrained(model)
    job = job_config(job_id="gap", base_model=model, artifact_root=Path(tempfile.gettempdir()))
    rendered = [text for text, _ in training_prompts(job, tokenizer)[:count]]
    return [list(tokenizer.encode(text, add_special_tokens=False)) for text in rendered]


def server_rank(args: argparse.Namespace) -> int:
    from rlvr.services.rollout.settings import RolloutSettings

    return args.server_rank or RolloutSettings.model_fields["max_lora_rank"].default


@dataclass
class Call:
    seconds: float
    completions: int
    tokens: int
    split: dict[str, float]


def summary(calls: list[Call]) -> dict[str, Any]:
    seconds = Spread.of([c.seconds for c in calls])
    out: dict[str, Any] = {"seconds": seconds.median, "seconds_spread": seconds.to_json(),
                           "completions": calls[0].completions,
                           "tokens": statistics.median(c.tokens for c in calls)}
    out["completions_per_s"] = out["completions"] / out["seconds"]
    out["tokens_per_s"] = statistics.median(c.tokens / c.seconds for c in calls)
    keys = {k for c in calls for k in c.split}
    out["split"] = {k: statistics.median(c.split.get(k, 0.0) for c in calls) for k in SPLIT if k in keys}
    return out


# ------------------------------------------------------------------------------------- engine path
def engine_child(args: argparse.Namespace, spec: dict[str, Any]) -> None:
    """The engine path, in its own process: vllm.LLM with the server's engine settings. Prints JSON."""
    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import RequestOutputKind

    from rlvr.services.rollout.vllm_backend import VLLMBackend

    backend = VLLMBackend(spec["model"], max_lora_rank=spec["rank"], max_loras=spec["max_loras"],
                          gpu_memory_utilization=args.memory, enforce_eager=spec["eager"],
                          max_model_len=spec["max_model_len"])
    kwargs = backend.engine_kwargs()
    llm = LLM(**kwargs)  # type: ignore[arg-type]
    lora = LoRARequest(lora_name="gap", lora_int_id=1, lora_path=spec["adapter"])
    results: dict[str, Any] = {"engine_kwargs": {k: str(v) for k, v in kwargs.items()}}
    for name in spec["workloads"]:
        w = WORKLOADS[name]
        greedy = w.temperature == 0
        params = SamplingParams(n=1 if greedy else w.n, max_tokens=w.max_tokens, temperature=w.temperature,
                                top_p=1.0, seed=spec["seed"] if w.seeded else None,
                                logprobs=0 if w.logprobs else None, output_kind=RequestOutputKind.FINAL_ONLY,
                                detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"][: w.prompts]]
        calls = []
        for repeat in range(args.repeats + 1):
            t0 = time.perf_counter()
            outputs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
            seconds = time.perf_counter() - t0
            tokens = sum(len(o.token_ids) for out in outputs for o in out.outputs) * (w.n if greedy else 1)
            if repeat:  # the first call is the warm-up
                calls.append(Call(seconds, w.prompts * w.n, tokens, {"engine": seconds}))
        results[name] = summary(calls)
    print("RESULT " + json.dumps(results), flush=True)


def lora_ops_env(path: str) -> dict[str, str]:
    return {**os.environ, "RLVR_VLLM_LORA_OPS": "vllm" if path.endswith("-vllm-ops") else "grouped"}


def run_engine(args: argparse.Namespace, spec: dict[str, Any], work: Path, path: str) -> dict[str, Any]:
    log = work / f"{path}.log"
    with log.open("wb") as out:
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec), "--repeats", str(args.repeats),
                               "--memory", str(args.memory)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                              env=lora_ops_env(path))
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the engine path failed (exit {proc.returncode}); log tail:\n{text[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


# ------------------------------------------------------------------------------------- server path
@contextlib.contextmanager
def rollout_server(args: argparse.Namespace, backend: str, model: str, work: Path,
                   path: str) -> Iterator[tuple[str, Path]]:
    from test_bootstrap import _wait_serving

    from rlvr.clients.stack import free_port
    from rlvr.infra.reaper import stop_process_groups

    port = free_port()
    log = work / f"rollout-{path}.log"
    env = {**lora_ops_env(path), **({"OMP_NUM_THREADS": str(args.hf_threads)} if backend == "transformers" else {})}
    cmd = [sys.executable, "-m", "rlvr.services.rollout.main", "--port", str(port), "--model", model,
           "--backend", backend, "--memory-fraction", str(args.memory), "--max-lora-rank", str(server_rank(args)),
           "--adapter-root", str(work / f"adapters-{path}"), "--log-format", "json"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        try:
            _wait_serving(f"127.0.0.1:{port}", timeout=600)
        except TimeoutError:
            raise RuntimeError(f"the {backend} rollout server did not serve; log tail:\n"
                               f"{log.read_text(errors='replace')[-3000:]}") from None
        yield f"127.0.0.1:{port}", log
    finally:
        stop_process_groups([proc], grace=60)


def server_lines(log: Path) -> dict[str, dict[str, Any]]:
    """The server's "generate done" records by request id."""
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        if '"generate done"' in line:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                found[record["request_id"]] = record
    return found


def run_server(args: argparse.Namespace, path: str, model: str, adapter: Path, prompts: list[list[int]],
               work: Path) -> dict[str, Any]:
    from rlvr.peers.types import AdapterTag, Sampling
    from rlvr.services.trainer.job.rollouts import ServiceGenerator

    results: dict[str, Any] = {}
    backend = "transformers" if path == "transformers" else "vllm"
    with rollout_server(args, backend, model, work, path) as (address, log):
        generator = ServiceGenerator(address)
        try:
            tag = AdapterTag(ADAPTER, 1)
            generator.publish_adapter(adapter, tag)
            for name in args.workloads:
                w = WORKLOADS[name]
                if not w.logprobs:
                    continue  # the server always returns them
                sampling = Sampling(temperature=w.temperature, max_tokens=w.max_tokens, group_size=w.n,
                                    seed=args.seed if w.seeded else None)
                timed: list[tuple[float, int, Any]] = []
                for repeat in range(args.repeats + 1):
                    generator.step = 1000 * len(results) + repeat  # the request id: trainer-step-<step>
                    t0 = time.perf_counter()
                    batch = generator.generate(prompts[: w.prompts], sampling, tag)
                    seconds = time.perf_counter() - t0
                    if repeat:
                        timed.append((seconds, sum(len(c) for c in batch.completion_ids), generator.last_call))
                time.sleep(0.2)  # the server's log line is written after its last message
                records = server_lines(log)
                calls = [Call(s, w.prompts * w.n, tokens, split_of(call, records.get(call.request_id)))
                         for s, tokens, call in timed]
                results[name] = summary(calls)
        finally:
            generator.close()
    return results


def split_of(call: Any, server: dict[str, Any] | None) -> dict[str, float]:
    """One call's time by part: the client's timestamps and the server's own line, on one clock."""
    if server is None:
        return {}
    received = server["received_monotonic"]
    return {
        "request": received - call.sent,
        "validate": server["validate_s"], "engine": server["engine_s"], "decode": server["decode_s"],
        "build": server["build_s"], "send": server["send_s"],
        "stream": max(0.0, call.last_response - (received + server["total_s"])),
        "reassembly": call.done - call.last_response,
    }


# ------------------------------------------------------------------------------------------- report
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        engine_child(args, json.loads(args.child))
        return 0
    from test_rollout_core import make_lora

    from rlvr.models import resolve_model

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    model = resolve_model(args.model)
    biggest = max(WORKLOADS[w].prompts for w in args.workloads)
    prompts = prompt_ids(model, biggest)
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="rlvr-gap-") as tmp:
        work = Path(tmp)
        adapter = make_lora(Path(model), work / "lora", seed=1, r=args.lora_rank)
        from rlvr.services.rollout.settings import RolloutSettings

        defaults = RolloutSettings.model_fields
        spec = {"model": model, "adapter": str(adapter), "rank": server_rank(args), "eager": None,
                "max_loras": defaults["max_loras"].default, "max_model_len": defaults["max_model_len"].default, "seed": args.seed, "workloads": args.workloads, "prompts": prompts}
        from rlvr.services.rollout.server import _eager

        spec["eager"] = _eager(None)
        for path in args.paths:
            print(f"{path}: starting ...", flush=True)
            try:
                if path.startswith("engine"):
                    results[path] = run_engine(args, spec, work, path)
                else:
                    results[path] = run_server(args, path, model, adapter, prompts, work)
            except Exception as e:  # one failed path must not lose the others' numbers
                errors[path] = f"{type(e).__name__}: {e}"
                print(f"  {path} FAILED: {errors[path]}", flush=True)
    load_after = os.getloadavg()
    print_table(args, results, errors, load_before, load_after)
    report = {"command": " ".join(["python bench/rollout_gap.py", *(argv if argv is not None else sys.argv[1:])]),
              "model": args.model, "lora_rank": args.lora_rank, "server_max_lora_rank": server_rank(args),
              "workloads": {w: vars(WORKLOADS[w]) for w in args.workloads}, "repeats": args.repeats,
              "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after,
              "wall_s": time.perf_counter() - t0, "results": results, "errors": errors}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def print_table(args: argparse.Namespace, results: dict[str, dict[str, Any]], errors: dict[str, str],
                load_before: tuple[float, ...], load_after: tuple[float, ...]) -> None:
    print()
    print(f"model {args.model}, adapter rank {args.lora_rank} (engine/server max_lora_rank {server_rank(args)}), "
          f"median [lowest-highest] of {args.repeats} calls after a warm-up; {os.cpu_count()} CPUs, load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after. vs engine = seconds over the engine's.")
    head = (f"{'workload':<15}{'path':<17}{'seconds':>22}{'compl/s':>9}{'tok/s':>8}{'vs engine':>10}  "
            + " ".join(f"{k:>8}" for k in SPLIT))
    print(head)
    print("-" * len(head))
    for name in args.workloads:
        base = results.get("engine", {}).get(name)
        for path in args.paths:
            if path in errors:
                print(f"{name:<15}{path:<17}  failed: {errors[path].splitlines()[0][:80]}")
                continue
            r = results.get(path, {}).get(name)
            if r is None:
                continue
            ratio = f"{r['seconds'] / base['seconds']:.2f}x" if base else "-"
            split = r.get("split", {})
            seconds = Spread.from_json(r["seconds_spread"]).cell(3)
            print(f"{name:<15}{path:<17}{seconds:>22}{r['completions_per_s']:>9.1f}{r['tokens_per_s']:>8.0f}"
                  f"{ratio:>10}  " + " ".join(f"{split[k]:>8.3f}" if k in split else f"{'-':>8}" for k in SPLIT))
    print("split (seconds): request = client send -> server received; validate, engine (queue + generation), "
          "decode, build, send = the server's own line; stream = its last write -> the client's last message; "
          "reassembly = -> the trainer's RolloutBatch")


if __name__ == "__main__":
    sys.exit(main())
