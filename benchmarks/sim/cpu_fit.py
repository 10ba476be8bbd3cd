"""Fit a :class:`~.step_model.CpuStepModel` to this machine's real vLLM engine.

``python -m benchmarks.sim.cpu_fit --out cpu_fit.json`` starts vLLM's own
engine in this process (``vllm.LLM``, engine core in-process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the embedded model with the *live
A/B server's* settings -- the serving dtype (:func:`benchmarks.dtype.serving_dtype`),
block size, ``max_num_seqs``, ``max_num_batched_tokens`` (vLLM's CPU API-server
default, 2,048), ``max_model_len``, eager mode, the same reserved core
(``VLLM_CPU_NUM_OF_RESERVED_CPU``) and the same multiprocess executor (the
model in a worker process on the cores the reservation leaves) -- and
times every engine step
(``EngineCore.step``: schedule + forward + sample + ``update_from_output``,
exactly the unit the simulator prices) together with the batch it ran, read
off the ``SchedulerOutput`` the same way the replay engine reads it:

* prefills of ``N`` new tokens over ``C`` cached ones (``C`` from the prefix
  cache: a request of the ``C``-token prefix runs first; the shapes' prefix
  is whole blocks);
* decode batches of ``B`` requests at context ``~L`` (``B`` prompts of ``L``
  tokens, each generating a few tokens with ``ignore_eos``);

each repeated on fresh token ids (no hit across repeats), the median time of
every distinct batch shape kept. :meth:`CpuStepModel.fit` (non-negative,
relative least squares) then gives the coefficients; the fit and its
residuals go to stdout, progress to stderr, the model to ``--out``.

:func:`cpu_profile` is the simulator profile of the same deployment (the
model's own ``config.json``, the live server's limits and KV pool), so that a
replay has the live engine's pool, batch limits and block size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .batch import BatchShape, PrefillChunk
from .host import busy_processes, load_average, lscpu_model
from .profiles import ACTIVATION_ALLOWANCE_BYTES, GpuSpec, ModelArch, SimProfile
from .step_model import CpuStepModel

__all__ = [
    "LIVE_LIMITS",
    "EngineLimits",
    "batch_from_scheduler_output",
    "cpu_profile",
    "decode_plan",
    "fit_report",
    "median_samples",
    "model_arch_from_dir",
    "prefill_plan",
]

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class EngineLimits:
    """The live A/B server's engine limits (``benchmarks.ab_benchmark``'s
    defaults; ``max_num_batched_tokens`` is vLLM 0.32's CPU default for an
    OpenAI API server, ``EngineArgs.get_batch_defaults``: 2,048 x world size)."""

    block_size: int = 32
    num_blocks: int = 160
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096


LIVE_LIMITS = EngineLimits()


# ----------------------------------------------------------------------
# Profile
# ----------------------------------------------------------------------
def model_arch_from_dir(model_dir: str, dtype: str = "float32") -> ModelArch:
    """The :class:`ModelArch` of a Hugging Face model directory (its ``config.json``)."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    return ModelArch(
        name=os.path.basename(os.path.normpath(model_dir)),
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads", heads)),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        dtype_bytes=DTYPE_BYTES[dtype],
        hf_config=config,
    )


def cpu_profile(model_dir: str, limits: EngineLimits = LIVE_LIMITS, dtype: str = "float32",
                name: str | None = None) -> SimProfile:
    """A :class:`SimProfile` whose pool is exactly ``limits.num_blocks`` blocks.

    The live server fixes its pool with ``--num-gpu-blocks-override``; a
    ``SimProfile`` derives its pool from a device's memory, so the "device"
    here is sized to leave exactly that many blocks
    (``num_gpu_blocks() == limits.num_blocks``). Its compute and bandwidth
    figures are placeholders: the CPU step model is fitted, it reads none of
    them (the roofline or aiconfigurator models must not be used with it).
    """
    model = model_arch_from_dir(model_dir, dtype)
    per_block = model.kv_bytes_per_token() * limits.block_size
    # weights + allowance + the pool + half a block (so the floor lands on num_blocks)
    memory = model.weight_bytes() + ACTIVATION_ALLOWANCE_BYTES + limits.num_blocks * per_block + per_block // 2
    device = GpuSpec(name="cpu-live-engine", peak_tflops_bf16=1.0, hbm_bytes_per_s=1e11,
                     memory_bytes=int(memory), pcie_host_bytes_per_s=1e10, nvlink_bytes_per_s=1e10)
    profile = SimProfile(
        name=name or f"cpu-{model.name}",
        model=model,
        gpu=device,
        tp=1,
        block_size=limits.block_size,
        gpu_memory_utilization=1.0,
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=limits.max_model_len,
        aic_system_name="none",
        aic_model_name="none",
    )
    if profile.num_gpu_blocks() != limits.num_blocks:  # pragma: no cover - arithmetic guard
        raise AssertionError(f"cpu_profile: pool {profile.num_gpu_blocks()} != {limits.num_blocks}")
    return profile


# ----------------------------------------------------------------------
# Plans and samples (pure)
# ----------------------------------------------------------------------
def prefill_plan(block_size: int, max_batched: int) -> list[tuple[int, int]]:
    """``(new, cached)`` prefill shapes: cold prefills up to half the token
    budget and short and long prefills over a block-aligned cached prefix
    (what agent turns do). Small on purpose: fp32 on one AVX2 core prefills
    ~150 tokens/s, so every 1,000 tokens cost ~7 s."""
    plan = [(n, 0) for n in (16, 64, 256, 512, min(1024, max_batched))]
    for cached in (512, 1536):
        for n in (32, 256):
            plan.append((n, cached))
    return [(n, c // block_size * block_size) for n, c in plan]


def decode_plan() -> list[tuple[int, int]]:
    """``(batch, context)`` decode shapes (up to ``max_num_seqs`` = 16). The
    ``batch`` requests share a cached ``context - 16``-token prefix (a decode
    reads the same KV whether or not its blocks are shared), so setting
    them up costs ``16 x batch`` prefill tokens, not ``context x batch``."""
    return [(b, ctx) for ctx in (64, 512, 1536) for b in (1, 4, 8, 16)]


def batch_from_scheduler_output(output: Any) -> BatchShape:
    """A ``SchedulerOutput``'s batch as the replay engine prices it: a new
    request, or a cached one computing more than one token, is a prefill
    chunk over the tokens computed before it; a cached request computing one
    token is a decode at that context. (Exact for the fit's plans, where
    nothing is preempted and no prompt is one token.)"""
    prefills: list[PrefillChunk] = []
    decodes: list[int] = []
    new_ids = set()
    for req in output.scheduled_new_reqs:
        new_ids.add(req.req_id)
        prefills.append(PrefillChunk(output.num_scheduled_tokens[req.req_id], req.num_computed_tokens))
    cached = output.scheduled_cached_reqs
    for i, req_id in enumerate(cached.req_ids):
        n = output.num_scheduled_tokens[req_id]
        before = cached.num_computed_tokens[i]
        if n == 1:
            decodes.append(before)
        else:
            prefills.append(PrefillChunk(n, before))
    return BatchShape(tuple(prefills), tuple(decodes))


def median_samples(samples: Iterable[tuple[BatchShape, float]]) -> list[tuple[BatchShape, float, int]]:
    """One ``(shape, median seconds, count)`` per distinct batch shape, in
    first-seen order (repeats of a plan give the same shapes)."""
    groups: dict[BatchShape, list[float]] = {}
    for shape, seconds in samples:
        groups.setdefault(shape, []).append(seconds)
    return [(shape, statistics.median(ts), len(ts)) for shape, ts in groups.items()]


def fit_report(model: CpuStepModel, samples: Sequence[tuple[BatchShape, float]]) -> dict[str, Any]:
    """Residuals of ``model`` on ``samples``: relative errors (pred / meas - 1)
    overall and for prefill-only, decode-only and mixed steps."""
    def kind(b: BatchShape) -> str:
        if b.prefills and b.decode_contexts:
            return "mixed"
        return "prefill" if b.prefills else "decode"

    rel: dict[str, list[float]] = {"all": [], "prefill": [], "decode": [], "mixed": []}
    for shape, seconds in samples:
        err = model.step_seconds(shape) / seconds - 1.0
        rel["all"].append(err)
        rel[kind(shape)].append(err)
    out: dict[str, Any] = {}
    for key, errs in rel.items():
        if errs:
            out[key] = {
                "n": len(errs),
                "mean_abs_rel": sum(abs(e) for e in errs) / len(errs),
                "max_abs_rel": max(abs(e) for e in errs),
                "bias": sum(errs) / len(errs),
            }
    return out


def describe_shape(b: BatchShape) -> str:
    parts = [f"P{p.new_tokens}+C{p.cached_tokens}" for p in b.prefills]
    if b.decode_contexts:
        parts.append(f"D{len(b.decode_contexts)}@{sum(b.decode_contexts) / len(b.decode_contexts):.0f}")
    return " ".join(parts)


# ----------------------------------------------------------------------
# Measurement (needs vLLM and the model)
# ----------------------------------------------------------------------
def _log(msg: str) -> None:
    print(f"[cpu_fit] {msg}", file=sys.stderr, flush=True)


class StepTimer:
    """Wraps an in-process ``EngineCore``'s step and scheduler: each step
    that ran the model is recorded as ``(BatchShape, seconds)``."""

    def __init__(self, engine_core: Any) -> None:
        self.core = engine_core
        self.samples: list[tuple[BatchShape, float]] = []
        self.recording = False
        self._last: Any = None
        sched = engine_core.scheduler
        orig_schedule = sched.schedule

        def schedule(*a: Any, **k: Any) -> Any:
            self._last = orig_schedule(*a, **k)
            return self._last

        sched.schedule = schedule
        orig_step = engine_core.step_fn

        def step() -> Any:
            self._last = None
            t = time.perf_counter()
            result = orig_step()
            dt = time.perf_counter() - t
            out = self._last
            if self.recording and out is not None and out.total_num_scheduled_tokens > 0:
                self.samples.append((batch_from_scheduler_output(out), dt))
            return result

        engine_core.step_fn = step


def _tokens(rng: Any, n: int) -> list[int]:
    return rng.integers(1000, 40000, size=n).tolist()


def measure(model_dir: str, limits: EngineLimits, dtype: str, repeats: int, fit_blocks: int,
            decode_tokens: int = 8) -> list[tuple[BatchShape, float]]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")  # as the A/B runner's servers
    import numpy as np
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kv_bytes = fit_blocks * limits.block_size * model_arch_from_dir(model_dir, dtype).kv_bytes_per_token()
    t0 = time.time()
    llm = LLM(
        model=model_dir, dtype=dtype, block_size=limits.block_size, max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens, max_model_len=limits.max_model_len,
        enforce_eager=True, enable_prefix_caching=True, num_gpu_blocks_override=fit_blocks,
        kv_cache_memory_bytes=kv_bytes, seed=0,
        # The live server's executor: the model runs in a worker process that
        # vllm-cpu binds to the cores left after the reservation (1 OMP thread
        # on a 2-core machine). The in-process executor would compute on
        # every core instead: prefills ~1.5x faster than the live server's.
        distributed_executor_backend="mp",
    )
    _log(f"engine up in {time.time() - t0:.0f}s (dtype {dtype}, block {limits.block_size}, "
         f"max_num_batched_tokens {limits.max_num_batched_tokens}, pool {fit_blocks} blocks)")
    core = llm.llm_engine.engine_core.engine_core
    timer = StepTimer(core)
    rng = np.random.default_rng(0)
    one = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)

    def run(prompts: list[list[int]], params: Any) -> None:
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

    # Warm-up: first calls pay one-off kernel set-up (as the A/B runner's warm_up).
    for n in (64, 600):
        run([_tokens(rng, n)], one)
    run([_tokens(rng, 64) for _ in range(4)], SamplingParams(max_tokens=4, ignore_eos=True))
    plans_p = prefill_plan(limits.block_size, limits.max_num_batched_tokens)
    plans_d = decode_plan()
    # Prefixes are made once and stay cached (the pool is large); every
    # measured request adds fresh tokens, so no measured step hits more
    # than its planned prefix.
    prefixes = {c: _tokens(rng, c) for c in sorted({c for _, c in plans_p if c} | {ctx - 16 for _, ctx in plans_d})}
    for prefix in prefixes.values():
        run([prefix], one)
    for r in range(repeats):
        t = time.time()
        for n, cached in plans_p:
            prefix = prefixes[cached] if cached else []
            timer.recording = True
            run([prefix + _tokens(rng, n)], one)
            timer.recording = False
            if r == 0:
                _log(f"  prefill {n}+{cached} cached: {timer.samples[-1][1] * 1e3:.0f} ms")
        for b, ctx in plans_d:
            prefix = prefixes[ctx - 16]
            timer.recording = True
            run([prefix + _tokens(rng, 16) for _ in range(b)],
                SamplingParams(max_tokens=decode_tokens, ignore_eos=True, temperature=0.0))
            timer.recording = False
            if r == 0:
                _log(f"  decode {b} x {ctx}: last step {timer.samples[-1][1] * 1e3:.0f} ms")
        _log(f"repeat {r + 1}/{repeats}: {len(timer.samples)} steps so far ({time.time() - t:.0f}s)")
    return timer.samples


def _decode_key(shape: BatchShape) -> BatchShape:
    """Decode-only steps of one plan differ by one token of context per
    step; bucket their contexts to 64 tokens so repeats pool into medians."""
    if shape.prefills or not shape.decode_contexts:
        return shape
    return BatchShape((), tuple(c // 64 * 64 + 32 for c in shape.decode_contexts))


def lscpu_name() -> str:
    return lscpu_model()


def main(argv: list[str] | None = None) -> int:
    from ..ab_benchmark import DEFAULT_MODEL_DIR
    from ..dtype import serving_dtype

    p = argparse.ArgumentParser(prog="python -m benchmarks.sim.cpu_fit", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="where to write the fitted CpuStepModel (JSON)")
    p.add_argument("--model", default=DEFAULT_MODEL_DIR, help="model directory (default: embedded SmolLM2-135M)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of every shape (median kept; default 3)")
    p.add_argument("--fit-blocks", type=int, default=1024,
                   help="KV pool of the fitting engine, blocks (room for the largest decode batch; default 1024)")
    p.add_argument("--samples-out", help="also write the raw (shape, seconds) samples here (JSON)")
    args = p.parse_args(argv)
    dtype = serving_dtype()
    busy_before, load_before = busy_processes(), load_average()
    raw = measure(args.model, LIVE_LIMITS, dtype, args.repeats, args.fit_blocks)
    pooled = median_samples((_decode_key(s), t) for s, t in raw)
    samples = [(s, t) for s, t, _ in pooled]
    model = CpuStepModel.fit(samples, name=f"cpu-fit[{os.path.basename(os.path.normpath(args.model))},{dtype}]")
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(model.to_json() + "\n")
    if args.samples_out:
        with open(args.samples_out, "w", encoding="utf-8") as fh:
            json.dump([{"prefills": [[c.new_tokens, c.cached_tokens] for c in s.prefills],
                        "decode_contexts": list(s.decode_contexts), "seconds": t, "repeats": k}
                       for s, t, k in pooled], fh)
    busy_after = busy_processes()
    print(f"# machine: {lscpu_name()}; other heavy processes before/after the fit: "
          f"{len(busy_before)}/{len(busy_after)}; load average before {load_before}")
    for line in sorted(set(busy_before) | set(busy_after))[:4]:
        print(f"#   {line[:110]}")
    print(f"# CpuStepModel fitted on {len(raw)} steps ({len(samples)} distinct shapes, medians), dtype {dtype}")
    for key, value in zip(CpuStepModel.FEATURES, model.coefficients()):
        print(f"  {key:>24}: {value:.4g}")
    print("# residuals (predicted / measured - 1)")
    for key, stats in fit_report(model, samples).items():
        print(f"  {key:>8}: n={stats['n']:3d} mean|err|={stats['mean_abs_rel']:.1%} "
              f"max|err|={stats['max_abs_rel']:.1%} bias={stats['bias']:+.1%}")
    print("# per shape: measured ms, predicted ms")
    for shape, t, k in pooled:
        pred = model.step_seconds(shape)
        if not shape.decode_contexts or shape.prefills or k >= 2:
            print(f"  {describe_shape(shape):>30}  x{k:<3d} {t * 1e3:8.2f} {pred * 1e3:8.2f} {pred / t - 1:+6.1%}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
