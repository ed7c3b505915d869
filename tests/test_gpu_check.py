"""bench/gpu_check.py's CPU-side parts: the model it builds (at the small size), its arguments, its
table, and the refusal on a host without CUDA. The check itself runs on a GPU host (make gpu-check)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gpu_check  # noqa: E402  (bench/gpu_check.py)


def test_the_small_model_is_a_loadable_qwen2_whose_every_id_decodes(tmp_path: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path, params = gpu_check.build_model(tmp_path / "m", "small")
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "qwen2" and config.vocab_size == gpu_check.SMALL["vocab_size"]
    model = AutoModelForCausalLM.from_pretrained(path)
    assert params == sum(p.numel() for p in model.parameters())
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert len(tokenizer) == config.vocab_size  # grown to the model's vocabulary: nothing undecodable
    assert all(tokenizer.decode([i]) for i in range(1, config.vocab_size))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=True)
    assert out.shape[1] > len(ids)


def test_the_qwen_shape_is_qwen25_05b() -> None:
    from transformers import Qwen2Config

    shape = gpu_check.QWEN25_05B
    config = Qwen2Config(**shape)
    head = shape["hidden_size"] // shape["num_attention_heads"]
    embed = shape["vocab_size"] * shape["hidden_size"]
    layer = (shape["hidden_size"] * head * (shape["num_attention_heads"] + 2 * shape["num_key_value_heads"])
             + head * (shape["num_attention_heads"] + 2 * shape["num_key_value_heads"])  # q, k, v (+ bias)
             + shape["num_attention_heads"] * head * shape["hidden_size"]  # o
             + 3 * shape["hidden_size"] * shape["intermediate_size"] + 2 * shape["hidden_size"])
    total = embed + config.num_hidden_layers * layer + shape["hidden_size"]
    assert 490e6 < total < 500e6  # Qwen2.5-0.5B: 494M parameters, tied embeddings


@pytest.mark.parametrize(("argv", "message"), [
    (["--parts", "model,bogus"], "--parts: unknown bogus"),
    (["--steps", "2", "--skip", "2"], "--skip < --steps"),
    (["--batch-size", "12", "--group-size", "8"], "multiple of --group-size"),
    (["--memory", "0.6"], "--memory must be in"),
    (["--max-tokens", "16"], "--max-tokens must be 32-2048"),
])
def test_bad_arguments_are_refused_naming_the_flag(argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    args = gpu_check.parse_args([])
    assert args.parts == list(gpu_check.PARTS) and args.budget == 480 and args.steps == 10


def test_the_table_has_one_line_per_part_with_status_and_value() -> None:
    rows = [gpu_check.Row("model", "random Qwen2 model built locally", value="494M parameters", seconds=12.34),
            gpu_check.Row("trl", "bench/trainer_step.py: TRL GRPOTrainer", status="skipped",
                          detail="the 480 s budget is spent")]
    lines = gpu_check.format_table(rows, "header line").splitlines()
    assert lines[0] == "header line" and lines[1].split()[:5] == ["part", "what", "status", "value", "s"]
    assert lines[3].startswith("model") and "494M parameters" in lines[3] and "12.3" in lines[3]
    assert lines[4].startswith("trl") and "skipped" in lines[4] and lines[4].endswith("the 480 s budget is spent")
    assert gpu_check.median_range([3.0, 1.0, 2.0]) == "2.000 [1.000-3.000]" and gpu_check.median_range([]) == "-"


def test_without_cuda_it_says_so_and_exits_2_before_building_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "check.json"
    assert gpu_check.main(["--work", str(tmp_path / "work"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs one CUDA GPU" in err and "sees no CUDA device" in err
    assert not out.exists() and not (tmp_path / "work").exists()


def test_parts_past_the_budget_or_without_their_prerequisite_are_skipped_rows(tmp_path: Path) -> None:
    args = gpu_check.parse_args(["--parts", "job-vllm,trl", "--budget", "1"])
    check = gpu_check.Check(args, tmp_path)
    ran: list[str] = []
    check.run("job-vllm", "job", lambda row: ran.append("job-vllm"))
    check.run("model", "not asked for", lambda row: ran.append("model"))
    check.started -= 5  # the budget is spent
    check.run("trl", "trl", lambda row: ran.append("trl"))
    assert ran == [] and [(r.part, r.status) for r in check.rows] == [("job-vllm", "skipped"), ("trl", "skipped")]
    assert "no model" in check.rows[0].detail and "budget is spent" in check.rows[1].detail
    json.dumps([vars(r) for r in check.rows])  # the JSON the check writes


def test_the_fsdp_part_needs_two_devices_and_skips_on_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check = gpu_check.Check(gpu_check.parse_args(["--parts", "job-fsdp"]), tmp_path)
    check.model = tmp_path / "model"  # never read: the part stops before it launches anything
    check.run("job-fsdp", "2-process bf16 job, FSDP against DDP", check.part_fsdp)
    (row,) = check.rows
    assert (row.part, row.status) == ("job-fsdp", "skipped") and "needs 2 CUDA devices" in row.detail
    assert "this host has 1" in row.detail and not (tmp_path / "sharded").exists()
