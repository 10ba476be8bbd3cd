"""The simulator's step-time models and GPU profiles (pure logic; seconds).

The roofline's physics (monotone, additive over mixed batches, TP costs,
transfer costs linear in bytes), the CPU model's fit, the profiles' KV pool
sizes, and -- where the packages are installed -- that vLLM accepts a
profile's config-only model directory and that the roofline stays within 25%
of aiconfigurator.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import random

import numpy as np
import pytest

from vllm_continuum_plugin.benchmarks.sim.batch import BatchShape, PrefillChunk
from vllm_continuum_plugin.benchmarks.sim.profiles import (
    GIB,
    LLAMA_3_1_8B,
    LLAMA_3_1_70B,
    PROFILES,
    get_profile,
    write_config_dir,
)
from vllm_continuum_plugin.benchmarks.sim.step_model import (
    CpuStepModel,
    RooflineConstants,
    RooflineStepModel,
    StepModel,
    nnls,
    pcie_transfer_seconds,
)
from vllm_continuum_plugin.benchmarks.sim.step_model_factory import make_step_model

P8 = PROFILES["h100-llama8b"]
P70 = PROFILES["h100-llama70b-tp4"]


def prefill(new: int, cached: int = 0) -> BatchShape:
    return BatchShape(prefills=(PrefillChunk(new, cached),))


def decode(n: int, ctx: int) -> BatchShape:
    return BatchShape(decode_contexts=(ctx,) * n)


# -- profiles ------------------------------------------------------------------


def test_model_params_match_published_counts() -> None:
    # Llama-3.1-8B: 8.03B parameters; 70B: 70.6B (Meta's model cards).
    assert LLAMA_3_1_8B.params() == 8_030_261_248
    assert LLAMA_3_1_70B.params() == 70_553_706_496
    # K and V, 8 KV heads x 128, bf16, per layer.
    assert LLAMA_3_1_8B.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    assert LLAMA_3_1_70B.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2


def test_profile_block_counts_in_sane_range() -> None:
    # simulation.md: ~27,000 blocks for 8B TP1 and ~28,400 for 70B TP4 on H100 at 0.9.
    assert 26_000 <= P8.num_gpu_blocks() <= 28_000
    assert 27_500 <= P70.num_gpu_blocks() <= 29_000
    # The H200's extra HBM roughly doubles the 8B pool.
    assert 1.8 * P8.num_gpu_blocks() < PROFILES["h200-llama8b"].num_gpu_blocks() < 2.2 * P8.num_gpu_blocks()
    # Three 150k-token sessions fill the 8B pool (simulation.md).
    assert 2 * 150_000 < P8.kv_pool_tokens() < 3 * 150_000
    for profile in PROFILES.values():
        kv = profile.num_gpu_blocks() * profile.block_size * profile.kv_bytes_per_token_per_gpu()
        assert kv <= profile.gpu.memory_bytes * profile.gpu_memory_utilization - profile.weight_bytes_per_gpu()


def test_profiles_carry_vllm_h100_server_defaults() -> None:
    for profile in PROFILES.values():
        assert (profile.max_num_seqs, profile.max_num_batched_tokens) == (1024, 8192)
        assert profile.max_model_len == profile.model.hf_config["max_position_embeddings"]


def test_profile_validation_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="tp=3"):
        dataclasses.replace(P8, tp=3)
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5"):
        dataclasses.replace(P8, gpu_memory_utilization=1.5)
    tiny_gpu = dataclasses.replace(P8.gpu, memory_bytes=10 * GIB)
    with pytest.raises(ValueError, match="room for a KV cache"):
        dataclasses.replace(P8, gpu=tiny_gpu)
    with pytest.raises(ValueError, match="'nope'.*h100-llama8b"):
        get_profile("nope")
    assert get_profile("h100-llama8b") is P8
    hash(P8)  # frozen profiles can key caches despite the hf_config dict


def test_write_config_dir(tmp_path) -> None:
    path = write_config_dir(P70, str(tmp_path / "llama70b"))
    with open(f"{path}/config.json", encoding="utf-8") as fh:
        config = json.load(fh)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (80, 8192, 8)
    assert sorted(p.name for p in (tmp_path / "llama70b").iterdir()) == ["config.json"]  # no weights
    assert write_config_dir(P70, path) == path  # idempotent


def test_config_dir_accepted_by_vllm_model_config(tmp_path) -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    from vllm.config import ModelConfig

    path = write_config_dir(P8, str(tmp_path / "llama8b"))
    config = ModelConfig(model=path, dtype="bfloat16", seed=0, skip_tokenizer_init=True,
                         max_model_len=P8.max_model_len)
    assert config.max_model_len == P8.max_model_len
    assert config.architectures == ["LlamaForCausalLM"]
    assert config.get_head_size() == 128


# -- roofline ------------------------------------------------------------------


@pytest.fixture(scope="module")
def r8() -> RooflineStepModel:
    return RooflineStepModel(P8)


@pytest.fixture(scope="module")
def r70() -> RooflineStepModel:
    return RooflineStepModel(P70)


def test_roofline_is_a_step_model(r8: RooflineStepModel) -> None:
    assert isinstance(r8, StepModel)
    assert isinstance(make_step_model("roofline", P8), RooflineStepModel)
    assert r8.step_seconds(BatchShape()) == 0.0
    assert r8.step_seconds(prefill(1)) > 0
    assert r8.step_seconds(decode(1, 0)) > 0
    batch = BatchShape(prefills=(PrefillChunk(300, 7000),), decode_contexts=(5, 90_000))
    assert r8.step_seconds(batch) == r8.step_seconds(batch)  # deterministic


def test_roofline_monotone_in_tokens_and_context(r8: RooflineStepModel, r70: RooflineStepModel) -> None:
    for model in (r8, r70):
        times = [model.step_seconds(prefill(n)) for n in (1, 16, 256, 1024, 4096, 16384)]
        assert times == sorted(times) and times[0] < times[-1]
        times = [model.step_seconds(prefill(2048, c)) for c in (0, 1000, 10_000, 100_000)]
        assert times == sorted(times) and times[0] < times[-1]
        times = [model.step_seconds(decode(b, 4000)) for b in (1, 8, 64, 256, 1024)]
        assert times == sorted(times) and times[0] < times[-1]
        times = [model.step_seconds(decode(16, c)) for c in (0, 100, 10_000, 100_000)]
        assert times == sorted(times) and times[0] < times[-1]


def test_roofline_regimes(r8: RooflineStepModel) -> None:
    # Large prefills are compute-bound: 4x the tokens costs ~4x (plus causal attention).
    ratio = r8.step_seconds(prefill(16384)) / r8.step_seconds(prefill(4096))
    assert 4.0 < ratio < 5.5
    # Small decode batches are bound by reading the weights once: 1 vs 8 decodes cost about the same.
    assert r8.step_seconds(decode(8, 100)) < 1.05 * r8.step_seconds(decode(1, 100))
    # ... and the weight read is the floor: 16 GB at ~2.6 TB/s.
    assert 5e-3 < r8.step_seconds(decode(1, 1)) < 8e-3


def test_roofline_mixed_batch_adds_attention_and_shares_the_dense_pass(r8: RooflineStepModel,
                                                                      r70: RooflineStepModel) -> None:
    for model in (r8, r70):
        pre = prefill(2048, 20_000)
        dec = decode(32, 20_000)
        mixed = BatchShape(prefills=pre.prefills, decode_contexts=dec.decode_contexts)
        bp, bd, bm = model.breakdown(pre), model.breakdown(dec), model.breakdown(mixed)
        # The parts are added, not max'ed ...
        assert bm.attention_prefill == pytest.approx(bp.attention_prefill)
        assert bm.attention_decode == pytest.approx(bd.attention_decode)
        assert bm.overhead == bp.overhead == bd.overhead  # once per step
        assert bm.total == pytest.approx(bm.overhead + bm.linear + bm.attention_prefill
                                         + bm.attention_decode + bm.allreduce + bm.transfer)
        assert model.step_seconds(mixed) > max(model.step_seconds(pre), model.step_seconds(dec))
        # ... and the weights are read once: the mixed step is the sum of the parts
        # less one overhead and less (at most) one weight read.
        sum_parts = model.step_seconds(pre) + model.step_seconds(dec) - bp.overhead
        weight_read = model.step_seconds(decode(1, 0)) - bp.overhead
        assert sum_parts - weight_read <= model.step_seconds(mixed) <= sum_parts


def test_roofline_compute_bound_mixed_is_exactly_additive() -> None:
    # With a pure max() roofline and both parts compute-bound, the dense pass is
    # linear in tokens too: mixed = prefill + prefill' - one overhead exactly.
    model = RooflineStepModel(P8, dataclasses.replace(RooflineConstants(), roofline_sharpness=math.inf))
    a, b = prefill(4096, 1000), prefill(8192, 30_000)
    both = BatchShape(prefills=a.prefills + b.prefills)
    assert model.step_seconds(both) == pytest.approx(
        model.step_seconds(a) + model.step_seconds(b) - model.constants.step_overhead_s, rel=1e-9)


def test_tp4_70b_slower_per_token_than_8b_by_a_sane_factor(r8: RooflineStepModel, r70: RooflineStepModel) -> None:
    # Dense-dominated steps: 8.8x the weights over 4 GPUs is ~2.2x per GPU, plus
    # all-reduces: 2-3.5x.
    for batch in (prefill(8192), decode(1, 1000), decode(64, 100)):
        ratio = r70.step_seconds(batch) / r8.step_seconds(batch)
        assert 2.0 < ratio < 3.5, (batch, ratio)
    # Context-dominated steps: per GPU, 70B TP4 has 80 x 64 / 4 attention
    # head-layers and 80 x 8 / 4 KV head-layers against 8B's 32 x 32 and 32 x 8
    # (1.25x each), while 8B's per-token KV is 1.6x 70B's per GPU: the ratio
    # falls towards 1 (aiconfigurator: 1.86x for 2048 new after 50k cached,
    # 1.36x for 64 decodes at 4k, 1.09x for 4 decodes at 100k).
    for batch in (prefill(2048, 50_000), decode(64, 4000), decode(4, 100_000)):
        ratio = r70.step_seconds(batch) / r8.step_seconds(batch)
        assert 1.0 < ratio < 2.2, (batch, ratio)
    assert r8.breakdown(prefill(4096)).allreduce == 0.0
    assert r70.breakdown(prefill(4096)).allreduce > r70.breakdown(decode(1, 10)).allreduce > 0.0


def test_transfer_costs_scale_with_bytes(r8: RooflineStepModel, r70: RooflineStepModel) -> None:
    base = prefill(512, 4096)
    for model, profile in ((r8, P8), (r70, P70)):
        costs = [model.step_seconds(dataclasses.replace(base, loaded_tokens=n)) - model.step_seconds(base)
                 for n in (0, 1000, 2000, 4000)]
        assert costs[0] == 0.0
        assert costs[2] == pytest.approx(2 * costs[1]) and costs[3] == pytest.approx(4 * costs[1])
        stored = dataclasses.replace(base, stored_tokens=1000)
        assert model.step_seconds(stored) - model.step_seconds(base) == pytest.approx(costs[1])
        # 1000 tokens of 8B KV (131 MB) over ~51 GB/s PCIe: ~2.6 ms.
        expected = 1000 * profile.kv_bytes_per_token_per_gpu() / (64e9 * 0.8)
        assert costs[1] == pytest.approx(expected)
    # Per GPU: each TP4 rank moves a quarter of 70B's (2.5x larger) KV.
    moved = BatchShape(loaded_tokens=1000)
    assert pcie_transfer_seconds(P70, moved) / pcie_transfer_seconds(P8, moved) == pytest.approx(2.5 / 4)
    assert r8.step_seconds(moved) == pytest.approx(pcie_transfer_seconds(P8, moved))  # no compute


def test_roofline_orders_of_magnitude(r8: RooflineStepModel) -> None:
    # simulation.md's aiconfigurator numbers for 8B on one H100, within 25%.
    for batch, ms in ((prefill(8000), 194), (prefill(8000, 20_000), 320), (decode(64, 20_000), 60),
                      (BatchShape(prefills=(PrefillChunk(2048, 20_000),), decode_contexts=(20_000,) * 32), 103)):
        assert r8.step_seconds(batch) * 1e3 == pytest.approx(ms, rel=0.25), batch


def test_roofline_rejects_bad_chunks_and_constants(r8: RooflineStepModel) -> None:
    with pytest.raises(ValueError, match="new_tokens"):
        r8.step_seconds(BatchShape(prefills=(PrefillChunk(0, 10),)))
    with pytest.raises(ValueError, match="linear_mfu"):
        RooflineConstants(linear_mfu=1.5)
    with pytest.raises(ValueError, match="roofline_sharpness"):
        RooflineConstants(roofline_sharpness=0.5)


# -- CPU model -----------------------------------------------------------------


def random_batch(rng: random.Random) -> BatchShape:
    prefills = tuple(PrefillChunk(rng.randint(1, 512), rng.choice([0, rng.randint(0, 4000)]))
                     for _ in range(rng.choice([0, 0, 1, 2])))
    decodes = tuple(rng.randint(0, 8000) for _ in range(rng.randint(0 if prefills else 1, 24)))
    return BatchShape(prefills=prefills, decode_contexts=decodes, loaded_tokens=rng.choice([0, 0, 0, 256]))


def test_cpu_model_fit_recovers_known_coefficients() -> None:
    truth = CpuStepModel(c0=2e-3, c_tok=5e-5, c_attn=3e-9, c_dec=4e-4, c_kv=2e-7, c_xfer=1e-6)
    rng = random.Random(7)
    batches = [random_batch(rng) for _ in range(300)]
    samples = [(b, truth.step_seconds(b)) for b in batches]
    for relative in (True, False):
        fitted = CpuStepModel.fit(samples, relative=relative)
        for got, want in zip(fitted.coefficients(), truth.coefficients()):
            assert got == pytest.approx(want, rel=1e-6)
    # With 2% multiplicative noise the fit is still close.
    noisy = [(b, t * rng.uniform(0.98, 1.02)) for b, t in samples]
    fitted = CpuStepModel.fit(noisy)
    for b in batches[:50]:
        assert fitted.step_seconds(b) == pytest.approx(truth.step_seconds(b), rel=0.05)


def test_cpu_model_fit_keeps_coefficients_non_negative() -> None:
    # Times that *fall* with decodes would want c_dec < 0: NNLS pins it at 0.
    samples = [(decode(n, 100), 0.01 - 1e-4 * n) for n in range(1, 40)]
    fitted = CpuStepModel.fit(samples)
    assert all(c >= 0 for c in fitted.coefficients())
    assert fitted.c_dec == 0.0


def test_cpu_model_json_roundtrip_and_factory(tmp_path) -> None:
    model = CpuStepModel(c0=1e-3, c_tok=2e-5, c_attn=1e-9, c_dec=3e-4, c_kv=1e-7, name="cpu-fit-test")
    again = CpuStepModel.from_json(model.to_json())
    assert again == model
    path = tmp_path / "fit.json"
    path.write_text(model.to_json())
    loaded = make_step_model("cpu", P8, cpu_fit_path=str(path))
    assert loaded == model and isinstance(loaded, StepModel)
    batch = BatchShape(prefills=(PrefillChunk(64, 100),), decode_contexts=(10, 20))
    assert loaded.step_seconds(batch) == pytest.approx(1e-3 + 64 * 2e-5 + 64 * 132 * 1e-9 + 2 * 3e-4 + 30 * 1e-7)
    with pytest.raises(ValueError, match="unknown keys"):
        CpuStepModel.from_json(json.dumps({"c0": 1, "c_tok": 0, "c_attn": 0, "c_dec": 0, "c_kv": 0, "bogus": 1}))
    with pytest.raises(ValueError, match="c_tok"):
        CpuStepModel(c0=1.0, c_tok=-1.0, c_attn=0, c_dec=0, c_kv=0)


def test_cpu_model_fit_rejects_bad_samples() -> None:
    with pytest.raises(ValueError, match="sample 1"):
        CpuStepModel.fit([(decode(1, 1), 0.01), (decode(1, 2), 0.0)])
    with pytest.raises(ValueError, match="no non-empty"):
        CpuStepModel.fit([(BatchShape(), 0.01)])


def test_nnls_satisfies_kkt_conditions() -> None:
    rng = np.random.default_rng(3)
    a = rng.normal(size=(40, 4))
    b = a @ np.array([1.0, -2.0, 0.5, 0.0]) + rng.normal(scale=0.01, size=40)
    x = nnls(a, b)
    assert (x >= 0).all() and x[1] == 0.0
    # KKT: the gradient vanishes on the free coefficients and is >= 0 on the clamped ones.
    grad = a.T @ (a @ x - b)
    assert np.allclose(grad[x > 0], 0.0, atol=1e-8)
    assert (grad[x == 0] >= -1e-8).all()
    # Degenerate inputs: a zero column, a duplicated column, an all-zero target.
    a2 = np.column_stack([a[:, 0], np.zeros(40), a[:, 0]])
    x2 = nnls(a2, a[:, 0] * 3.0)
    assert x2[1] == 0.0 and x2[0] + x2[2] == pytest.approx(3.0)
    assert (nnls(a, np.zeros(40)) == 0).all()
    with pytest.raises(ValueError, match="shape|need"):
        nnls(a, np.zeros(39))


# -- factory -------------------------------------------------------------------


def test_make_step_model_names_bad_values() -> None:
    with pytest.raises(ValueError, match="'gpu'.*roofline, aiconfigurator, cpu"):
        make_step_model("gpu", P8)
    with pytest.raises(ValueError, match="cpu_fit_path"):
        make_step_model("cpu", P8)
    if importlib.util.find_spec("aiconfigurator_core") is None:
        with pytest.raises(ImportError, match=r"vllm-continuum-plugin\[sim\]"):
            make_step_model("aiconfigurator", P8)


# -- aiconfigurator (only with the `sim` extra) ----------------------------------


@pytest.fixture(scope="module")
def aic_models():
    pytest.importorskip("aiconfigurator_core")
    from vllm_continuum_plugin.benchmarks.sim.aiconfigurator_model import AiconfiguratorStepModel

    return {name: AiconfiguratorStepModel(PROFILES[name]) for name in ("h100-llama8b", "h100-llama70b-tp4")}


AIC_SHAPES = (
    prefill(512), prefill(2048, 20_000), prefill(8192, 100_000),
    decode(1, 1000), decode(64, 4000), decode(4, 100_000),
    BatchShape(prefills=(PrefillChunk(2048, 20_000),), decode_contexts=(2000,) * 128),
    BatchShape(prefills=(PrefillChunk(4000, 0), PrefillChunk(100, 90_000))),
)


@pytest.mark.parametrize("profile_name", ["h100-llama8b", "h100-llama70b-tp4"])
def test_roofline_within_25_percent_of_aiconfigurator(aic_models, profile_name: str) -> None:
    aic = aic_models[profile_name]
    roof = RooflineStepModel(PROFILES[profile_name])
    for batch in AIC_SHAPES:
        assert roof.step_seconds(batch) == pytest.approx(aic.step_seconds(batch), rel=0.25), batch


def test_aiconfigurator_model_contract(aic_models) -> None:
    from vllm_continuum_plugin.benchmarks.sim.aiconfigurator_model import attention_equivalent_kv, fpm_for

    aic = aic_models["h100-llama8b"]
    assert isinstance(aic, StepModel)
    assert aic.step_seconds(BatchShape()) == 0.0
    batch = BatchShape(prefills=(PrefillChunk(300, 7000),), decode_contexts=(5, 90_000), stored_tokens=64)
    first = aic.step_seconds(batch)
    assert first > 0 and aic.step_seconds(batch) == first  # memoised, same answer
    assert aic.cache_info().hits >= 1
    assert first - aic.forward_seconds(batch) == pytest.approx(pcie_transfer_seconds(P8, batch))
    # simulation.md's orders of magnitude (8B on one H100).
    assert aic.step_seconds(prefill(8000)) * 1e3 == pytest.approx(194, rel=0.02)
    assert aic.step_seconds(decode(64, 20_000)) * 1e3 == pytest.approx(60, rel=0.02)
    # The mapping: literal sums for alike chunks; attention-equivalent otherwise.
    alike = BatchShape(prefills=(PrefillChunk(100, 10), PrefillChunk(100, 30)))
    assert attention_equivalent_kv(alike) == 40
    uneven = BatchShape(prefills=(PrefillChunk(4000, 0), PrefillChunk(100, 90_000)))
    s, a = 4100, 4000 * 2000 + 100 * (90_000 + 50)
    assert attention_equivalent_kv(uneven) == round((2 * a - s * s / 2) / s)
    fpm = fpm_for(uneven, literal_prefill_kv=True)["scheduled_requests"]
    assert (fpm["num_prefill_requests"], fpm["sum_prefill_tokens"], fpm["sum_prefill_kv_tokens"]) == (2, 4100, 90_000)
