"""bench/repeats.py, what every benchmark the docs quote prints (the median and the range of at
least three runs), and that each of those benches refuses fewer than three repeats."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from repeats import MIN_REPEATS, Spread, check_repeats, spreads, tally  # noqa: E402  (bench/repeats.py)


def test_the_median_and_range_of_an_odd_and_an_even_count() -> None:
    assert Spread.of([3.0, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0, 3)
    assert Spread.of([4.0, 1.0, 2.0, 10.0]) == Spread(3.0, 1.0, 10.0, 4)  # the middle two's mean, not the mean


def test_runs_without_a_value_are_left_out_and_counted_apart() -> None:
    assert Spread.of([None, 5.0, None, 1.0, 3.0]) == Spread(3.0, 1.0, 5.0, 3)
    assert Spread.of([None, None]) == Spread(None, None, None, 0)
    assert Spread.of([]).cell() == "-"


def test_a_cell_is_the_median_then_the_lowest_and_highest() -> None:
    assert Spread.of([0.25, 0.2, 0.3]).cell(2) == "0.25 [0.20-0.30]"
    assert Spread.of([1.23456]).cell(2) == "1.23"  # one value: no range to print
    assert Spread.of([7.5e-9, 1e-4, 2e-5]).cell(fmt=".2g") == "2e-05 [7.5e-09-0.0001]"


def test_a_cell_says_how_many_of_the_repeats_gave_a_value() -> None:
    assert Spread.of([2.0, None, 4.0]).cell(1, of=3) == "3.0 [2.0-4.0] (2 of 3)"
    assert Spread.of([2.0, 3.0, 4.0]).cell(1, of=3) == "3.0 [2.0-4.0]"  # every run did: nothing added
    assert Spread.of([None, None, None]).cell(1, of=3) == "-"


def test_a_spread_comes_back_from_its_json() -> None:
    spread = Spread.of([0.4, None, 0.1, 0.3])
    assert spread.to_json() == {"median": 0.3, "min": 0.1, "max": 0.4, "n": 3}
    assert Spread.from_json(spread.to_json()) == spread


def test_spreads_groups_the_runs_by_configuration_in_the_order_first_seen() -> None:
    rows: list[dict[str, float | None]] = [{"n": 2, "s": 0.5}, {"n": 1, "s": 0.1}, {"n": 2, "s": 0.9},
                                           {"n": 1, "s": None}, {"n": 2, "s": 0.7}, {"n": 1}]
    got = spreads(rows, "s", by="n")
    assert list(got) == [2, 1]
    assert got[2] == Spread(0.7, 0.5, 0.9, 3)
    assert got[1] == Spread(0.1, 0.1, 0.1, 1)
    assert got[1].cell(1, of=3) == "0.1 (1 of 3)"


def test_spreads_keeps_every_named_configuration_first_even_without_a_run() -> None:
    rows = [{"n": 2, "s": 0.5}, {"n": 3, "s": 0.2}]  # configuration 1: none of its runs was kept
    got = spreads(rows, "s", by="n", configs=[1, 2])
    assert list(got) == [1, 2, 3]
    assert got[1] == Spread(None, None, None, 0) and got[1].cell(2, of=3) == "-"
    assert got[2] == Spread(0.5, 0.5, 0.5, 1)


def test_tally_counts_the_passes_of_all_runs() -> None:
    assert tally([True, False, True]) == "2/3 ok"
    assert tally(iter([False, False, False]), "same") == "0/3 same"
    assert tally([]) == "0/0 ok"


def test_check_repeats_refuses_fewer_than_three_and_non_numbers() -> None:
    assert MIN_REPEATS == 3
    assert check_repeats("3") == 3 and check_repeats("7") == 7
    for bad in ("2", "0", "-1", "three", "2.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            check_repeats(bad)


# Every bench whose figures the docs quote, with the arguments it needs besides --repeats.
BENCHES = {
    "trainer_step": [], "rollout_throughput": [], "sampler_gap": [], "multinode": [], "scale": [], "faults": [],
    "replicas": [], "folder_fetch": [], "step_path": [], "dispatch": [], "eval_throughput": [], "rollout_gap": [],
    "local_sampling": [], "job_start": [], "agent_gateway": [],
    "sharded_job": ["--model", "m", "--sharding", "ddp", "--out", "x.json"],
}


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_each_quoted_bench_takes_at_least_three_repeats_by_default_and_refuses_two(
        name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # replicas.py sets it on import: restored after
    bench = importlib.import_module(name)
    assert bench.parse_args(BENCHES[name]).repeats >= MIN_REPEATS
    assert bench.parse_args([*BENCHES[name], "--repeats", "4"]).repeats == 4
    with pytest.raises(SystemExit) as refused:
        bench.parse_args([*BENCHES[name], "--repeats", "2"])
    assert refused.value.code == 2
    assert "--repeats must be at least 3" in capsys.readouterr().err


def test_folder_fetch_refuses_a_big_file_the_resumed_row_cannot_cut(capsys: pytest.CaptureFixture[str]) -> None:
    folder_fetch = importlib.import_module("folder_fetch")
    assert folder_fetch.parse_args(["--mib", "2"]).mib == 2
    for bad in ("1", "0"):
        with pytest.raises(SystemExit):
            folder_fetch.parse_args(["--mib", bad])
    assert "--mib must be at least 2" in capsys.readouterr().err


def test_sharded_job_takes_both_shardings_to_compare_but_launches_one_each() -> None:
    sharded_job = importlib.import_module("sharded_job")
    base = ["--model", "m", "--out", "x.json"]
    assert sharded_job.parse_args([*base, "--sharding", "fsdp,ddp"]).shardings == ["fsdp", "ddp"]
    assert sharded_job.parse_args([*base, "--sharding", "ddp"]).shardings == ["ddp"]
    for bad in (["--sharding", "zero"], ["--sharding", "ddp,ddp"], ["--sharding", "ddp,fsdp", "--rank"]):
        with pytest.raises(SystemExit):
            sharded_job.parse_args([*base, *bad])


def test_agent_gateway_reports_the_endpoints_overhead_over_the_direct_turn() -> None:
    bench = importlib.import_module("agent_gateway")
    direct = bench.PathRun(seconds=[1.0] * 4, sample_s=[1.0] * 4, tokens=[30] * 4)
    endpoint = bench.PathRun(seconds=[1.05] * 4, sample_s=[1.0] * 4, tokens=[30] * 4, same_ids=4, episode_s=[4.3])
    pieces = {"call_s": 0.004, "recorder_s": 0.0002, "prompt_render_s": 0.0001, "after_turn_s": 0.0001,
              "client_s": 0.03}
    table = bench.summarise([{"direct": direct, "endpoint": endpoint}] * 3, [pieces] * 3)
    assert table["endpoint"]["overhead_median"]["median"] == pytest.approx(0.05)
    assert table["endpoint"]["overhead_total"]["median"] == pytest.approx(4.3 / 4 - 1)  # the set-up counted
    assert table["endpoint"]["setup_median_s"]["median"] == pytest.approx(0.1)
    assert bench.meets_target(table)
    text = "\n".join(bench.report(table, calls=4))
    assert "| +5.0% [+5.0..+5.0] | +5.0% [+5.0..+5.0] | +7.5% [+7.5..+7.5] | 30.0 [30.0-30.0] | 4/4 |" in text
    assert "| endpoint | 1000.0 [1000.0-1000.0] | 50.00 [50.00-50.00] | 100.0 [100.0-100.0] |" in text
    endpoint.seconds = [1.2] * 4
    assert not bench.meets_target(bench.summarise([{"direct": direct, "endpoint": endpoint}] * 3, [pieces] * 3))
