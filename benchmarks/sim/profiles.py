"""GPU + model profiles: what the simulator pretends to serve on.

A :class:`SimProfile` is one deployment: a model (:class:`ModelArch`), a GPU
(:class:`GpuSpec`), a tensor-parallel degree and vLLM's engine limits. It
answers the two questions the replay needs before its first step: how large
the KV pool is (:meth:`SimProfile.num_gpu_blocks`) and which limits vLLM's
scheduler runs under. :func:`write_config_dir` writes the config-only model
directory that vLLM's ``ModelConfig`` is built from, so the real scheduler
sees the real model's shape without any weights.

Nothing here imports vLLM or a step-time model: profiles are plain data.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GIB",
    "GpuSpec",
    "H100_SXM",
    "H200_SXM",
    "LLAMA_3_1_8B",
    "LLAMA_3_1_70B",
    "ModelArch",
    "PROFILES",
    "SimProfile",
    "get_profile",
    "write_config_dir",
]

GIB = 1024**3


@dataclass(frozen=True)
class ModelArch:
    """A dense decoder-only transformer (Llama-style: GQA attention, gated MLP).

    Invariants: every size is positive; ``num_heads % num_kv_heads == 0``;
    ``hf_config`` is the model's own ``config.json`` (it is what
    :func:`write_config_dir` writes, so it must agree with the fields above;
    ``__post_init__`` checks the overlapping keys).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    # A dict is unhashable: keep it out of __hash__ so profiles can key caches.
    hf_config: dict[str, Any] = field(default_factory=dict, hash=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size", "dtype_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelArch {self.name!r}: {name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelArch {self.name!r}: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        expected = {
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
        }
        for key, want in expected.items():
            if key in self.hf_config and self.hf_config[key] != want:
                raise ValueError(
                    f"ModelArch {self.name!r}: hf_config[{key!r}]={self.hf_config[key]!r} "
                    f"disagrees with the field value {want!r}"
                )

    # -- sizes -------------------------------------------------------------

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Weights of one decoder layer: q/k/v/o projections, gated MLP, two norms."""
        attn = self.hidden_size * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return attn + mlp + 2 * self.hidden_size

    def embedding_params(self) -> int:
        """The input embedding table (looked up, not multiplied: no FLOPs)."""
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        """The output projection; tied models share it with the embedding."""
        if self.hf_config.get("tie_word_embeddings", False):
            return 0
        return self.vocab_size * self.hidden_size

    def params(self) -> int:
        """All weights: 8,030,261,248 for Llama-3.1-8B, 70,553,706,496 for 70B."""
        return (self.num_layers * self.layer_params() + self.embedding_params()
                + self.lm_head_params() + self.hidden_size)  # + the final norm

    def weight_bytes(self) -> int:
        return self.params() * self.dtype_bytes

    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers (all KV heads, i.e. summed over TP ranks)."""
        return 2 * self.num_layers * self.kv_dim * self.dtype_bytes


# Llama-3.1 configs: the published ``config.json`` of meta-llama/Llama-3.1-8B-Instruct
# and -70B-Instruct (the base models differ only in eos_token_id). aiconfigurator-core
# 0.12.0 ships the base models' configs (model_configs/meta-llama--Meta-Llama-3.1-*_config.json)
# with the same shapes.
_LLAMA_3_1_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 128256,
}

LLAMA_3_1_8B = ModelArch(
    name="meta-llama/Llama-3.1-8B-Instruct",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    hf_config={**_LLAMA_3_1_COMMON, "hidden_size": 4096, "intermediate_size": 14336,
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8},
)

LLAMA_3_1_70B = ModelArch(
    name="meta-llama/Llama-3.1-70B-Instruct",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=28672,
    vocab_size=128256,
    hf_config={**_LLAMA_3_1_COMMON, "hidden_size": 8192, "intermediate_size": 28672,
               "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8},
)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet numbers (dense, no sparsity; bytes, not bits).

    ``memory_bytes`` is what CUDA reports as the device total (what vLLM
    multiplies by ``gpu_memory_utilization``), slightly under the marketing
    capacity. Bandwidths are per direction. Achievable fractions of these
    peaks are the step models' business (their efficiency constants), not
    the spec's.
    """

    name: str
    peak_tflops_bf16: float
    hbm_bytes_per_s: float
    memory_bytes: int
    pcie_host_bytes_per_s: float
    nvlink_bytes_per_s: float

    def __post_init__(self) -> None:
        for name in ("peak_tflops_bf16", "hbm_bytes_per_s", "memory_bytes",
                     "pcie_host_bytes_per_s", "nvlink_bytes_per_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"GpuSpec {self.name!r}: {name} must be > 0, got {value!r}")

    @property
    def peak_flops_bf16(self) -> float:
        return self.peak_tflops_bf16 * 1e12


# H100 SXM5 80 GB. NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column):
# BF16 Tensor Core 1,979 TFLOPS *with sparsity* -> 989.4 dense; HBM3 3.35 TB/s;
# NVLink 900 GB/s (bidirectional) -> 450 GB/s per direction; PCIe Gen5 x16
# 128 GB/s (bidirectional) -> 64 GB/s per direction. aiconfigurator-core 0.12.0's
# systems/h100_sxm.yaml uses the same numbers (bfloat16_tc_flops 989e12, mem_bw
# 3.35e12, intra_node_bw 450e9, pcie_bw 64e9). Memory: CUDA reports 79.19 GiB
# for the 80 GB part (vLLM's start-up line "total_gpu_memory (79.19GiB) x
# gpu_memory_utilization (0.90)"), not 80 GiB.
H100_SXM = GpuSpec(
    name="H100-SXM5-80GB",
    peak_tflops_bf16=989.4,
    hbm_bytes_per_s=3.35e12,
    memory_bytes=int(79.19 * GIB),
    pcie_host_bytes_per_s=64e9,
    nvlink_bytes_per_s=450e9,
)

# H200 SXM 141 GB. NVIDIA H200 datasheet: same Hopper compute as H100 SXM
# (BF16 1,979 TFLOPS sparse -> 989.4 dense), HBM3e 4.8 TB/s, NVLink 900 GB/s,
# PCIe Gen5 (64 GB/s per direction); aiconfigurator's systems/h200_sxm.yaml agrees.
# Memory: 141 GB of HBM3e; CUDA reports about 139.8 GiB.
H200_SXM = GpuSpec(
    name="H200-SXM-141GB",
    peak_tflops_bf16=989.4,
    hbm_bytes_per_s=4.8e12,
    memory_bytes=int(139.8 * GIB),
    pcie_host_bytes_per_s=64e9,
    nvlink_bytes_per_s=450e9,
)

# What vLLM keeps on each GPU besides weights and KV cache: the profile run's
# activation peak (8,192 batched tokens, plus a sampler warm-up over
# max_num_seqs rows of fp32 logits: 1,024 x 128,256 x 4 B = 0.5 GiB), non-torch
# memory (cuBLAS workspaces, the CUDA context's allocations) and, since vLLM
# 0.32 counts it by default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1,
# v1/worker/gpu_worker.py determine_available_memory), the CUDA-graph pool.
# aiconfigurator-core 0.12.0 budgets the same things as `other_mem: 3758096384`
# (3.5 GiB) in systems/h100_sxm.yaml ("for safer deployment"); we use that, and
# its `nccl_mem` for NCCL's buffers under tensor parallelism.
ACTIVATION_ALLOWANCE_BYTES = 3758096384
NCCL_BUFFER_BYTES: dict[int, int] = {1: 0, 2: 358612992, 4: 411041792, 8: 411041792}


@dataclass(frozen=True, kw_only=True)
class SimProfile:
    """One deployment: model x GPU x tensor parallelism, plus vLLM's limits.

    Invariants: ``tp >= 1`` divides ``num_kv_heads`` (each rank keeps whole KV
    heads); ``0 < gpu_memory_utilization <= 1``; :meth:`num_gpu_blocks` > 0.
    ``aic_*`` name the same deployment in aiconfigurator-core's data (its
    system yaml, its model config, the vLLM version its data was measured on).
    """

    name: str
    model: ModelArch
    gpu: GpuSpec
    tp: int
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    aic_system_name: str
    aic_model_name: str
    aic_backend_version: str = "0.24.0"

    def __post_init__(self) -> None:
        if self.tp < 1 or self.model.num_kv_heads % self.tp:
            raise ValueError(
                f"profile {self.name!r}: tp={self.tp} must be >= 1 and divide "
                f"num_kv_heads={self.model.num_kv_heads}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"profile {self.name!r}: gpu_memory_utilization={self.gpu_memory_utilization!r} "
                "must be in (0, 1]"
            )
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"profile {self.name!r}: {name} must be > 0, got {getattr(self, name)!r}")
        if self.num_gpu_blocks() <= 0:
            raise ValueError(f"profile {self.name!r}: the weights do not leave room for a KV cache")

    # -- per-GPU sizes -----------------------------------------------------

    def weight_bytes_per_gpu(self) -> float:
        # vLLM shards every linear layer and the (vocab-parallel) embedding and
        # LM head over the TP ranks; norms are replicated but negligible.
        return self.model.weight_bytes() / self.tp

    def kv_bytes_per_token_per_gpu(self) -> int:
        # Each rank keeps num_kv_heads / tp heads of every token (tp divides them).
        return self.model.kv_bytes_per_token() // self.tp

    def overhead_bytes_per_gpu(self) -> int:
        """Non-weight, non-KV memory per GPU (see ACTIVATION_ALLOWANCE_BYTES)."""
        return ACTIVATION_ALLOWANCE_BYTES + NCCL_BUFFER_BYTES.get(self.tp, NCCL_BUFFER_BYTES[8])

    def kv_cache_bytes_per_gpu(self) -> float:
        usable = self.gpu.memory_bytes * self.gpu_memory_utilization
        return usable - self.weight_bytes_per_gpu() - self.overhead_bytes_per_gpu()

    def num_gpu_blocks(self) -> int:
        """KV blocks vLLM would allocate, as ``determine_available_memory`` does.

        Per GPU: ``memory * utilization - weights / tp - overhead``, divided by
        one block's bytes on that GPU (``block_size`` tokens x its KV heads).
        Every rank holds the same token positions, so the pool's block count
        is the per-GPU count (not tp times it). With the numbers above:
        h100-llama8b 27,040 blocks (432,640 tokens), h100-llama70b-tp4 28,290
        (simulation.md: ~27,000 and ~28,400), h200-llama8b 54,969.
        """
        per_block = self.kv_bytes_per_token_per_gpu() * self.block_size
        return max(0, int(self.kv_cache_bytes_per_gpu() // per_block))

    def kv_pool_tokens(self) -> int:
        return self.num_gpu_blocks() * self.block_size


# vLLM 0.32's defaults for an OpenAI-compatible server on a >= 70 GiB non-A100
# GPU (H100 and H200): max_num_batched_tokens 8192, max_num_seqs 1024.
# Source: vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults (branch
# `device_memory >= 70 * GiB_bytes and "a100" not in device_name`,
# UsageContext.OPENAI_API_SERVER), applied by
# EngineArgs._set_default_max_num_seqs_and_batched_tokens_args. These do not
# scale with TP (only the CPU branch multiplies by world_size); >= 160 GiB
# GPUs (B200) get 16384 / 1024.
VLLM_H100_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_H100_MAX_NUM_SEQS = 1024

PROFILES: dict[str, SimProfile] = {
    "h100-llama8b": SimProfile(
        name="h100-llama8b",
        model=LLAMA_3_1_8B,
        gpu=H100_SXM,
        tp=1,
        max_num_seqs=VLLM_H100_MAX_NUM_SEQS,
        max_num_batched_tokens=VLLM_H100_MAX_NUM_BATCHED_TOKENS,
        max_model_len=131072,
        aic_system_name="h100_sxm",
        aic_model_name="meta-llama/Meta-Llama-3.1-8B",
    ),
    "h100-llama70b-tp4": SimProfile(
        name="h100-llama70b-tp4",
        model=LLAMA_3_1_70B,
        gpu=H100_SXM,
        tp=4,
        max_num_seqs=VLLM_H100_MAX_NUM_SEQS,
        max_num_batched_tokens=VLLM_H100_MAX_NUM_BATCHED_TOKENS,
        max_model_len=131072,
        aic_system_name="h100_sxm",
        aic_model_name="meta-llama/Meta-Llama-3.1-70B",
    ),
    "h200-llama8b": SimProfile(
        name="h200-llama8b",
        model=LLAMA_3_1_8B,
        gpu=H200_SXM,
        tp=1,
        max_num_seqs=VLLM_H100_MAX_NUM_SEQS,
        max_num_batched_tokens=VLLM_H100_MAX_NUM_BATCHED_TOKENS,
        max_model_len=131072,
        aic_system_name="h200_sxm",
        aic_model_name="meta-llama/Meta-Llama-3.1-8B",
    ),
}


def get_profile(name: str) -> SimProfile:
    """The profile called ``name``; the error lists the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


def write_config_dir(profile: SimProfile, path: str) -> str:
    """Write a config-only Hugging Face model directory for ``profile`` at ``path``.

    The directory holds one ``config.json`` (the model's own, with
    ``max_position_embeddings`` raised to ``profile.max_model_len`` if that is
    larger) and no weights or tokenizer: it is enough for
    ``vllm.config.ModelConfig(model=path, skip_tokenizer_init=True,
    max_model_len=profile.max_model_len)``, which is all the scheduler needs.
    Idempotent; returns ``path``.
    """
    config = dict(profile.model.hf_config)
    if not config:
        raise ValueError(f"profile {profile.name!r}: model {profile.model.name!r} has no hf_config to write")
    config["max_position_embeddings"] = max(int(config.get("max_position_embeddings", 0)),
                                            profile.max_model_len)
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "config.json")
    tmp = target + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, target)  # atomic: a concurrent reader never sees half a file
    return path
