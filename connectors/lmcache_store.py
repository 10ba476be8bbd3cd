"""Optional store backend: block payloads in LMCache's host memory allocator.

Selected with ``"kv_connector_extra_config": {"store_backend": "lmcache"}``.
Keys, LRU order, budget and pins stay in this plugin's ``CPUStore`` (so the
scheduler's index and the workers agree exactly, as with the plain CPU
backend); the bytes of each block live in memory objects from LMCache's
allocator (pinned, NUMA-aware ``MixedMemoryAllocator`` on CUDA machines; a
``TensorMemoryAllocator`` over one host tensor elsewhere), released with
``ref_count_down`` on eviction.

LMCache is optional and not installed by this project. Without it, selecting
this backend fails at start-up with an error that says so. Its memory API
has moved between releases; the calls used here are those of the LMCache
0.3 series (``lmcache.v1.memory_management``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

import torch

from .cpu_store import BlockPayload, CPUStore

logger = logging.getLogger("vllm.continuum_plugin.kv_offload")

__all__ = ["LMCacheStore", "lmcache_available"]

_MISSING = (
    "store_backend='lmcache' needs the optional `lmcache` package (LMCache 0.3.x), which is "
    "not importable here: install it next to vLLM, or use the default store_backend='cpu'"
)


def lmcache_available() -> bool:
    try:
        import lmcache.v1.memory_management  # noqa: F401
    except Exception:
        return False
    return True


class LMCacheStore(CPUStore):
    """``CPUStore`` whose payload buffers come from LMCache's allocator."""

    def __init__(
        self,
        capacity_bytes: int,
        *,
        block_nbytes: int,
        config: dict[str, Any] | None = None,
        on_evict: Callable[[Hashable, int], None] | None = None,
    ) -> None:
        try:
            from lmcache.v1 import memory_management as mm
        except Exception as e:  # ImportError, or a broken install
            raise RuntimeError(f"{_MISSING} ({type(e).__name__}: {e})") from e
        self._mm = mm
        self._user_on_evict = on_evict
        super().__init__(capacity_bytes, on_evict=self._release)
        self.block_nbytes = int(block_nbytes)
        # Room for every block the budget allows, plus allocator slack.
        pool_bytes = max(self.block_nbytes, int(capacity_bytes)) + 2**20
        cfg = dict(config or {})
        try:
            if torch.cuda.is_available() and not cfg.get("unpinned", False):
                self._allocator = mm.MixedMemoryAllocator(pool_bytes)
            else:
                self._allocator = mm.TensorMemoryAllocator(
                    torch.empty(pool_bytes, dtype=torch.uint8)
                )
        except Exception as e:
            raise RuntimeError(
                f"store_backend='lmcache': could not create an LMCache memory allocator "
                f"({type(e).__name__}: {e}); this adapter targets LMCache 0.3.x"
            ) from e
        self._objs: dict[int, Any] = {}  # buffer data_ptr -> MemoryObj
        fmt = getattr(mm, "MemoryFormat", None)
        self._fmt = getattr(fmt, "BINARY_BUFFER", None) or getattr(fmt, "BINARY", None)
        logger.info("ContinuumOffloadConnector: LMCache allocator backend, %d bytes", pool_bytes)

    def allocate_buffer(self, nbytes: int, pin_memory: bool = False) -> torch.Tensor:
        """A host buffer of ``nbytes`` owned by an LMCache memory object."""
        kwargs = {} if self._fmt is None else {"fmt": self._fmt}
        obj = self._allocator.allocate(torch.Size([nbytes]), torch.uint8, **kwargs)
        if obj is None:
            # Fragmented or full: fall back to a plain tensor (still
            # accounted for by the byte budget).
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory)
        buf = obj.tensor.view(torch.uint8).reshape(-1)[:nbytes]
        self._objs[buf.data_ptr()] = obj
        return buf

    def _release_value(self, value: Any) -> None:
        if isinstance(value, BlockPayload):
            obj = self._objs.pop(value.buffer.data_ptr(), None)
            if obj is not None:
                try:
                    obj.ref_count_down()
                except Exception:  # pragma: no cover - allocator API drift
                    logger.debug("LMCache ref_count_down failed", exc_info=True)

    def _release(self, key: Hashable, nbytes: int) -> None:
        if self._user_on_evict is not None:
            self._user_on_evict(key, nbytes)

    # Free the LMCache memory whenever an entry leaves the store.
    def _evict(self, key: Hashable, entry: Any) -> None:
        self._release_value(entry.value)
        super()._evict(key, entry)

    def pop(self, key: Hashable) -> Any:
        value = super().pop(key)
        self._release_value(value)
        return value

    def put(self, key: Hashable, value: Any, nbytes: int | None = None) -> bool:
        present = key in self
        ok = super().put(key, value, nbytes)
        if not ok or present:
            self._release_value(value)  # not kept: give its memory back
        return ok

    def clear(self) -> int:
        for key in list(self):
            self._release_value(self.peek(key))
        return super().clear()
