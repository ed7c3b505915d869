"""The grouped CPU LoRA ops (`rlvr.vllm_lora_ops`) compute what vLLM's own per-token ops compute,
for every call shape the CPU punica wrapper makes: one adapter slot or several in a batch, the -1
marker, the slot dimension of 3-d and 4-d stacks, add or overwrite, slices and padded outputs, and
slots padded with zeros past the adapter's rank or all zero."""

from __future__ import annotations

import pytest
import torch

lora_ops = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")  # the CPU build's ops

# vLLM's originals: the package's own names, bound before install() replaced lora_ops' functions.
from vllm.lora.ops import torch_ops as original  # noqa: E402

from rlvr import vllm_lora_ops as grouped  # noqa: E402  (after the skip: it patches vLLM when present)

SLOT_CASES = {"one slot": [2] * 7, "one padded slot": [0] * 7, "the zero slot": [1] * 7,
              "three slots": [0, 2, 2, 1, 0, 2, 1], "the -1 marker": [-1, 0, -1, 1, 1, 0, 0]}


def _weights(slots: int, out: int, inner: int, four_d: bool) -> torch.Tensor:
    """Stacked slots as vLLM holds them: slot 0 a rank-3 adapter zero-padded (rows and columns past 3),
    slot 1 all zeros (the zero base LoRA), the others full."""
    w = torch.randn(slots, out, inner)
    w[0, 3:, :], w[0, :, 3:] = 0.0, 0.0
    w[1] = 0.0
    return w.unsqueeze(1) if four_d else w


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_installed_in_vllms_modules() -> None:
    from vllm.lora.punica_wrapper import punica_cpu

    assert grouped.install()
    assert lora_ops.bgmv_shrink is grouped.bgmv_shrink and punica_cpu.bgmv_expand is grouped.bgmv_expand
    assert original.bgmv_shrink is not grouped.bgmv_shrink  # the reference below is vLLM's own


def test_a_queue_reader_spins_no_longer_than_the_cap_and_still_wakes_on_a_write(tmp_path) -> None:  # noqa: ANN001
    """vLLM's worker spins 1 s for its next instruction (SpinCondition.busy_loop_s) before it sleeps
    on the writer's notification; capped, it sleeps at once, and a write still wakes it."""
    import threading
    import time

    import zmq
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    context, address = zmq.Context(), f"ipc://{tmp_path}/notify"
    try:
        assert grouped.shorten_idle_spin(0.0)
        writer = SpinCondition(is_reader=False, context=context, notify_address=address)
        reader = SpinCondition(is_reader=True, context=context, notify_address=address)
        assert reader.busy_loop_s == 0.0 and writer.busy_loop_s == 0
        time.sleep(0.2)  # the subscription reaches the publisher
        reader.record_read()  # a read just now: with vLLM's 1 s it would spin, not sleep
        notify = threading.Timer(0.3, writer.notify)
        notify.start()
        started = time.monotonic()
        reader.wait(timeout_ms=5_000)  # sleeps on the socket until the write's notification
        waited = time.monotonic() - started
        notify.join()  # the reader can wake while the writer's send is still in the timer's thread:
        # closing its socket then (below) aborted the process in libzmq (a full run lost its worker)
        assert 0.2 < waited < 4.0, waited  # woken by the notification, not by the timeout nor at once
        assert grouped.shorten_idle_spin(1.0)  # patching again replaces the cap (no stacking)
        assert SpinCondition(is_reader=True, context=context, notify_address=address).busy_loop_s == 1.0
        for s in (reader, writer):
            s.local_notify_socket.close(linger=0)
            if s.read_cancel_socket is not None:
                s.read_cancel_socket.close(linger=0)
                s.write_cancel_socket.close(linger=0)
    finally:
        grouped.shorten_idle_spin(1.0)  # vLLM's own in this (test) process
        context.term()


PLUGIN_CASES = [("VllmWorker-0", True, 0.05), ("EngineCore_DP0", True, 0.25), ("VllmWorker-0", False, 1.0),
                ("EngineCore_DP0", False, 1.0)]

# Loads the plugin as vLLM does, in a process of its own named for its role; prints each case's cap.
_PLUGIN_CHILD = """
import json, multiprocessing, os, sys, tempfile
import zmq
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
from rlvr import vllm_lora_ops as grouped
caps = []
for process, ours in json.loads(sys.argv[1]):
    multiprocessing.current_process().name = process
    os.environ.pop(grouped.ENGINE_MARK, None)
    if ours:
        os.environ[grouped.ENGINE_MARK] = "1"
    grouped.shorten_idle_spin(1.0)  # vLLM's own before each case
    grouped.vllm_plugin()
    context = zmq.Context()
    reader = SpinCondition(is_reader=True, context=context, notify_address="ipc://" + tempfile.mktemp())
    caps.append(reader.busy_loop_s)
    for socket in (reader.local_notify_socket, reader.read_cancel_socket, reader.write_cancel_socket):
        socket.close(linger=0)
    context.term()
print(json.dumps(caps))
"""


@pytest.fixture(scope="module")
def plugin_caps() -> list[float]:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RLVR_VLLM_WORKER_SPIN_S"} | {"RLVR_VLLM_IDLE_SPIN_S": "0.25"}
    cases = json.dumps([[process, ours] for process, ours, _ in PLUGIN_CASES])
    done = subprocess.run([sys.executable, "-c", _PLUGIN_CHILD, cases], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("case", "process", "ours", "expected"), [(i, *c) for i, c in enumerate(PLUGIN_CASES)])
def test_the_vllm_plugin_caps_each_process_by_its_role(plugin_caps: list[float], case: int, process: str,
                                                       ours: bool, expected: float) -> None:
    """Registered as vLLM's general plugin (loaded in the engine core and in each worker): the
    worker's cap is RLVR_VLLM_WORKER_SPIN_S (default 0.05), the engine core's RLVR_VLLM_IDLE_SPIN_S;
    in an engine rlvr did not build (no ENGINE_MARK: a user's own vLLM beside rlvr) vLLM's 1 s stays.
    Each case runs in a fresh process named for its role, as vLLM loads the plugin, so no state of
    the test process (an earlier test's vLLM, its platform, its patches) takes part."""
    from importlib.metadata import entry_points

    assert any(e.value == "rlvr.vllm_lora_ops:vllm_plugin" for e in entry_points(group="vllm.general_plugins"))
    assert plugin_caps[case] == expected, (process, ours, plugin_caps)


@pytest.mark.parametrize("indices", SLOT_CASES.values(), ids=SLOT_CASES.keys())
@pytest.mark.parametrize("four_d", [False, True])
def test_shrink(indices: list[int], four_d: bool) -> None:
    x, w, idx = torch.randn(7, 32), _weights(3, 8, 32, four_d), torch.tensor(indices)
    want, got = torch.zeros(7, 8), torch.zeros(7, 8)
    original.bgmv_shrink(x, w, want, idx, 0.5)
    grouped.bgmv_shrink(x, w, got, idx, 0.5)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("indices", SLOT_CASES.values(), ids=SLOT_CASES.keys())
@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("out_width", [24, 20, 28])  # the layer's output as wide, narrower or wider (padding)
def test_expand(indices: list[int], add: bool, out_width: int) -> None:
    x, w, idx = torch.randn(7, 8), _weights(3, 24, 8, True), torch.tensor(indices)
    start = torch.randn(7, out_width)
    want, got = start.clone(), start.clone()
    original.bgmv_expand(x, w, want, idx, add)
    grouped.bgmv_expand(x, w, got, idx, add)
    torch.testing.assert_close(got, want)


def test_expand_one_row_into_many() -> None:
    """vLLM's broadcast case: a single output row (one token) written into a taller output."""
    x, w, idx = torch.randn(1, 8), _weights(2, 16, 8, False), torch.tensor([1])
    start = torch.randn(4, 16)
    want, got = start.clone(), start.clone()
    original.bgmv_expand(x, w, want, idx, True)
    grouped.bgmv_expand(x, w, got, idx, True)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("indices", SLOT_CASES.values(), ids=SLOT_CASES.keys())
@pytest.mark.parametrize("add", [False, True])
def test_expand_slice(indices: list[int], add: bool) -> None:
    x, w, idx = torch.randn(7, 8), _weights(3, 16, 8, True), torch.tensor(indices)
    start = torch.randn(7, 48)
    want, got = start.clone(), start.clone()
    original.bgmv_expand_slice(x, w, want, idx, 16, 16, add)
    grouped.bgmv_expand_slice(x, w, got, idx, 16, 16, add)
    torch.testing.assert_close(got, want)


def test_sgmv_prefill_goes_through_the_grouped_ops() -> None:
    """The prefill path (sgmv_*) calls the bgmv_* functions by their module names: patched too."""
    x, w = torch.randn(6, 32), _weights(2, 8, 32, True)
    seq_lens, slots = torch.tensor([4, 2]), torch.tensor([1, 0])
    got, want = torch.zeros(6, 8), torch.zeros(6, 8)
    lora_ops.sgmv_shrink(x, w, got, torch.tensor([0, 4]), seq_lens, slots, 2, 4, 6, 1.0)
    original.bgmv_shrink(x, w, want, torch.repeat_interleave(slots, seq_lens), 1.0)
    torch.testing.assert_close(got, want)


def test_a_slot_written_in_place_is_read_again() -> None:
    """vLLM loads an adapter by copying it into its slot in place: the next call multiplies the new
    weights (the skipped zero rows and columns are found again), not the extent of the old ones."""
    x, w, idx = torch.randn(5, 32), _weights(3, 8, 32, True), torch.tensor([0] * 5)
    got = torch.zeros(5, 8)
    grouped.bgmv_shrink(x, w, got, idx, 1.0)  # slot 0: rank 3
    w[0, 0].copy_(torch.randn(8, 32))  # a full-rank adapter into slot 0, as vLLM's set_lora does
    want = torch.zeros(5, 8)
    original.bgmv_shrink(x, w, want, idx, 1.0)
    grouped.bgmv_shrink(x, w, got, idx, 1.0)
    torch.testing.assert_close(got, want)
    w[0].zero_()  # and emptied (reset_lora)
    grouped.bgmv_shrink(x, w, got, idx, 1.0)
    assert not got.any()
