"""`rlvr train` and `rlvr jobs` against a real scheduler process (no trainer: jobs stay queued)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_bootstrap import _free_port, _wait_serving


@pytest.fixture(scope="module")
def scheduler(nats_server, tmp_path_factory: pytest.TempPathFactory):
    port = _free_port()
    home = tmp_path_factory.mktemp("sched")
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.services.scheduler.main", "--port", str(port),
                             "--database-url", f"sqlite:///{home / 'db.sqlite'}", "--nats-url", nats_server.url,
                             "--artifact-root", str(home / "artifacts"), "--trainer-addresses", "127.0.0.1:1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_serving(f"127.0.0.1:{port}")
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


def rlvr(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlvr.clients.cli", *args], capture_output=True, text=True, timeout=60)


def test_dry_run_prints_the_training_summary(scheduler: str) -> None:
    out = rlvr("train", "--dry-run", "--address", scheduler, "--group-size", "8", "--batch-size", "4",
               "--backend", "transformers", "--rank", "16")
    assert out.returncode == 0, out.stderr
    for line in ("Method          RLVR (GRPO)", "Reward          Math Pairs (synthetic)", "Group Size      8",
                 "LoRA Rank       16", "Backend         Transformers (in-process)", "Batch Size      8",
                 "Max Steps       100", "Learn Rate      1e-06"):
        assert line in out.stdout, out.stdout
    assert "warning: grpo.batch_size 4 rounded up to 8, a multiple of grpo.group_size 8" in out.stdout
    assert "queued" not in out.stdout
    dapo = rlvr("train", "--dry-run", "--address", scheduler, "--epsilon-high", "0.28", "--num-iterations", "2",
                "--mini-batches", "2", "--mask-truncated", "--loss-type", "dapo")
    assert dapo.returncode == 0, dapo.stderr
    for line in ("Epsilon high    0.28\n", "Iterations      2", "Mini-batches    2", "Mask truncated  on",
                 "Loss Type       dapo"):
        assert line in dapo.stdout, dapo.stdout


def test_an_sft_dry_run_prints_its_summary_and_refuses_what_sft_cannot_read(scheduler: str) -> None:
    """The scheduler's data roots are its folder, the repository: the bundled chats are under them."""
    out = rlvr("train", "--dry-run", "--address", scheduler, "--method", "sft", "--sft-dataset",
               "examples/sft/math-pairs", "--sft-lr", "1e-4", "--sft-max-steps", "40", "--max-seq-length", "256",
               "--target-modules", "q_proj,v_proj", "--packing", "--no-completion-only-loss")
    assert out.returncode == 0, out.stderr
    for line in ("Method          Supervised (SFT)", "Dataset         examples/sft/math-pairs", "Learning Rate   0.0001",
                 "Max Steps       40", "Max sequence length 256", "Target modules  q_proj,v_proj", "Packing         on",
                 "Completion-only loss off"):
        assert line in out.stdout, out.stdout
    assert "Group Size" not in out.stdout and "warning" not in out.stdout
    bad = rlvr("train", "--dry-run", "--address", scheduler, "--method", "sft", "--sft-dataset",
               "rlvr/data/gsm8k/test.jsonl", "--sft-lr", "0.5")
    assert bad.returncode != 0
    assert "sft.learning_rate: 0.5 is out of range; allowed: 1e-06 to 0.001 (default 0.0002)" in bad.stderr, bad.stderr
    none = rlvr("train", "--dry-run", "--address", scheduler, "--method", "sft")
    assert "sft.dataset: required for a Supervised (SFT) job" in none.stderr, none.stderr
    columns = rlvr("train", "--dry-run", "--address", scheduler, "--method", "sft", "--sft-dataset",
                   "rlvr/data/gsm8k/test.jsonl")
    assert "has no 'prompt' and 'completion' or 'messages' column, which method SFT trains on" in columns.stderr
    stacked = rlvr("train", "--dry-run", "--address", scheduler, "--name", "after sft", "--init-adapter", "job-nosuch")
    assert stacked.returncode != 0
    assert "init_adapter.name: 'job-nosuch' is not the adapter of a job" in stacked.stderr, stacked.stderr


def test_a_head_dry_run_prints_its_summary_and_refuses_every_bad_field(scheduler: str) -> None:
    """`rlvr train --method head`: the --head-* flags from the table, --head-task, the RLVR flags it does
    not read dropped with one warning, and every bad field named at once."""
    out = rlvr("train", "--dry-run", "--address", scheduler, "--method", "head", "--head-dataset",
               "examples/head/math-verdicts", "--head-task", "classification", "--head-rank", "0", "--head-lr",
               "1e-3", "--reward-label", "wrong", "--lr", "1e-6")
    assert out.returncode == 0, out.stderr
    for line in ("Method          Head", "Dataset         examples/head/math-verdicts", "Task            classification",
                 "Rank (r)        0", "Learning Rate   0.001", "Reward class    wrong", "Max Steps       Full"):
        assert line in out.stdout, out.stdout
    assert "grpo.learning_rate: ignored: Reinforcement (RLVR)'s" in out.stdout and "method is HEAD" in out.stdout
    bad = rlvr("train", "--dry-run", "--address", scheduler, "--method", "head", "--head-dataset",
               "examples/head/math-verdicts", "--head-lr", "1", "--head-rank", "65", "--label-column", "text",
               "--processes", "3", "--nodes", "2")
    assert bad.returncode != 0
    for text in ("head.learning_rate: 1.0 is out of range; allowed: 1e-06 to 0.01 (default 0.0001)",
                 "head.lora_rank: 65 is out of range; allowed: 0-64 (default 8)",
                 "head.label_column: 'text' is head.text_column too",
                 "head.batch_size: 8 is not a multiple of advanced.num_processes 3",
                 "advanced.num_nodes: not allowed with method HEAD"):
        assert text in bad.stderr, bad.stderr
    label = rlvr("train", "--dry-run", "--address", scheduler, "--method", "head", "--head-dataset",
                 "examples/head/math-verdicts", "--reward-label", "maybe")
    assert "head.reward_label: 'examples/head/math-verdicts' (train) has no class 'maybe'" in label.stderr, label.stderr
    regression = rlvr("train", "--dry-run", "--address", scheduler, "--method", "head", "--head-dataset",
                      "examples/head/math-verdicts", "--head-task", "regression")
    assert "is not a number, which a regression head learns" in regression.stderr, regression.stderr


def test_the_measured_recipe_fills_what_the_flags_leave_unset(scheduler: str) -> None:
    out = rlvr("train", "--dry-run", "--address", scheduler, "--model", "rlvr-tiny-headroom", "--recipe", "--lr", "5e-6")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("measured recipe of rlvr-tiny-headroom (make demo (60 steps"), out.stdout
    assert "grpo.learning_rate" not in out.stdout.splitlines()[0]  # given: not the recipe's
    for line in ("Learn Rate      5e-06", "Batch Size      32", "Loss Type       dapo", "Max Steps       60",
                 "Model           rlvr-tiny-headroom"):
        assert line in out.stdout, out.stdout
    none = rlvr("train", "--dry-run", "--address", scheduler, "--recipe")
    assert none.returncode == 2 and none.stderr == (
        "error: --recipe: no --model given: no measured recipe; models with one: rlvr-tiny-headroom, smollm2-135m\n")


def test_bad_value_names_field_and_range(scheduler: str) -> None:
    out = rlvr("train", "--dry-run", "--address", scheduler, "--lr", "0.01")
    assert out.returncode == 2
    assert "grpo.learning_rate: 0.01 is out of range; allowed: 5e-07 to 1e-05" in out.stderr


def test_every_bad_value_is_listed_one_per_line(scheduler: str) -> None:
    out = rlvr("train", "--dry-run", "--address", scheduler, "--rank", "99", "--lr", "0.01")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: 2 invalid fields:",
        "  grpo.lora_rank: 99 is out of range; allowed: 4-64 (default 8)",
        "  grpo.learning_rate: 0.01 is out of range; allowed: 5e-07 to 1e-05 (default 1e-06)",
    ]


def test_detach_list_show_cancel(scheduler: str) -> None:
    out = rlvr("train", "--detach", "--address", scheduler, "--name", "cli-job", "--max-steps", "5")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.split("job ")[-1].split()[0]
    listed = rlvr("jobs", "list", "--address", scheduler)
    assert job_id in listed.stdout and "QUEUED" in listed.stdout and "cli-job" in listed.stdout
    shown = rlvr("jobs", "show", job_id, "--address", scheduler)
    assert "QUEUED" in shown.stdout and "Max Steps       5" in shown.stdout
    cancelled = rlvr("jobs", "cancel", job_id, "--address", scheduler)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    again = rlvr("jobs", "cancel", job_id, "--address", scheduler)
    assert again.returncode == 1 and "FAILED_PRECONDITION" in again.stderr
    missing = rlvr("jobs", "show", "nosuchjob", "--address", scheduler)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_a_lost_watch_is_one_line_naming_the_queued_job(capfd: pytest.CaptureFixture[str]) -> None:
    """The job is created, then the watch fails (the scheduler restarting): one line with the code
    and how to re-attach, exit 1, no traceback."""
    import grpc
    from cli_fakes import run, serving

    from rlvr.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

    class Restarting(scheduler_pb2_grpc.SchedulerServiceServicer):
        def CreateJob(self, request, context):  # noqa: ANN001, N802
            return scheduler_pb2.CreateJobResponse(job=common_pb2.Job(id="j1"))

        def WatchJob(self, request, context):  # noqa: ANN001, N802
            context.abort(grpc.StatusCode.UNAVAILABLE, "scheduler shutting down")

    with serving(Restarting()) as address:
        code, out, err = run(capfd, "train", "--address", address)
    assert code == 1 and "job j1 queued" in out
    assert err.strip().splitlines() == ["error: watching job j1: UNAVAILABLE: scheduler shutting down; "
                                        "`rlvr jobs watch j1` re-attaches"], err


def test_sharding_flag_sets_the_field() -> None:
    import argparse

    from rlvr.clients.commands.train import add_train_arguments, spec_from_args

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    spec = spec_from_args(parser.parse_args(["--processes", "2", "--sharding", "fsdp"]))
    assert (spec.advanced.num_processes, spec.advanced.sharding) == (2, "fsdp")
    assert spec_from_args(parser.parse_args([])).advanced.sharding == ""  # unset: the spec's default (ddp)
    with pytest.raises(SystemExit):
        parser.parse_args(["--sharding", "zero3"])
