"""``connectors.block_copier``: whole-block KV copies, on CPU.

Both copiers run here on CPU tensors: ``HostCopier`` as in production, and
``DeviceCopier`` (the CUDA path) through ``FakeStreamAPI``, which runs its
copies on CPU tensors and records the stream-ordering calls (stream waits,
event records, entering/leaving stream contexts, host synchronisations) and
every tensor copy with the stream current when it ran. Checked: byte-exact
round trips in several real vLLM KV layouts with mixed dtypes and padded
payload slots, identical payload bytes from both copiers, the ordering
contract of ``copy_out`` / ``copy_in`` / ``fence``, timings, and
``payloads_ready``. The real CUDA semantics (asynchrony, the caching
allocators) are not exercised: no GPU here.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from vllm_continuum_plugin.connectors import block_copier as bc
from vllm_continuum_plugin.connectors import cpu_store

BlockPayload = cpu_store.BlockPayload

NB = 8  # blocks per KV cache tensor


# ----------------------------------------------------------------------
# KV caches in vLLM's layouts
# ----------------------------------------------------------------------
def _kv_caches(nb: int = NB, seed: int = 0) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(name, tensor as vLLM hands it to a connector, block-major view)``
    per layer, in the layouts of ``tests/test_connector.py::_layouts`` (the
    views are what ``kv_offload.block_major_view`` returns for them; that
    module imports vLLM, too slow for this file), with mixed dtypes and
    block sizes that are not multiples of 16 bytes (padded payload slots).
    """
    g = torch.Generator().manual_seed(seed)

    def rand(dtype: torch.dtype, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    out: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    # vLLM 0.32 [B, H, N, C] views of one allocation, layer-outermost:
    # block (2, 4, 8) bf16 = 128 bytes.
    layer_outer = rand(torch.bfloat16, 2, nb, 2, 4, 8)
    for i in range(2):
        out.append((f"layer-outer.{i}", layer_outer[i], layer_outer[i]))
    # ... block-outermost (a block's stride spans both layers): block
    # (2, 3, 5) fp16 = 60 bytes, padded to 64.
    block_outer = rand(torch.float16, nb, 2, 2, 3, 5)
    for i in range(2):
        out.append((f"block-outer.{i}", block_outer[:, i], block_outer[:, i]))
    # legacy [2, B, N, H*D]: block (2, 3, 7) fp32 = 168 bytes, padded to 176.
    legacy = rand(torch.float32, 2, nb, 3, 7)
    out.append(("legacy", legacy, legacy.movedim(1, 0)))
    # kernel blocks [B * 2, ...]: block (2, 3, 5) bf16 = 60 bytes -> 64.
    split = rand(torch.bfloat16, nb * 2, 3, 5)
    out.append(("kernel-blocks", split, split.unflatten(0, (nb, 2))))
    return out


# Offsets the 16-byte packing must produce for _kv_caches (hand computed).
EXPECTED_OFFSETS = [0, 128, 256, 320, 384, 560]
EXPECTED_BLOCK_NBYTES = 624


def _slots(caches: list[tuple[str, torch.Tensor, torch.Tensor]]) -> tuple[list[Any], int]:
    return bc.pack_layer_slots((name, view) for name, _, view in caches)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (any layout), flattened."""
    return t.contiguous().view(torch.uint8).reshape(-1).clone()


def _snapshot(slots: list[Any]) -> list[list[torch.Tensor]]:
    return [[_bytes(s.view[b]) for b in range(NB)] for s in slots]


def _same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return all(torch.equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


# ----------------------------------------------------------------------
# A stream API that runs on CPU tensors and records what it is asked
# ----------------------------------------------------------------------
class FakeStream:
    def __init__(self, name: str, api: FakeStreamAPI) -> None:
        self.name = name
        self.api = api

    def wait_stream(self, stream: FakeStream) -> None:
        self.api.log.append(("wait", self.name, stream.name))

    def synchronize(self) -> None:
        self.api.log.append(("synchronize", self.name))


class FakeEvent:
    def __init__(self, api: FakeStreamAPI, timing: bool) -> None:
        self.api = api
        self.timing = timing
        self.done = api.auto_complete
        self.stamp_ms: float | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream if stream is not None else self.api.current_stream()
        self.api.log.append(("record", stream.name))
        self.stamp_ms = self.api.clock_ms
        self.api.clock_ms += self.api.tick_ms

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end_event: FakeEvent) -> float:
        assert self.timing and end_event.timing, "timing events only"
        assert self.done and end_event.done, "CUDA raises on unfinished events"
        assert self.stamp_ms is not None and end_event.stamp_ms is not None
        return end_event.stamp_ms - self.stamp_ms


class _CopyLog(TorchFunctionMode):
    """Logs every tensor copy with the fake stream current when it ran."""

    OPS = frozenset({"copy_", "index_select", "index_copy_", "zero_"})

    def __init__(self, api: FakeStreamAPI) -> None:
        super().__init__()
        self.api = api

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", "")
        if name in self.OPS:
            self.api.log.append(("op", name, self.api.current_stream().name))
        return func(*args, **(kwargs or {}))


class FakeStreamAPI:
    """``StreamAPI`` on CPU: streams and events only record; copies run at once.

    Each event recorded advances a fake clock by ``tick_ms``, so a batch's
    elapsed time is ``tick_ms``. With ``auto_complete = False`` new events
    report unfinished until the test sets ``done``.
    """

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.compute = FakeStream("compute", self)
        self._current: list[FakeStream] = [self.compute]
        self.streams: list[FakeStream] = []
        self.events: list[FakeEvent] = []
        self.auto_complete = True
        self.clock_ms = 0.0
        self.tick_ms = 4.0
        self.pinned: list[int] = []

    def current_stream(self) -> FakeStream:
        return self._current[-1]

    def new_stream(self) -> FakeStream:
        stream = FakeStream("side", self)
        self.streams.append(stream)
        return stream

    @contextmanager
    def stream_context(self, stream: FakeStream) -> Iterator[None]:
        self.log.append(("enter", stream.name))
        self._current.append(stream)
        try:
            yield
        finally:
            self._current.pop()
            self.log.append(("exit", stream.name))

    def new_event(self, timing: bool) -> FakeEvent:
        event = FakeEvent(self, timing)
        self.events.append(event)
        return event

    def pinned_empty(self, nbytes: int) -> torch.Tensor:
        self.pinned.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Log tensor copies (``("op", name, stream)``) inside the block."""
        with _CopyLog(self):
            yield

    def take_log(self) -> list[tuple[Any, ...]]:
        log, self.log = self.log, []
        return log


def _device_copier(slots: list[Any], block_nbytes: int) -> tuple[Any, FakeStreamAPI]:
    api = FakeStreamAPI()
    copier = bc.DeviceCopier(slots, block_nbytes, torch.device("cpu"), api=api)
    return copier, api


def _copiers(slots: list[Any], block_nbytes: int) -> dict[str, Any]:
    return {
        "host": bc.HostCopier(slots, block_nbytes),
        "device": _device_copier(slots, block_nbytes)[0],
    }


def _payloads(copier: Any, n: int, fill: int) -> list[Any]:
    out = []
    for _ in range(n):
        payload = copier.new_payload()
        payload.buffer.fill_(fill)  # garbage the copy must overwrite
        out.append(payload)
    return out


# ----------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------
def test_slots_are_packed_at_16_byte_offsets():
    slots, block_nbytes = _slots(_kv_caches())
    assert [s.offset for s in slots] == EXPECTED_OFFSETS
    assert block_nbytes == EXPECTED_BLOCK_NBYTES
    assert [s.nbytes for s in slots] == [128, 128, 60, 60, 168, 60]
    assert [s.dtype for s in slots] == [torch.bfloat16] * 2 + [torch.float16] * 2 + [
        torch.float32,
        torch.bfloat16,
    ]
    assert slots[5].block_shape == (2, 3, 5)
    payload = bc.payload_from_buffer(torch.zeros(block_nbytes, dtype=torch.uint8), slots)
    for slot, layer in zip(slots, payload.layers):
        assert layer.shape == slot.block_shape and layer.dtype == slot.dtype
        assert layer.data_ptr() == payload.buffer.data_ptr() + slot.offset


def test_bad_layouts_are_refused():
    slots, block_nbytes = _slots(_kv_caches())
    with pytest.raises(ValueError, match="misaligned"):
        bad = list(slots)
        bad[1] = bc.LayerSlot(**{**vars(slots[1]), "offset": 136})
        bc.HostCopier(bad, block_nbytes)
    with pytest.raises(ValueError, match="block_nbytes"):
        bc.HostCopier(slots, block_nbytes - 16)
    with pytest.raises(ValueError, match="does not match"):
        bad = list(slots)
        bad[0] = bc.LayerSlot(**{**vars(slots[0]), "dtype": torch.float16})
        bc.HostCopier(bad, block_nbytes)


def test_make_copier_picks_the_host_copier_off_cuda():
    slots, block_nbytes = _slots(_kv_caches())
    assert isinstance(bc.make_copier(slots, block_nbytes, torch.device("cpu")), bc.HostCopier)


# ----------------------------------------------------------------------
# 1-2. Copies are byte-exact, and both copiers agree
# ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["host", "device"])
def test_round_trip_is_byte_exact_into_other_blocks(kind):
    rng = random.Random(11)
    caches = _kv_caches()
    slots, block_nbytes = _slots(caches)
    copier = _copiers(slots, block_nbytes)[kind]
    for _ in range(3):
        src = rng.sample(range(NB), 3)
        dst = rng.sample([b for b in range(NB) if b not in src], 3)  # other blocks
        original = _snapshot(slots)
        payloads = _payloads(copier, len(src), fill=0xAB)
        copier.copy_out(src, payloads, before_reuse=True)
        copier.payloads_ready()
        assert _same(_snapshot(slots), original)  # reading left the cache alone
        for slot in slots:  # the device blocks get overwritten
            for b in src:
                slot.view[b].zero_()
            for b in dst:
                slot.view[b].fill_(7)
        before_load = _snapshot(slots)
        copier.copy_in(dst, payloads)
        copier.fence()
        after = _snapshot(slots)
        for i, slot in enumerate(slots):
            for s, d in zip(src, dst):
                assert torch.equal(after[i][d], original[i][s]), (slot.name, s, d)
                assert after[i][d].numel() == slot.nbytes
            for b in range(NB):
                if b not in dst:
                    assert torch.equal(after[i][b], before_load[i][b]), (slot.name, b)


def test_both_copiers_write_identical_payload_bytes():
    slots, block_nbytes = _slots(_kv_caches())
    copiers = _copiers(slots, block_nbytes)
    block_ids = [6, 0, 3, 3]  # a repeated id is fine when copying out
    buffers = {}
    for (kind, copier), fill in zip(copiers.items(), (0x55, 0xAA)):
        payloads = _payloads(copier, len(block_ids), fill)
        copier.copy_out(block_ids, payloads, before_reuse=False)
        copier.payloads_ready()
        buffers[kind] = [p.buffer.clone() for p in payloads]
        for payload, b in zip(payloads, block_ids):  # typed views agree too
            for slot, layer in zip(slots, payload.layers):
                assert torch.equal(_bytes(layer), _bytes(slot.view[b]))
    for host, device in zip(buffers["host"], buffers["device"]):
        assert host.numel() == block_nbytes
        assert torch.equal(host, device)  # padding bytes included (zeroed)
    pad = buffers["host"][0][256 + 60 : 320]
    assert pad.numel() == 4 and torch.count_nonzero(pad) == 0


def test_copy_in_refuses_repeated_block_ids():
    slots, block_nbytes = _slots(_kv_caches())
    copier, _ = _device_copier(slots, block_nbytes)
    payloads = _payloads(copier, 2, fill=0)
    with pytest.raises(ValueError, match="repeated"):
        copier.copy_in([4, 4], payloads)
    with pytest.raises(ValueError, match="payloads"):
        copier.copy_out([1, 2, 3], payloads, before_reuse=True)


# ----------------------------------------------------------------------
# 3. Stream ordering (DeviceCopier on the fake API)
# ----------------------------------------------------------------------
def _waits(log: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [e for e in log if e[0] == "wait"]


def _check_batch(log: list[tuple[Any, ...]]) -> int:
    """The copies of one batch all ran inside one side-stream context that
    the side stream entered after waiting for the compute stream, bracketed
    by two event records. Returns the log position of the context's exit."""
    enter = log.index(("enter", "side"))
    leave = log.index(("exit", "side"))
    assert log.index(("wait", "side", "compute")) < enter
    ops = [i for i, e in enumerate(log) if e[0] == "op"]
    assert ops and all(enter < i < leave for i in ops), log
    assert all(log[i][2] == "side" for i in ops)
    records = [i for i, e in enumerate(log) if e[0] == "record"]
    assert len(records) == 2 and all(log[i] == ("record", "side") for i in records)
    assert enter < records[0] < ops[0] and ops[-1] < records[1] < leave
    assert log.count(("enter", "side")) == 1 and log.count(("exit", "side")) == 1
    return leave


def test_store_before_reuse_orders_compute_after_the_copies():
    slots, block_nbytes = _slots(_kv_caches())
    copier, api = _device_copier(slots, block_nbytes)
    payloads = _payloads(copier, 3, fill=0)
    api.take_log()
    with api.recording():
        copier.copy_out([1, 4, 2], payloads, before_reuse=True)
    log = api.take_log()
    leave = _check_batch(log)
    ops = [e[1] for e in log if e[0] == "op"]
    # One gather per layer, one D2H per block, and the 4 padding ranges
    # (after both fp16 slots, the fp32 and the last slot) zeroed.
    assert ops.count("index_select") == len(slots)
    assert ops.count("copy_") == len(slots) + 3
    assert ops.count("zero_") == 4
    assert _waits(log) == [("wait", "side", "compute"), ("wait", "compute", "side")]
    assert log.index(("wait", "compute", "side")) > leave
    copier.fence()  # nothing outstanding: no extra wait
    assert _waits(api.take_log()) == []


def test_store_of_owned_blocks_waits_only_at_the_next_fence():
    slots, block_nbytes = _slots(_kv_caches())
    copier, api = _device_copier(slots, block_nbytes)
    api.take_log()
    with api.recording():
        copier.copy_out([0, 5], _payloads(copier, 2, fill=0), before_reuse=False)
        copier.copy_out([7], _payloads(copier, 1, fill=0), before_reuse=False)
    log = api.take_log()
    # Each batch still waits for the forward pass that wrote its blocks ...
    assert _waits(log) == [("wait", "side", "compute")] * 2
    # ... but the compute stream does not wait until the next step's fence.
    copier.fence()
    assert api.take_log() == [("wait", "compute", "side")]
    copier.fence()
    assert api.take_log() == []


def test_load_is_ordered_between_compute_work():
    slots, block_nbytes = _slots(_kv_caches())
    copier, api = _device_copier(slots, block_nbytes)
    payloads = _payloads(copier, 2, fill=1)
    copier.copy_out([3, 6], payloads, before_reuse=False)
    api.take_log()
    with api.recording():
        copier.copy_in([2, 5], payloads)
    log = api.take_log()
    leave = _check_batch(log)
    ops = [e[1] for e in log if e[0] == "op"]
    assert ops.count("index_copy_") == len(slots)  # one scatter per layer
    assert ops.count("copy_") == 2  # one H2D per block
    assert _waits(log) == [("wait", "side", "compute"), ("wait", "compute", "side")]
    assert log.index(("wait", "compute", "side")) > leave
    # The load's wait also covered the earlier, unfenced store.
    copier.fence()
    assert _waits(api.take_log()) == []


def test_host_copier_runs_everything_synchronously():
    slots, block_nbytes = _slots(_kv_caches())
    copier = bc.HostCopier(slots, block_nbytes)
    payloads = _payloads(copier, 1, fill=0)
    copier.copy_out([2], payloads, before_reuse=False)
    slots[0].view[2].zero_()
    copier.fence()
    copier.payloads_ready()
    copier.synchronize()
    assert torch.equal(_bytes(payloads[0].layers[0]), _bytes(_kv_caches()[0][2][2]))


# ----------------------------------------------------------------------
# 4. Timings
# ----------------------------------------------------------------------
def test_device_timings_wait_for_their_events():
    slots, block_nbytes = _slots(_kv_caches())
    copier, api = _device_copier(slots, block_nbytes)
    api.auto_complete = False
    payloads = _payloads(copier, 3, fill=0)
    copier.copy_out([0, 1, 2], payloads, before_reuse=False)
    copier.copy_in([5, 6], payloads[:2])
    assert len(api.events) == 4
    assert copier.take_timings() == []  # nothing finished yet
    for event in api.events[:2]:  # the store's start and end
        event.done = True
    timings = copier.take_timings()
    assert timings == [bc.CopyTiming("store", api.tick_ms / 1000.0, 3)]
    assert copier.take_timings() == []  # reported once
    for event in api.events[2:]:
        event.done = True
    assert copier.take_timings() == [bc.CopyTiming("load", api.tick_ms / 1000.0, 2)]
    assert copier.take_timings() == []


def test_empty_batches_do_nothing():
    slots, block_nbytes = _slots(_kv_caches())
    copier, api = _device_copier(slots, block_nbytes)
    api.take_log()
    copier.copy_out([], [], before_reuse=True)
    copier.copy_in([], [])
    copier.fence()
    copier.payloads_ready()
    assert api.take_log() == [] and copier.take_timings() == []


def test_host_timings_are_measured_per_batch():
    slots, block_nbytes = _slots(_kv_caches())
    copier = bc.HostCopier(slots, block_nbytes)
    payloads = _payloads(copier, 4, fill=0)
    copier.copy_out([0, 1, 2, 3], payloads, before_reuse=True)
    copier.copy_in([7, 6], payloads[:2])
    timings = copier.take_timings()
    assert [(t.kind, t.blocks) for t in timings] == [("store", 4), ("load", 2)]
    assert all(0.0 <= t.seconds < 1.0 for t in timings)
    assert copier.take_timings() == []


# ----------------------------------------------------------------------
# 5. Host access to payloads
# ----------------------------------------------------------------------
def test_payloads_ready_synchronises_once_per_batch():
    slots, block_nbytes = _slots(_kv_caches())
    copier, api = _device_copier(slots, block_nbytes)
    payloads = _payloads(copier, 2, fill=0)
    # Payload buffers and index buffers come from pinned memory.
    assert api.pinned == [block_nbytes] * 2
    api.take_log()
    copier.payloads_ready()  # nothing issued yet
    assert api.take_log() == []
    copier.copy_out([1, 2], payloads, before_reuse=False)
    api.take_log()
    copier.payloads_ready()
    assert api.take_log() == [("synchronize", "side")]
    copier.payloads_ready()
    assert api.take_log() == []
    copier.copy_in([3, 4], payloads)  # H2D copies still read the payloads
    api.take_log()
    copier.payloads_ready()
    assert api.take_log() == [("synchronize", "side")]
    assert api.pinned[2:] == [8 * 2, 8 * 2]  # int64 block indices


def test_synchronize_settles_everything():
    slots, block_nbytes = _slots(_kv_caches())
    copier, api = _device_copier(slots, block_nbytes)
    copier.copy_out([1], _payloads(copier, 1, fill=0), before_reuse=False)
    api.take_log()
    copier.synchronize()
    assert api.take_log() == [("synchronize", "side")]
    copier.fence()
    copier.payloads_ready()
    assert api.take_log() == []
