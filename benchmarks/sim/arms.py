"""The policies a simulation compares, each on vLLM's real scheduler.

An :class:`Arm` names a scheduling policy and how the KV pool is sized:

* ``fcfs`` -- vLLM's stock scheduler: a finished turn's KV is freed (its
  blocks stay in the prefix cache until something else needs them);
* ``continuum`` / ``context_serve`` -- the plugin's schedulers (pins with a
  TTL, job-aware queue and preemption, soft pins);
* ``continuum-paper`` -- Continuum as the paper has it: its TTL rule as
  published (``ttl_policy = "cdf"``: a second held costs a second) and no
  admission gate, what the defaults (``priced``, ``admission``) replaced;
* ``continuum-offload`` -- Continuum with the plugin's CPU offload connector
  (``ContinuumOffloadConnector``): blocks leaving a pin (TTL, pressure) or a
  freed turn are stored in host memory and reloaded over PCIe instead of
  recomputed; its scheduler side runs unchanged, the copies are simulated
  (``offload``);
* ``continuum-offload-explicit`` -- the same connector as a victim tier
  (``store_mode: explicit``): only what leaves a pin or a SLOW turn is
  stored, so the host tier holds what the GPU pool no longer does instead of
  a copy of it;
* ``continuum-offload-victim`` -- the same connector as an exclusive victim
  tier (``store_mode: victim``): what leaves a pin, and every cached block
  the GPU prefix cache evicts, copied before it is overwritten; GPU and host
  together then keep up to their sum in distinct blocks;
* ``offload-victim`` -- that victim tier under vLLM's stock scheduler;
* ``native-offload`` -- vLLM's stock scheduler with vLLM's own CPU
  offloading, as ``--kv-offloading-size`` configures it (``OffloadingConnector``
  over the stock ``CPUOffloadingSpec``: write-through stores of every
  computed block, LRU host store, asynchronous loads); its scheduler side
  runs unchanged, the asynchronous copies are simulated
  (``offload.SimulatedNativeOffloadWorker``);
* ``continuum-native-offload`` -- the same under the Continuum scheduler;
* ``continuum-native-prefetch`` -- that with ``prefetch`` on: a job's
  context is loaded back from the host tier before its tool is predicted
  back (``vllm_continuum_plugin.prefetch``);
* ``fcfs-capK`` (any K >= 1, e.g. ``fcfs-cap16``) -- plain admission: the
  stock scheduler behind a fixed cap of K sessions in flight (the rest wait
  first come, first served, and the wait counts in their JCT), as a client
  or router would impose it;
* ``oracle`` -- the stock scheduler over a pool that never evicts (room for
  every block any turn computes): the bound that retention can reach,
  reported as such.

The scheduler is built the way vLLM's ``EngineCore`` builds it --
``VllmConfig`` → ``get_scheduler_cls()`` → ``cls(vllm_config, kv_cache_config,
...)`` -- over a config-only model directory (``skip_tokenizer_init``), so
contexts of 100k+ tokens need no weights and no tokenizer -- unless the
client profile's replies are text (``clients``): then ``EngineShape.tokenizer``
names a tokenizer directory, and the plugin's reply reader decodes replies
with it as a served engine's would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

from vllm_continuum_plugin.clock import ManualClock
from vllm_continuum_plugin.registration import register

__all__ = ["ARMS", "Arm", "EngineShape", "build_scheduler", "parse_arms"]


@dataclass(frozen=True)
class Arm:
    """One policy of a comparison.

    ``policy``: vLLM's ``--scheduling-policy``; ``unbounded_pool``: the
    oracle's pool that never evicts; ``continuum``: the plugin's settings
    (``--additional-config '{"continuum": {...}}'``).
    """

    name: str
    policy: str
    unbounded_pool: bool = False
    continuum: tuple[tuple[str, Any], ...] = ()
    offload: str = ""  # "" none, "plugin": ContinuumOffloadConnector, "native": vLLM's OffloadingConnector
    job_cap: int = 0  # plain admission: at most this many jobs in flight (0: none)
    # The plugin connector's ``store_mode`` (offload == "plugin"; "" -- its default).
    store_mode: str = ""

    def __post_init__(self) -> None:
        if self.offload not in ("", "plugin", "native"):
            raise ValueError(f"Arm {self.name!r}: offload must be '', 'plugin' or 'native', got {self.offload!r}")
        if self.store_mode and self.offload != "plugin":
            raise ValueError(f"Arm {self.name!r}: store_mode {self.store_mode!r} needs offload='plugin'")

    @property
    def is_plugin(self) -> bool:
        return self.policy in ("continuum", "context_serve")


ARMS: dict[str, Arm] = {
    "fcfs": Arm("fcfs", "fcfs"),
    "continuum": Arm("continuum", "continuum"),
    "context_serve": Arm("context_serve", "context_serve"),
    "continuum-paper": Arm("continuum-paper", "continuum", continuum=(("admission", False), ("ttl_policy", "cdf"))),
    "continuum-offload": Arm("continuum-offload", "continuum", offload="plugin"),
    "continuum-offload-explicit": Arm("continuum-offload-explicit", "continuum", offload="plugin", store_mode="explicit"),
    "continuum-offload-victim": Arm("continuum-offload-victim", "continuum", offload="plugin", store_mode="victim"),
    "offload-victim": Arm("offload-victim", "fcfs", offload="plugin", store_mode="victim"),
    "native-offload": Arm("native-offload", "fcfs", offload="native"),
    "continuum-native-offload": Arm("continuum-native-offload", "continuum", offload="native"),
    "continuum-native-prefetch": Arm("continuum-native-prefetch", "continuum", offload="native",
                                     continuum=(("prefetch", True),)),
    "oracle": Arm("oracle", "fcfs", unbounded_pool=True),
}


def parse_arms(spec: str) -> list[Arm]:
    """``"fcfs,continuum,oracle"`` → arms, in that order; unknown names are an
    error that lists the known ones."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError(f"no policy named in {spec!r}; choose from {', '.join(ARMS)}")
    unknown = [n for n in names if n not in ARMS and _job_cap(n) is None]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; choose from {', '.join(ARMS)}, fcfs-capK")
    if len(set(names)) != len(names):
        raise ValueError(f"a policy is named twice in {spec!r}")
    return [ARMS[n] if n in ARMS else Arm(n, "fcfs", job_cap=_job_cap(n) or 0) for n in names]


def _job_cap(name: str) -> int | None:
    """K of an ``fcfs-capK`` arm name (K >= 1), else None."""
    prefix = "fcfs-cap"
    if name.startswith(prefix) and name[len(prefix):].isdigit() and int(name[len(prefix):]) >= 1:
        return int(name[len(prefix):])
    return None


@dataclass(frozen=True)
class EngineShape:
    """The engine limits and KV layout a scheduler is built with."""

    model_dir: str
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_kv_heads: int = 8  # per GPU
    head_size: int = 128
    num_layers: int = 32
    offload_bytes: int = 256 * 2**30  # host memory per GPU for the offload arms
    # vLLM's --long-prefill-token-threshold (0: vLLM's default, no cut).
    long_prefill_token_threshold: int = 0
    # A tokenizer directory the engine loads (replies are text the plugin
    # reads); "" -- none (``skip_tokenizer_init``: replies are never read).
    tokenizer: str = ""


_registered = False


def build_scheduler(
    arm: Arm, shape: EngineShape, clock: ManualClock, num_blocks: int | None = None, kv_transfer: Any = None,
) -> Scheduler:
    """vLLM's scheduler for ``arm`` over ``shape`` (``num_blocks`` overrides
    the pool size: the oracle's). The plugin's schedulers run on ``clock``.
    ``kv_transfer``: a ``KVTransferConfig`` to use instead of the arm's
    (connector combinations such as ``MultiConnector``)."""
    global _registered
    if not _registered:
        register()
        _registered = True
    blocks = num_blocks if num_blocks is not None else shape.num_blocks
    scheduler_config = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        policy=arm.policy,
        long_prefill_token_threshold=shape.long_prefill_token_threshold,
        # One full-attention group; the offload connector requires it said.
        disable_hybrid_kv_cache_manager=True,
    )
    model_config = ModelConfig(
        model=shape.model_dir, dtype="bfloat16", seed=0, max_model_len=shape.max_model_len,
        tokenizer=shape.tokenizer or None, skip_tokenizer_init=not shape.tokenizer,
    )
    cache_config = CacheConfig(block_size=shape.block_size, cache_dtype="auto", enable_prefix_caching=True)
    cache_config.num_gpu_blocks = blocks
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        device_config=DeviceConfig("cpu"),
        additional_config={"continuum": dict(arm.continuum)} if arm.continuum else {},
    )
    if kv_transfer is not None:
        vllm_config.kv_transfer_config = kv_transfer
    elif arm.offload:
        from vllm.config import KVTransferConfig

        if arm.offload == "plugin":
            extra: dict[str, Any] = {"cpu_bytes": int(shape.offload_bytes)}
            connector = "ContinuumOffloadConnector"
            if arm.store_mode:
                extra["store_mode"] = arm.store_mode
        else:
            # What `--kv-offloading-size GIB --kv-offloading-backend native`
            # sets (VllmConfig._post_init_kv_transfer_config); the stock
            # spec's scheduler side needs no GPU.
            connector, extra = "OffloadingConnector", {"cpu_bytes_to_use": int(shape.offload_bytes)}
        vllm_config.kv_transfer_config = KVTransferConfig(
            kv_connector=connector, kv_role="kv_both", kv_connector_extra_config=extra,
        )
    spec = FullAttentionSpec(
        block_size=shape.block_size, num_kv_heads=shape.num_kv_heads, head_size=shape.head_size,
        dtype=torch.bfloat16,
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[],         # One name per layer: the offload store sizes a block by them.
        kv_cache_groups=[KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in range(shape.num_layers)], spec)],
    )
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    kwargs: dict[str, Any] = {"clock": clock} if arm.is_plugin else {}
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=shape.block_size,
        # vLLM's per-step SchedulerStats feed its loggers only; the replay
        # keeps its own records.
        log_stats=False,
        **kwargs,
    )
