"""Whole-block copies between vLLM's paged KV cache and host payloads.

The connector's worker side stores a KV block as one host ``BlockPayload``
(``cpu_store.BlockPayload``): a uint8 ``buffer`` of ``block_nbytes`` bytes
that holds every layer's bytes for that block at ``LayerSlot.offset``
(16-byte aligned, see :func:`pack_layer_slots`), and typed per-layer views
into it. A :class:`BlockCopier` moves blocks between the KV cache tensors
(one *block-major view* per layer: ``view[b]`` is block ``b`` of that
layer) and such payloads:

* :class:`HostCopier` (KV cache in host memory, vLLM's CPU backend): plain
  synchronous copies, one per block and layer.
* :class:`DeviceCopier` (CUDA): copies queued on a side stream and ordered
  against the compute stream with stream waits, never with a host
  synchronisation: one batched gather/scatter per layer through a device
  staging buffer, one host<->device copy per block into pinned memory.

Ordering contract (what the worker relies on), per engine step:

1. ``fence()`` first, before any forward pass may write a block: every
   side-stream copy issued so far is ordered before later compute-stream
   work. (A block stored after step N's forward without a wait may have been
   freed by the scheduler and reallocated in step N+1.)
2. ``copy_out(..., before_reuse=True)`` for blocks the scheduler has already
   freed, and ``copy_in`` for blocks it just allocated: both are ordered
   after earlier compute-stream work and before later compute-stream work.
3. The forward pass.
4. ``copy_out(..., before_reuse=False)`` for blocks still owned by running
   requests (full blocks are immutable): ordered after the forward pass, but
   the compute stream does not wait for it, so the copy overlaps whatever
   the GPU does next (sampling, the host preparing the next step) until the
   next ``fence()``.

The host may read or write a payload's bytes only after ``payloads_ready()``
(e.g. a store backend writing them to disk).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from .cpu_store import BlockPayload

__all__ = [
    "PAYLOAD_ALIGN",
    "BlockCopier",
    "CopyTiming",
    "CudaStreamAPI",
    "DeviceCopier",
    "HostCopier",
    "LayerSlot",
    "StreamAPI",
    "make_copier",
    "pack_layer_slots",
    "payload_from_buffer",
]

# Byte alignment of each layer inside a block payload. It makes every
# layer's slice of a uint8 buffer viewable as the layer's dtype (itemsize
# <= 16) and keeps the per-layer slices of the staging buffer aligned.
PAYLOAD_ALIGN = 16

CopyKind = Literal["load", "store"]


# ----------------------------------------------------------------------
# Layout of a block payload
# ----------------------------------------------------------------------
@dataclass
class LayerSlot:
    """One KV cache tensor and where its block lives inside a payload.

    Invariants: ``view.shape[1:] == block_shape``, ``view.dtype == dtype``,
    ``nbytes == prod(block_shape) * dtype.itemsize`` and ``offset`` is a
    multiple of :data:`PAYLOAD_ALIGN`.
    """

    name: str
    view: torch.Tensor  # block-major view: view[b] is block b of this layer
    offset: int  # byte offset inside a block payload
    nbytes: int
    dtype: torch.dtype
    block_shape: tuple[int, ...]


def _align(nbytes: int) -> int:
    return -(-nbytes // PAYLOAD_ALIGN) * PAYLOAD_ALIGN


def pack_layer_slots(views: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[LayerSlot], int]:
    """Lay block-major views out back to back in a payload.

    Returns the slots (in input order, each at a :data:`PAYLOAD_ALIGN`-ed
    offset) and ``block_nbytes``, the payload size (itself aligned).
    """
    slots: list[LayerSlot] = []
    offset = 0
    for name, view in views:
        block_shape = tuple(view.shape[1:])
        nbytes = math.prod(block_shape) * view.element_size()
        slots.append(LayerSlot(name, view, offset, nbytes, view.dtype, block_shape))
        offset += _align(nbytes)
    return slots, offset


def payload_from_buffer(buffer: torch.Tensor, layers: Sequence[LayerSlot]) -> BlockPayload:
    """A ``BlockPayload`` over ``buffer`` (uint8, one block's bytes) with one
    typed view per layer slot."""
    views = tuple(
        buffer[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.block_shape) for s in layers
    )
    return BlockPayload(buffer, views)


def _check_layout(layers: Sequence[LayerSlot], block_nbytes: int) -> list[tuple[int, int]]:
    """Validate the slots; return the padding byte ranges of a payload."""
    if not layers:
        raise ValueError("no KV cache layers")
    if block_nbytes % PAYLOAD_ALIGN:
        raise ValueError(f"block_nbytes {block_nbytes} is not a multiple of {PAYLOAD_ALIGN}")
    pads: list[tuple[int, int]] = []
    end = 0
    for s in sorted(layers, key=lambda s: s.offset):
        itemsize = s.dtype.itemsize
        if s.offset % PAYLOAD_ALIGN or s.offset < end:
            raise ValueError(f"layer {s.name}: offset {s.offset} misaligned or overlapping")
        if s.nbytes != math.prod(s.block_shape) * itemsize:
            raise ValueError(f"layer {s.name}: nbytes {s.nbytes} does not match {s.block_shape}")
        if tuple(s.view.shape[1:]) != s.block_shape or s.view.dtype != s.dtype:
            raise ValueError(f"layer {s.name}: view {tuple(s.view.shape)} does not match the slot")
        if s.offset > end:
            pads.append((end, s.offset))
        end = s.offset + s.nbytes
    if end > block_nbytes:
        raise ValueError(f"layers need {end} bytes, block_nbytes is {block_nbytes}")
    if end < block_nbytes:
        pads.append((end, block_nbytes))
    return pads


# ----------------------------------------------------------------------
# Copiers
# ----------------------------------------------------------------------
@dataclass(frozen=True)
class CopyTiming:
    """Duration of one finished batch of copies."""

    kind: CopyKind  # "store": blocks -> payloads; "load": payloads -> blocks
    seconds: float
    blocks: int


class BlockCopier(ABC):
    """Copies whole KV blocks between the KV cache and host payloads.

    Payloads must have been built for ``layers`` (``payload_from_buffer``
    over a buffer of ``block_nbytes`` bytes). After ``copy_out`` a payload's
    buffer depends only on the blocks' contents: padding bytes are zeroed.
    """

    def __init__(self, layers: Sequence[LayerSlot], block_nbytes: int) -> None:
        self.layers: tuple[LayerSlot, ...] = tuple(layers)
        self.block_nbytes = int(block_nbytes)
        self._pads = _check_layout(self.layers, self.block_nbytes)

    def new_payload(self) -> BlockPayload:
        """A fresh payload backed by :meth:`allocate_buffer`."""
        return payload_from_buffer(self.allocate_buffer(self.block_nbytes), self.layers)

    @abstractmethod
    def copy_out(
        self, block_ids: list[int], payloads: list[BlockPayload], *, before_reuse: bool
    ) -> None:
        """Blocks ``block_ids[i]`` -> ``payloads[i]``.

        ``before_reuse=True``: the scheduler already freed the blocks and the
        next forward pass may overwrite them, so the copy is ordered before
        any later compute-stream work. ``before_reuse=False``: the blocks are
        still owned by running requests; the compute stream waits only at the
        next :meth:`fence`.
        """

    @abstractmethod
    def copy_in(self, block_ids: list[int], payloads: list[BlockPayload]) -> None:
        """``payloads[i]`` -> block ``block_ids[i]`` (distinct ids), ordered
        after earlier compute-stream work (the blocks were just reallocated)
        and before later compute-stream work (the forward pass reads them)."""

    @abstractmethod
    def fence(self) -> None:
        """Order every copy issued so far before later compute-stream work.
        Called at the start of every step, before any forward pass."""

    @abstractmethod
    def payloads_ready(self) -> None:
        """Block the host until no issued copy still reads or writes a
        payload, so the host may access payload bytes."""

    @abstractmethod
    def take_timings(self) -> list[CopyTiming]:
        """Timings of the batches finished since the last call (a batch whose
        copies are still running is reported by a later call)."""

    @abstractmethod
    def allocate_buffer(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer suitable as a payload buffer."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block the host until every issued copy is complete (shutdown)."""

    def _check(self, block_ids: list[int], payloads: list[BlockPayload]) -> int:
        if len(block_ids) != len(payloads):
            raise ValueError(f"{len(block_ids)} block ids for {len(payloads)} payloads")
        return len(block_ids)


class HostCopier(BlockCopier):
    """KV cache in host memory: synchronous copies, one per block and layer.

    (A batched ``index_select`` is ~50x slower for bf16 on CPU.) Every method
    returns with its copies complete, so the ordering methods are no-ops.
    """

    def __init__(self, layers: Sequence[LayerSlot], block_nbytes: int) -> None:
        super().__init__(layers, block_nbytes)
        self._timings: list[CopyTiming] = []

    def copy_out(
        self, block_ids: list[int], payloads: list[BlockPayload], *, before_reuse: bool
    ) -> None:
        n = self._check(block_ids, payloads)
        if not n:
            return
        t0 = time.perf_counter()
        for block_id, payload in zip(block_ids, payloads):
            for slot, dst in zip(self.layers, payload.layers):
                dst.copy_(slot.view[block_id])
            for lo, hi in self._pads:
                payload.buffer[lo:hi].zero_()
        self._timings.append(CopyTiming("store", time.perf_counter() - t0, n))

    def copy_in(self, block_ids: list[int], payloads: list[BlockPayload]) -> None:
        n = self._check(block_ids, payloads)
        if not n:
            return
        t0 = time.perf_counter()
        for block_id, payload in zip(block_ids, payloads):
            for slot, src in zip(self.layers, payload.layers):
                slot.view[block_id].copy_(src)
        self._timings.append(CopyTiming("load", time.perf_counter() - t0, n))

    def fence(self) -> None:
        pass

    def payloads_ready(self) -> None:
        pass

    def take_timings(self) -> list[CopyTiming]:
        out, self._timings = self._timings, []
        return out

    def allocate_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def synchronize(self) -> None:
        pass


# ----------------------------------------------------------------------
# Streams (CUDA, or a fake in tests)
# ----------------------------------------------------------------------
class StreamLike(Protocol):
    def wait_stream(self, stream: Any) -> None: ...

    def synchronize(self) -> None: ...


class EventLike(Protocol):
    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds


class StreamAPI(Protocol):
    """The stream operations :class:`DeviceCopier` needs, and nothing else
    (a test supplies a fake that runs on CPU tensors and records them)."""

    def current_stream(self) -> StreamLike:
        """The compute stream: where vLLM queues the forward pass."""
        ...

    def new_stream(self) -> StreamLike: ...

    def stream_context(self, stream: Any) -> AbstractContextManager[Any]:
        """Makes ``stream`` current: kernels launched and device memory
        allocated inside belong to it."""
        ...

    def new_event(self, timing: bool) -> EventLike: ...

    def pinned_empty(self, nbytes: int) -> torch.Tensor:
        """An uninitialised uint8 host buffer in page-locked memory."""
        ...


class CudaStreamAPI:
    """:class:`StreamAPI` over ``torch.cuda`` for one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(device=self.device)

    def stream_context(self, stream: Any) -> AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def new_event(self, timing: bool) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=timing)

    def pinned_empty(self, nbytes: int) -> torch.Tensor:
        # Allocated by PyTorch's CachingHostAllocator, which tracks pending
        # non_blocking copies (see DeviceCopier).
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


class DeviceCopier(BlockCopier):
    """KV cache in device memory: batched copies on a side stream.

    A store gathers the blocks of each layer with one ``index_select`` into a
    device staging buffer laid out like ``n`` payloads, then copies each row
    to its (pinned) payload with a non_blocking D2H copy; a load does the
    reverse with one ``index_copy_`` per layer.

    Memory safety without host synchronisation:

    * Device tensors allocated inside the side-stream context (staging
      buffers, indices) may be freed on return while copies are pending: the
      caching allocator hands their memory only to later allocations on the
      same stream, whose work runs after the pending copies.
    * A pinned payload buffer freed or recycled while a non_blocking copy
      into or out of it is pending is protected by PyTorch's
      CachingHostAllocator (it records an event on the copy's stream and
      reuses the block only once the event completed); a payload recycled by
      the worker for another copy is used in the side stream's order anyway.
      Host memory not from that allocator (a store's own pool) is *not*
      protected: release it only after :meth:`payloads_ready`.

    Invariant: ``self._unfenced`` is True iff the side stream holds work the
    compute stream has not been made to wait for.
    """

    def __init__(
        self,
        layers: Sequence[LayerSlot],
        block_nbytes: int,
        device: torch.device,
        api: StreamAPI | None = None,
    ) -> None:
        super().__init__(layers, block_nbytes)
        self.device = device
        self._api: StreamAPI = api if api is not None else CudaStreamAPI(device)
        self._side = self._api.new_stream()
        self._unfenced = False
        self._host_pending = False  # copies touching payloads since the last sync
        self._pending: list[tuple[CopyKind, EventLike, EventLike, int]] = []

    # --- copies ----------------------------------------------------------------
    def copy_out(
        self, block_ids: list[int], payloads: list[BlockPayload], *, before_reuse: bool
    ) -> None:
        n = self._check(block_ids, payloads)
        if not n:
            return
        idx_host = self._host_index(block_ids)
        with self._side_batch("store", n) as side:
            # The side stream waited for the compute stream, where the
            # forward pass that wrote these blocks is queued.
            idx = idx_host.to(self.device, non_blocking=True)
            staging = torch.empty((n, self.block_nbytes), dtype=torch.uint8, device=self.device)
            for slot in self.layers:
                self._slot_view(staging, slot, n).copy_(slot.view.index_select(0, idx))
            for lo, hi in self._pads:  # no-op for real models (sizes are aligned)
                staging[:, lo:hi].zero_()
            for i, payload in enumerate(payloads):
                payload.buffer.copy_(staging[i], non_blocking=True)
        if before_reuse:
            # The next forward pass may overwrite these blocks.
            self._api.current_stream().wait_stream(side)
            self._unfenced = False
        # else: the blocks stay owned and unchanged until the scheduler frees
        # them, which is at the earliest in a later step, after its fence().

    def copy_in(self, block_ids: list[int], payloads: list[BlockPayload]) -> None:
        n = self._check(block_ids, payloads)
        if not n:
            return
        if len(set(block_ids)) != n:
            # index_copy_ with repeated indices leaves an arbitrary winner.
            raise ValueError("copy_in: repeated block ids")
        idx_host = self._host_index(block_ids)
        with self._side_batch("load", n) as side:
            # The blocks were just reallocated: the side stream waited for
            # compute-stream work that may still use them.
            staging = torch.empty((n, self.block_nbytes), dtype=torch.uint8, device=self.device)
            for i, payload in enumerate(payloads):
                staging[i].copy_(payload.buffer, non_blocking=True)
            idx = idx_host.to(self.device, non_blocking=True)
            for slot in self.layers:
                slot.view.index_copy_(0, idx, self._slot_view(staging, slot, n))
        # The next forward pass reads these blocks.
        self._api.current_stream().wait_stream(side)
        self._unfenced = False

    # --- ordering ----------------------------------------------------------------
    def fence(self) -> None:
        if self._unfenced:
            self._api.current_stream().wait_stream(self._side)
            self._unfenced = False

    def payloads_ready(self) -> None:
        if self._host_pending:
            self._side.synchronize()
            self._host_pending = False

    def synchronize(self) -> None:
        self._side.synchronize()
        # Later compute work is queued after the host returned, hence after
        # every side-stream copy.
        self._unfenced = False
        self._host_pending = False

    # --- bookkeeping -----------------------------------------------------------
    def take_timings(self) -> list[CopyTiming]:
        done: list[CopyTiming] = []
        still: list[tuple[CopyKind, EventLike, EventLike, int]] = []
        for kind, start, end, blocks in self._pending:
            if end.query():  # start precedes end on the same stream
                done.append(CopyTiming(kind, start.elapsed_time(end) / 1000.0, blocks))
            else:
                still.append((kind, start, end, blocks))
        self._pending = still
        return done

    def allocate_buffer(self, nbytes: int) -> torch.Tensor:
        # Pinned: a non_blocking copy into pageable memory is synchronous
        # with the host (and one out of it may be).
        return self._api.pinned_empty(nbytes)

    # --- helpers ---------------------------------------------------------------
    @contextmanager
    def _side_batch(self, kind: CopyKind, n: int) -> Iterator[StreamLike]:
        """One timed batch on the side stream: the side stream first waits
        for the compute stream, then the body runs with the side stream
        current. The caller decides whether the compute stream waits after."""
        api, side = self._api, self._side
        side.wait_stream(api.current_stream())
        start, end = api.new_event(True), api.new_event(True)
        with api.stream_context(side):
            start.record(side)
            try:
                yield side
            finally:
                # Even a batch that raised may have queued copies.
                self._unfenced = True
                self._host_pending = True
            end.record(side)
        self._pending.append((kind, start, end, n))

    def _host_index(self, block_ids: list[int]) -> torch.Tensor:
        # Pinned, then copied with non_blocking: torch.tensor(..., device=cuda)
        # would be a blocking copy, i.e. a host sync on the side stream, which
        # first waits for the whole forward pass.
        idx = self._api.pinned_empty(8 * len(block_ids)).view(torch.int64)
        idx.numpy()[:] = block_ids
        return idx

    @staticmethod
    def _slot_view(staging: torch.Tensor, slot: LayerSlot, n: int) -> torch.Tensor:
        """Layer ``slot``'s part of ``n`` staged payloads, as ``[n, *block_shape]``."""
        cols = staging[:, slot.offset : slot.offset + slot.nbytes]
        return cols.view(slot.dtype).view(n, *slot.block_shape)


def make_copier(
    layers: Sequence[LayerSlot], block_nbytes: int, device: torch.device
) -> BlockCopier:
    """:class:`DeviceCopier` for a CUDA KV cache, :class:`HostCopier` otherwise."""
    if device.type == "cuda":
        return DeviceCopier(layers, block_nbytes, device)
    return HostCopier(layers, block_nbytes)

