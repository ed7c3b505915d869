"""The generated stubs are the contract's Python face: they must match protos/ exactly."""

from pathlib import Path

from rlvr import protogen
from rlvr.v1 import benchmark_pb2, common_pb2, reward_pb2, rollout_pb2, scheduler_pb2, trainer_pb2

ROOT = Path(__file__).resolve().parent.parent


def test_generated_stubs_are_current(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path)
    assert written, "protoc wrote nothing"
    committed = sorted((ROOT / "rlvr" / "v1").glob("*_pb2*.py*"))
    assert [p.name for p in written] == [p.name for p in committed], "stub files differ from protos/"
    stale = [p.name for p in written if p.read_bytes() != (ROOT / "rlvr" / "v1" / p.name).read_bytes()]
    assert not stale, f"stale stubs, run `make protos`: {stale}"


def test_one_proto_per_service_plus_common() -> None:
    services = {
        name
        for module in (scheduler_pb2, trainer_pb2, rollout_pb2, reward_pb2, benchmark_pb2)
        for name in module.DESCRIPTOR.services_by_name
    }
    assert services == {
        "SchedulerService",
        "TrainerService",
        "RolloutService",
        "RewardService",
        "BenchmarkService",
    }
    assert not common_pb2.DESCRIPTOR.services_by_name


def test_job_spec_covers_every_spec_field() -> None:
    """Every field of the spec's Reward Function card, GRPO card and Advanced Options."""
    fields = {
        "RewardConfig": {"function", "synthetic_prompts", "format_bonus", "dataset"},
        "GrpoConfig": {
            "group_size",
            "max_completion_tokens",
            "lora_rank",
            "lora_alpha",
            "learning_rate",
            "max_steps",
            "batch_size",
        },
        "AdvancedOptions": {
            "loss_type",
            "epochs",
            "quantization",
            "generation_backend",
            "gpu_memory_fraction",
            "gpu_selection",
        },
        "TrainingSummary": {
            "method",
            "model",
            "reward",
            "group_size",
            "max_completion",
            "gpu_selection",
            "lora_rank",
            "learn_rate",
            "max_steps",
            "backend",
        },
    }
    for message, names in fields.items():
        have = set(common_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name)
        assert names <= have, f"{message} lacks {names - have}"
    loop_statuses = {v.name for v in scheduler_pb2.DESCRIPTOR.enum_types_by_name["LoopStatus"].values}
    for status in (
        "QUEUED",
        "TRAINING",
        "BENCHMARKING",
        "TARGET_REACHED",
        "ROUNDS_SPENT",
        "PLATEAUED",
        "FAILED",
        "STOPPED",
    ):
        assert f"LOOP_STATUS_{status}" in loop_statuses
