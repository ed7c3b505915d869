"""Every field's bounds, defaults and the batch rounding of the spec's GRPO card."""

import pytest

from rlvr.common.errors import InvalidArgument
from rlvr.jobspec import resolve_spec
from rlvr.v1 import common_pb2 as C


def spec(**groups: dict) -> C.JobSpec:
    s = C.JobSpec()
    for group, fields in groups.items():
        for k, v in fields.items():
            setattr(getattr(s, group), k, v)
    return s


def test_defaults_match_the_spec() -> None:
    r = resolve_spec(C.JobSpec())
    g, a, rw = r.spec.grpo, r.spec.advanced, r.spec.reward
    assert (g.group_size, g.max_completion_tokens, g.lora_rank, g.lora_alpha) == (8, 256, 8, 16)
    assert g.learning_rate == pytest.approx(1e-6) and g.max_steps == 100
    assert rw.function == C.REWARD_FUNCTION_MATH_PAIRS and rw.synthetic_prompts == 256 and rw.format_bonus
    assert a.loss_type == C.LOSS_TYPE_GRPO and a.quantization == C.QUANTIZATION_FULL
    assert a.generation_backend == C.GENERATION_BACKEND_VLLM and a.gpu_selection == "auto"
    # Default batch 4 against default group 8: rounded up to 8 with a warning, as the spec says.
    assert g.batch_size == 8
    assert any("rounded up to 8" in w for w in r.warnings)


def test_training_summary() -> None:
    s = resolve_spec(C.JobSpec()).summary
    assert (s.method, s.reward, s.backend) == ("RLVR (GRPO)", "Math Pairs (synthetic)", "vLLM (rollout server)")
    assert (s.group_size, s.max_completion, s.lora_rank, s.max_steps, s.gpu_selection) == (8, 256, 8, 100, "auto")
    assert s.model == "rlvr-tiny" and s.learn_rate == pytest.approx(1e-6)


@pytest.mark.parametrize("batch,group,expected", [(4, 8, 8), (8, 8, 8), (16, 6, 18), (1, 2, 2), (32, 32, 32),
                                                  (2, 3, 3), (32, 5, 35)])
def test_batch_rounding(batch: int, group: int, expected: int) -> None:
    r = resolve_spec(spec(grpo={"batch_size": batch, "group_size": group}))
    assert r.spec.grpo.batch_size == expected
    assert (len(r.warnings) == 1) == (batch != expected)


BOUNDS = [
    ("grpo", "group_size", 2, 32, "2-32"),
    ("grpo", "max_completion_tokens", 32, 2048, "32-2048"),
    ("grpo", "lora_rank", 4, 64, "4-64"),
    ("grpo", "lora_alpha", 4, 128, "4-128"),
    ("grpo", "learning_rate", 5e-7, 1e-5, "5e-07 to 1e-05"),
    ("reward", "synthetic_prompts", 8, 100_000, "8-100000"),
    ("advanced", "epochs", 1, 100, "1-100"),
    ("advanced", "gpu_memory_fraction", 0.05, 0.95, "0.05 to 0.95"),
    ("advanced", "max_async_steps", 0, 4, "0-4"),
]


@pytest.mark.parametrize("group,field,low,high,text", BOUNDS)
def test_bounds_inclusive_and_named(group: str, field: str, low: float, high: float, text: str) -> None:
    def with_value(value: float) -> C.JobSpec:
        s = spec(**{group: {field: value}})
        if field == "gpu_memory_fraction":  # the colocate backend's own setting
            s.advanced.generation_backend = C.GENERATION_BACKEND_VLLM_COLOCATE
        return s

    for ok in (low, high):
        resolve_spec(with_value(ok))
    step = 1 if isinstance(low, int) else low * 0.5
    for bad in (low - step, high + (1 if isinstance(high, int) else high * 0.5)):
        with pytest.raises(InvalidArgument) as err:
            resolve_spec(with_value(bad))
        msg = str(err.value)
        assert msg.startswith(f"{group}.{field}:") and text in msg, msg


@pytest.mark.parametrize("bad", [0, 3, 5, 64, -4])
def test_batch_size_must_be_listed(bad: int) -> None:
    with pytest.raises(InvalidArgument, match=r"grpo.batch_size: .*one of 1, 2, 4, 8, 16, 32"):
        resolve_spec(spec(grpo={"batch_size": bad}))


@pytest.mark.parametrize("value,ok", [(-1, True), (1, True), (300, True), (0, False), (-2, False)])
def test_max_steps(value: int, ok: bool) -> None:
    if ok:
        assert resolve_spec(spec(grpo={"max_steps": value})).spec.grpo.max_steps == value
    else:
        with pytest.raises(InvalidArgument, match="grpo.max_steps"):
            resolve_spec(spec(grpo={"max_steps": value}))


def test_full_run_step_count() -> None:
    # 256 prompts, batch 16 / group 8 = 2 prompts a step, 2 epochs: 256 steps.
    r = resolve_spec(spec(grpo={"max_steps": -1, "batch_size": 16}, advanced={"epochs": 2}))
    assert r.total_steps == 256 and r.summary.total_steps == 256


def test_enums_and_selection() -> None:
    with pytest.raises(InvalidArgument, match="advanced.loss_type"):
        resolve_spec(spec(advanced={"loss_type": 9}))
    with pytest.raises(InvalidArgument, match="advanced.gpu_selection"):
        resolve_spec(spec(advanced={"gpu_selection": "gpu0"}))
    two = resolve_spec(spec(grpo={"batch_size": 16}, advanced={"gpu_selection": "0,1", "num_processes": 2}))
    assert two.spec.advanced.gpu_selection == "0,1"


def test_num_processes_agrees_with_the_devices_and_the_batch() -> None:
    a = resolve_spec(C.JobSpec()).spec.advanced
    assert a.num_processes == 1 and a.precision == "auto" and a.gradient_checkpointing == "auto"
    with pytest.raises(InvalidArgument, match=r"advanced.num_processes: 9 is out of range; allowed: 1-8 \(default 1\)"):
        resolve_spec(spec(advanced={"num_processes": 9}))
    # Two devices and one process: refused (transformers would silently wrap the model in DataParallel).
    with pytest.raises(InvalidArgument, match=r"advanced.gpu_selection: '0,1' lists 2 device\(s\) but "
                                              r"advanced.num_processes is 1"):
        resolve_spec(spec(advanced={"gpu_selection": "0,1"}))
    with pytest.raises(InvalidArgument, match="advanced.gpu_selection: '1,1' lists a device twice"):
        resolve_spec(spec(advanced={"gpu_selection": "1,1", "num_processes": 2}))
    # Whole groups on every process: 8 completions of groups of 8 do not split over 2.
    with pytest.raises(InvalidArgument, match=r"grpo.batch_size: 8 .* advanced.num_processes 2; use a multiple of 16"):
        resolve_spec(spec(advanced={"num_processes": 2}))
    ok = resolve_spec(spec(grpo={"batch_size": 8, "group_size": 4}, advanced={"num_processes": 2, "gpu_selection": "cpu"}))
    assert ok.spec.advanced.num_processes == 2
    with pytest.raises(InvalidArgument, match="advanced.num_processes: 2 processes cannot each start a vLLM"):
        resolve_spec(spec(grpo={"batch_size": 16}, advanced={
            "num_processes": 2, "generation_backend": C.GENERATION_BACKEND_VLLM_COLOCATE}))
    with pytest.raises(InvalidArgument, match="advanced.dynamic_sampling: not supported across processes"):
        resolve_spec(spec(grpo={"batch_size": 16}, advanced={"num_processes": 2, "dynamic_sampling": True}))


def test_precision() -> None:
    assert resolve_spec(spec(advanced={"precision": " bf16 "})).spec.advanced.precision == "bf16"
    with pytest.raises(InvalidArgument, match='advanced.precision: \'fp8\' is out of range; allowed: "auto", '
                                              '"fp32", "bf16" or "fp16" \\(default "auto"\\)'):
        resolve_spec(spec(advanced={"precision": "fp8"}))


def test_sharding() -> None:
    assert resolve_spec(C.JobSpec()).spec.advanced.sharding == "ddp"
    two = {"grpo": {"batch_size": 8, "group_size": 4}}
    fsdp = resolve_spec(spec(**two, advanced={"num_processes": 2, "sharding": " fsdp "})).spec.advanced
    assert fsdp.sharding == "fsdp"
    assert resolve_spec(spec(**two, advanced={"num_processes": 2, "sharding": "fsdp",
                                               "quantization": C.QUANTIZATION_4BIT})).spec.advanced.sharding == "fsdp"
    with pytest.raises(InvalidArgument, match=r"advanced.sharding: 'zero3' is out of range; allowed: \"ddp\" or "
                                              r"\"fsdp\" \(default \"ddp\"\)"):
        resolve_spec(spec(advanced={"sharding": "zero3"}))
    with pytest.raises(InvalidArgument, match="advanced.sharding: fsdp shards the model across processes, and "
                                              "advanced.num_processes is 1; set it to 2 or more"):
        resolve_spec(spec(advanced={"sharding": "fsdp"}))
    with pytest.raises(InvalidArgument, match="advanced.sharding: fsdp cannot shard an 8-bit base"):
        resolve_spec(spec(**two, advanced={"num_processes": 2, "sharding": "fsdp", "quantization": C.QUANTIZATION_8BIT}))
    with pytest.raises(InvalidArgument, match="advanced.sharding: fsdp runs on one node only "
                                              r"\(advanced.num_nodes is 2\)"):
        resolve_spec(spec(**two, advanced={"num_nodes": 2, "sharding": "fsdp"}))
    assert resolve_spec(spec(**two, advanced={"num_nodes": 2})).spec.advanced.sharding == "ddp"
    # A bad process count is named once, not again by sharding.
    with pytest.raises(InvalidArgument) as err:
        resolve_spec(spec(advanced={"num_processes": 9, "sharding": "fsdp"}))
    assert "advanced.sharding" not in str(err.value)


def test_lora_init_and_dynamic_sampling() -> None:
    a = resolve_spec(C.JobSpec()).spec.advanced
    assert a.lora_init == "default" and not a.dynamic_sampling
    with pytest.raises(InvalidArgument, match='advanced.lora_init.*"default" or "gaussian"'):
        resolve_spec(spec(advanced={"lora_init": "kaiming"}))
    a = resolve_spec(spec(advanced={"lora_init": "gaussian", "dynamic_sampling": True})).spec.advanced
    assert (a.lora_init, a.dynamic_sampling) == ("gaussian", True)


def test_dataset_rules() -> None:
    r = resolve_spec(spec(reward={"function": C.REWARD_FUNCTION_GSM8K, "dataset": "my/data"}))
    assert r.spec.reward.dataset == "" and any("ignored" in w and "GSM8K" in w for w in r.warnings)
    with pytest.raises(InvalidArgument, match="reward.dataset: required"):
        resolve_spec(spec(reward={"function": C.REWARD_FUNCTION_BOXED}))
    r = resolve_spec(spec(reward={"function": C.REWARD_FUNCTION_BOXED, "dataset": "data.jsonl"}))
    assert r.spec.reward.dataset_split == "train" and r.total_steps == 100


def test_three_backends_and_the_memory_slider_only_where_it_means_something() -> None:
    colocate = resolve_spec(spec(advanced={"generation_backend": C.GENERATION_BACKEND_VLLM_COLOCATE}))
    assert colocate.spec.advanced.gpu_memory_fraction == pytest.approx(0.3)  # its default
    assert colocate.summary.backend == "vLLM (colocate)"
    r = resolve_spec(spec(advanced={"generation_backend": C.GENERATION_BACKEND_VLLM_COLOCATE,
                                    "gpu_memory_fraction": 0.5}))
    assert r.spec.advanced.gpu_memory_fraction == pytest.approx(0.5)
    assert resolve_spec(spec(advanced={"generation_backend": C.GENERATION_BACKEND_TRANSFORMERS})
                        ).summary.backend == "Transformers (in-process)"
    assert not resolve_spec(C.JobSpec()).spec.advanced.HasField("gpu_memory_fraction")
    for backend, why in ((C.GENERATION_BACKEND_TRANSFORMERS, "runs no vLLM engine"),
                         (C.GENERATION_BACKEND_VLLM, "its --memory-fraction setting")):
        with pytest.raises(InvalidArgument) as err:
            resolve_spec(spec(advanced={"generation_backend": backend, "gpu_memory_fraction": 0.5}))
        assert str(err.value).startswith("advanced.gpu_memory_fraction: only the vLLM (colocate) backend takes")
        assert why in str(err.value)


def test_dataset_split_per_reward() -> None:
    gsm = resolve_spec(spec(reward={"function": C.REWARD_FUNCTION_GSM8K}))
    assert gsm.spec.reward.dataset_split == "train"
    assert resolve_spec(spec(reward={"function": C.REWARD_FUNCTION_GSM8K, "dataset_split": "test"})
                        ).spec.reward.dataset_split == "test"
    with pytest.raises(InvalidArgument) as err:
        resolve_spec(spec(reward={"function": C.REWARD_FUNCTION_GSM8K, "dataset_split": "dev"}))
    assert str(err.value).startswith("reward.dataset_split: 'dev' is out of range; allowed: a split of the built-in "
                                     "openai/gsm8k: train, test")
    pairs = resolve_spec(spec(reward={"dataset_split": "test"}))
    assert pairs.spec.reward.dataset_split == "" and any("dataset_split 'test' is ignored" in w for w in pairs.warnings)
    boxed = resolve_spec(spec(reward={"function": C.REWARD_FUNCTION_BOXED, "dataset": " d.jsonl "}))
    assert (boxed.spec.reward.dataset, boxed.spec.reward.dataset_split) == ("d.jsonl", "train")


def test_input_is_not_modified() -> None:
    s = spec(grpo={"batch_size": 4})
    resolve_spec(s)
    assert s.grpo.batch_size == 4 and not s.grpo.HasField("group_size")


def test_max_async_steps_defaults_to_synchronous_and_needs_the_rollout_server() -> None:
    assert resolve_spec(C.JobSpec()).spec.advanced.max_async_steps == 0
    assert resolve_spec(spec(advanced={"max_async_steps": 2})).spec.advanced.max_async_steps == 2
    for backend in (C.GENERATION_BACKEND_TRANSFORMERS, C.GENERATION_BACKEND_VLLM_COLOCATE):
        resolve_spec(spec(advanced={"generation_backend": backend, "max_async_steps": 0}))
        with pytest.raises(InvalidArgument) as err:
            resolve_spec(spec(advanced={"generation_backend": backend, "max_async_steps": 1}))
        msg = str(err.value)
        assert msg.startswith("advanced.max_async_steps: 1 needs the vLLM (rollout server) backend"), msg
        assert "only 0 (synchronous)" in msg and "range 0-4" in msg


def test_every_bad_field_at_once_each_in_its_own_words() -> None:
    alone = {}
    for field, value in (("lora_rank", 99), ("learning_rate", 0.01), ("group_size", 1)):
        with pytest.raises(InvalidArgument) as e:
            resolve_spec(spec(grpo={field: value}))
        alone[f"grpo.{field}"] = str(e.value)
    with pytest.raises(InvalidArgument) as e:
        resolve_spec(spec(grpo={"lora_rank": 99, "learning_rate": 0.01, "group_size": 1},
                          advanced={"temperature": 9.0}))
    assert [f for f, _ in e.value.violations] == ["grpo.group_size", "grpo.lora_rank", "grpo.learning_rate",
                                                  "advanced.temperature"]
    lines = str(e.value).split("\n")
    assert lines[:3] == [alone["grpo.group_size"], alone["grpo.lora_rank"], alone["grpo.learning_rate"]]
    assert [f"{f}: {d}" for f, d in e.value.violations] == lines
    # a check that reads a bad field is skipped, not reported as a second fault of the same value
    with pytest.raises(InvalidArgument) as e:
        resolve_spec(spec(grpo={"group_size": 1, "batch_size": 8}, advanced={"num_processes": 2}))
    assert [f for f, _ in e.value.violations] == ["grpo.group_size"]


def test_the_loop_and_the_evaluation_name_every_bad_field() -> None:
    from rlvr.services.benchmark.planning import check_static
    from rlvr.services.scheduler.loopspec import check_own_fields
    from rlvr.v1 import benchmark_pb2 as B
    from rlvr.v1 import scheduler_pb2 as S

    loop = S.LoopSpec(target=0.0, max_rounds=0, job=spec(grpo={"lora_rank": 99}))
    with pytest.raises(InvalidArgument) as e:
        check_own_fields(loop, 64)
    assert [f for f, _ in e.value.violations] == ["target", "max_rounds", "job.grpo.lora_rank"]
    assert str(e.value).split("\n")[2].startswith("job.grpo.lora_rank: 99 is out of range")
    request = B.RunEvaluationRequest(benchmark="rlvr-math-pairs-heldout", limit=-1,
                                     sampling=C.SamplingParams(temperature=5.0, top_p=2.0))
    with pytest.raises(InvalidArgument) as e:
        check_static(request)
    assert [f for f, _ in e.value.violations] == ["limit", "sampling.temperature", "sampling.top_p"]
    controls = B.RunEvaluationRequest(benchmark="rlvr-math-pairs-heldout",
                                      sampling=C.SamplingParams(top_k=-1, min_p=2.0, repetition_penalty=3.0))
    with pytest.raises(InvalidArgument) as e:
        check_static(controls)
    assert [f for f, _ in e.value.violations] == ["sampling.top_k", "sampling.min_p", "sampling.repetition_penalty"]


def test_epsilon_high_defaults_to_the_symmetric_clip_and_reaches_the_summary() -> None:
    from rlvr.clients.views.jobs import summary_lines

    r = resolve_spec(C.JobSpec())
    assert r.spec.advanced.epsilon_high == pytest.approx(0.2)
    inactive = "(inactive)"
    assert dict(r.summary.settings) == {"advanced.epsilon_high": f"0.2 {inactive}", "advanced.num_iterations": "1",
                                        "advanced.mini_batches": "1", "advanced.mask_truncated_completions": "off",
                                        "advanced.eval_every": "0"}
    # one optimizer step per batch: clip-higher is shown inactive, and the job is told it changes nothing
    on_policy = resolve_spec(spec(advanced={"epsilon_high": 0.28}))
    assert f"  Epsilon high    0.28 {inactive}" in summary_lines(on_policy.summary)
    assert any(w.startswith("advanced.epsilon_high 0.28 changes nothing here") for w in on_policy.warnings)
    dapo = resolve_spec(spec(advanced={"epsilon_high": 0.28, "num_iterations": 2}))
    assert "  Epsilon high    0.28" in summary_lines(dapo.summary)
    assert dapo.summary.settings["advanced.epsilon_high"] == "0.28"
    assert not [w for w in dapo.warnings if w.startswith("advanced.")]
    assert resolve_spec(spec(advanced={"epsilon_high": 0.28, "mini_batches": 2})).summary.settings[
        "advanced.epsilon_high"] == "0.28"
    for bad in (0.1, 1.5):
        with pytest.raises(InvalidArgument, match=r"advanced.epsilon_high: .* is out of range; allowed: 0.2 to 1 "
                                                   r"\(default 0.2\)"):
            resolve_spec(spec(advanced={"epsilon_high": bad}))


def _fields(job: C.JobSpec, catalog: object = None) -> list[str]:
    """The fields one INVALID_ARGUMENT names for `job`, each once, in its message's order."""
    with pytest.raises(InvalidArgument) as e:
        resolve_spec(job, catalog=catalog)  # type: ignore[arg-type]
    lines = str(e.value).split("\n")
    assert [f"{f}: {d}" for f, d in e.value.violations] == lines  # one line per field, in its own words
    return [f for f, _ in e.value.violations]


def _too_long() -> C.JobSpec:
    job = spec(grpo={"lora_rank": 99}, advanced={"gpu_selection": "0," * 40})
    job.name, job.init_adapter.path = "n" * 129, "/a" * 600
    return job


def _too_many_terms() -> C.JobSpec:
    job = spec(grpo={"lora_rank": 99})
    job.reward.terms.extend(C.RewardTerm(key=f"r{i}") for i in range(9))
    return job


def _bad_terms() -> C.JobSpec:
    job = C.JobSpec()
    job.reward.terms.extend([C.RewardTerm(key="Bad Key"), C.RewardTerm(key="length", weight=500.0),
                             C.RewardTerm(key="length")])
    return job


@pytest.mark.parametrize("job,fields", [
    # every string over its limit, and what is bad besides (a field too long is not read again)
    (_too_long(), ["name", "advanced.gpu_selection", "init_adapter.path", "grpo.lora_rank"]),
    (_too_many_terms(), ["reward.terms", "grpo.lora_rank"]),
    # the terms: a key of the wrong shape, a weight out of range, a key named twice
    (_bad_terms(), ["reward.terms[0].key", "reward.terms[1].weight", "reward.terms[2].key"]),
    (spec(reward={"function": 99, "key": "Not A Key"}), ["reward.function", "reward.key"]),
    # the reward's data fields, once its terms are good
    (spec(reward={"accuracy_key": "nope", "synthetic_prompts": 1}), ["reward.accuracy_key",
                                                                     "reward.synthetic_prompts"]),
    # the processes: both counts out of range; two options that do not run across processes
    (spec(advanced={"num_processes": 99, "num_nodes": 99}), ["advanced.num_processes", "advanced.num_nodes"]),
    (spec(grpo={"batch_size": 16}, advanced={"num_processes": 2, "dynamic_sampling": True, "max_async_steps": 1}),
     ["advanced.dynamic_sampling", "advanced.max_async_steps"]),
], ids=["sizes", "terms-count", "terms", "function-and-key", "reward-data", "process-counts", "across-processes"])
def test_every_bad_field_at_once_on_every_path(job: C.JobSpec, fields: list[str]) -> None:
    """The paths whose fields depend on one another still name every bad field they reach."""
    assert _fields(job) == fields


def test_every_reward_the_reward_service_lacks_is_named() -> None:
    from rlvr.rewards.registry import Catalog, load_registry

    catalog = Catalog(rewards=dict(load_registry().rewards))
    job = C.JobSpec()
    job.reward.terms.extend([C.RewardTerm(key="no_such_reward"), C.RewardTerm(key="nor_this_one")])
    assert _fields(job, catalog) == ["reward.terms[0].key", "reward.terms[1].key"]


def test_the_sampling_controls_default_off_and_name_their_range_when_bad() -> None:
    a = resolve_spec(C.JobSpec()).spec.advanced
    assert (a.top_p, a.top_k, a.min_p, a.repetition_penalty) == (1.0, 0, 0.0, 1.0)
    set_ = resolve_spec(spec(advanced={"top_p": 0.9, "top_k": 50, "min_p": 0.05, "repetition_penalty": 1.1})).spec
    assert (set_.advanced.top_k, round(set_.advanced.top_p, 6), round(set_.advanced.repetition_penalty, 6)) == \
        (50, 0.9, 1.1)
    bad = {"top_p": 0.0, "top_k": 1001, "min_p": 1.5, "repetition_penalty": 0.0}
    assert _fields(spec(advanced=bad)) == [f"advanced.{name}" for name in bad]
    allowed = {"top_p": r"0.01 to 1 \(default 1\)", "top_k": r"0-1000 \(default 0\)",
               "min_p": r"0 to 1 \(default 0\)", "repetition_penalty": r"0.5 to 2 \(default 1\)"}
    for name, value in {**bad, "top_k": -1, "top_p": 1.01, "repetition_penalty": 2.5}.items():
        with pytest.raises(InvalidArgument, match=rf"advanced.{name}: .* is out of range; allowed: {allowed[name]}"):
            resolve_spec(spec(advanced={name: value}))


def test_reshaped_sampling_on_the_transformers_backend_warns_that_the_loss_is_not_corrected() -> None:
    quiet = resolve_spec(spec(advanced={"generation_backend": C.GENERATION_BACKEND_TRANSFORMERS}))
    assert not any("importance-corrected" in w for w in quiet.warnings)
    job = spec(advanced={"generation_backend": C.GENERATION_BACKEND_TRANSFORMERS, "top_k": 20})
    assert any(w.startswith("advanced.top_k 20: ") and "not importance-corrected" in w
               for w in resolve_spec(job).warnings)
    vllm = resolve_spec(spec(advanced={"top_k": 20}))
    assert not any("importance-corrected" in w for w in vllm.warnings)


def test_rlvr_eval_run_sends_the_sampling_controls() -> None:
    from rlvr.clients.cli import build_parser
    from rlvr.clients.commands import eval as eval_cmd

    args = build_parser().parse_args(["eval", "run", "--benchmark", "x", "--top-k", "4", "--min-p", "0.1",
                                      "--repetition-penalty", "1.2"])
    sp = eval_cmd.run_request(args).sampling
    assert (sp.top_k, round(sp.min_p, 6), round(sp.repetition_penalty, 6)) == (4, 0.1, 1.2)
    plain = eval_cmd.run_request(build_parser().parse_args(["eval", "run", "--benchmark", "x"])).sampling
    assert (plain.top_k, plain.min_p, plain.repetition_penalty) == (0, 0.0, 0.0)  # unset: off, greedy stays greedy


def test_updates_per_step_and_the_loss_families_are_checked_together() -> None:
    # each loss family that bounds its ratio its own way refuses a clip-higher it would ignore
    for loss, words in ((C.LOSS_TYPE_GSPO, "3e-4"), (C.LOSS_TYPE_CISPO, "at 5"), (C.LOSS_TYPE_SAPO, "smoothly")):
        with pytest.raises(InvalidArgument, match=rf"advanced.epsilon_high: 0.28 applies to the grpo, dapo, dr_grpo "
                                                  rf"losses only; .*{words}"):
            resolve_spec(spec(advanced={"loss_type": loss, "epsilon_high": 0.28, "num_iterations": 2}))
        family = resolve_spec(spec(advanced={"loss_type": loss}))
        name = C.LossType.Name(loss).removeprefix("LOSS_TYPE_").lower()
        assert family.summary.loss_type == name
        assert family.summary.settings["advanced.epsilon_high"] == "0.2 (inactive)"
        # at one update a step the ratio is 1: the family trains as its on-policy twin, and says so
        assert any(w.startswith(f"advanced.loss_type {name} trains as ") for w in family.warnings)
        assert not [w for w in resolve_spec(spec(advanced={"loss_type": loss, "num_iterations": 2})).warnings
                    if w.startswith("advanced.")]
    # mini_batches must divide each process's share of the batch; every bad field in one error
    assert _fields(spec(grpo={"batch_size": 16, "group_size": 4},
                        advanced={"mini_batches": 3, "num_iterations": 9, "loss_type": C.LOSS_TYPE_CISPO,
                                  "epsilon_high": 0.3})) == [
        "advanced.num_iterations", "advanced.epsilon_high", "advanced.mini_batches"]
    with pytest.raises(InvalidArgument, match=r"advanced.mini_batches: 8 does not divide the 4 completions each "
                                              r"process trains per step \(grpo.batch_size 16 over 4 processes\); "
                                              r"allowed here: 1, 2, 4"):
        resolve_spec(spec(grpo={"batch_size": 16, "group_size": 4},
                          advanced={"mini_batches": 8, "num_processes": 4, "gpu_selection": "cpu"}))
    for field, bad in (("num_iterations", 0), ("mini_batches", 17)):
        with pytest.raises(InvalidArgument, match=rf"advanced.{field}: {bad} is out of range"):
            resolve_spec(spec(advanced={field: bad}))
    masked = resolve_spec(spec(advanced={"mask_truncated_completions": True, "num_iterations": 3}))
    assert masked.summary.settings["advanced.mask_truncated_completions"] == "on"
    assert masked.summary.settings["advanced.num_iterations"] == "3"


def test_evaluation_while_training_is_checked_against_the_job() -> None:
    on = resolve_spec(spec(advanced={"eval_every": 10}))
    assert (on.spec.advanced.eval_every, on.spec.advanced.eval_size) == (10, 64)
    assert on.summary.settings["advanced.eval_every"] == "10"
    assert _fields(spec(advanced={"eval_every": -1, "eval_size": 4})) == ["advanced.eval_every", "advanced.eval_size"]
    # more than the reward's held-out pool (Math Pairs makes 500) is refused at submit, not at the job's start
    with pytest.raises(InvalidArgument, match=r"advanced.eval_size: 600 is out of range; allowed: 8-500: Math Pairs "
                                              r"\(synthetic\)'s held-out split has 500 problems"):
        resolve_spec(spec(advanced={"eval_every": 5, "eval_size": 600}))
    assert resolve_spec(spec(advanced={"eval_size": 600})).spec.advanced.eval_size == 600  # off: not checked
    with pytest.raises(InvalidArgument, match=r"advanced.eval_every: 5 runs in a job of one process; this job has 2 "):
        resolve_spec(spec(grpo={"batch_size": 16}, advanced={"eval_every": 5, "num_processes": 2,
                                                             "gpu_selection": "cpu"}))
