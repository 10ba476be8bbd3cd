#!/usr/bin/env python3
"""Compare the roofline step model with aiconfigurator over a grid of batch shapes.

    python scripts/compare_step_models.py              # print the table, write docs/step_models.md
    python scripts/compare_step_models.py --no-write   # print only
    python scripts/compare_step_models.py --calibrate  # also search the roofline's constants

Needs the ``sim`` extra (aiconfigurator-core). The grid, for each
profile (H100 with Llama-3.1-8B TP1 and 70B TP4; H200 with 8B TP1):

* prefill: one chunk of 512..16k new tokens after 0..100k cached ones;
* decode: 1..256 requests at 1k..100k tokens of context;
* mixed: one chunk (fresh or after cached context) with 8..128 decodes;
* batched prefill: several prompts in one step, equal or unequal chunks.

A shape whose KV (cached + new + decode contexts) exceeds the profile's KV
pool cannot occur in a replay; it is listed but left out of the error
statistics. Errors are ``roofline / aiconfigurator - 1``.

``--calibrate`` runs a coordinate search over :class:`RooflineConstants`
minimising ``median |err| + 0.5 * max |err|`` over the two H100 profiles'
feasible shapes (the H200 profile is compared, not calibrated on) and prints the best constants (to be copied into step_model.py by
hand: the defaults there are what docs/step_models.md reports).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join(ROOT, "docs", "step_models.md")

try:  # installed (editable) plugin
    from vllm_continuum_plugin.benchmarks.sim.batch import BatchShape, PrefillChunk
    from vllm_continuum_plugin.benchmarks.sim.profiles import PROFILES, SimProfile
    from vllm_continuum_plugin.benchmarks.sim.step_model import RooflineConstants, RooflineStepModel
except ImportError:  # a plain checkout: the folder is importable as `benchmarks`
    sys.path.insert(0, ROOT)
    from benchmarks.sim.batch import BatchShape, PrefillChunk  # type: ignore[no-redef]
    from benchmarks.sim.profiles import PROFILES, SimProfile  # type: ignore[no-redef]
    from benchmarks.sim.step_model import RooflineConstants, RooflineStepModel  # type: ignore[no-redef]

# The constants are calibrated on the two H100 profiles; the H200 one is an
# out-of-sample check (same compute, faster HBM).
CALIBRATION_PROFILES = ("h100-llama8b", "h100-llama70b-tp4")
COMPARED_PROFILES = (*CALIBRATION_PROFILES, "h200-llama8b")


@dataclass(frozen=True)
class Shape:
    kind: str
    label: str
    batch: BatchShape

    def kv_tokens(self) -> int:
        b = self.batch
        return (sum(p.cached_tokens + p.new_tokens for p in b.prefills)
                + sum(c + 1 for c in b.decode_contexts))


def grid() -> list[Shape]:
    """The compared shapes (profile-independent; feasibility is checked per profile)."""
    shapes: list[Shape] = []
    for cached in (0, 10_000, 50_000, 100_000):
        for new in (512, 1024, 2048, 4096, 8192, 16384):
            shapes.append(Shape("prefill", f"{new} new after {cached} cached",
                                BatchShape(prefills=(PrefillChunk(new, cached),))))
    for ctx in (1_000, 4_000, 10_000, 50_000, 100_000):
        for bs in (1, 4, 16, 64, 256):
            shapes.append(Shape("decode", f"{bs} decodes at {ctx}",
                                BatchShape(decode_contexts=(ctx,) * bs)))
    for new, cached in ((512, 0), (2048, 0), (2048, 20_000), (4096, 50_000)):
        for bs, ctx in ((8, 2_000), (16, 20_000), (64, 4_000), (128, 2_000)):
            shapes.append(Shape("mixed", f"{new} new after {cached} + {bs} decodes at {ctx}",
                                BatchShape(prefills=(PrefillChunk(new, cached),), decode_contexts=(ctx,) * bs)))
    for n, new in ((4, 2048), (8, 1024), (16, 512)):
        shapes.append(Shape("prefill-batch", f"{n} fresh prompts of {new}",
                            BatchShape(prefills=tuple(PrefillChunk(new, 0) for _ in range(n)))))
    # Unequal chunks, as chunked prefill packs them (aiconfigurator sees the
    # attention-equivalent cached sum: aiconfigurator_model's docstring).
    for chunks in (((4000, 0), (100, 90_000)), ((6000, 0), (1000, 30_000), (1000, 0)),
                   ((2048, 20_000), (512, 0), (256, 0), (128, 0))):
        label = " + ".join(f"{n} after {c}" for n, c in chunks)
        shapes.append(Shape("prefill-batch", label,
                            BatchShape(prefills=tuple(PrefillChunk(n, c) for n, c in chunks))))
    return shapes


# Shapes outside the grid where the two models are known to part ways; shown
# in their own table (not in the statistics) with the reason.
EDGE_SHAPES: tuple[tuple[str, BatchShape, str], ...] = (
    ("16 new, fresh", BatchShape(prefills=(PrefillChunk(16, 0),)),
     "tiny prefills: aiconfigurator's prefill path costs 0.5-1.2 ms more than a decode step of as many "
     "tokens; the roofline prices both alike"),
    ("1 new after 100000 cached", BatchShape(prefills=(PrefillChunk(1, 100_000),)),
     "a 1-token chunk must read all 100k tokens of KV, as a decode does (aiconfigurator's own "
     "decode at 100k costs ~11.5 ms on 8B); aiconfigurator's prefill attention prices it near zero"),
    ("1 decode at 100000", BatchShape(decode_contexts=(100_000,)),
     "the decode of the row above, for comparison"),
)


@dataclass
class Row:
    profile: str
    shape: Shape
    feasible: bool
    aic_ms: float
    roof_ms: float

    @property
    def err(self) -> float:
        return self.roof_ms / self.aic_ms - 1.0


def aic_times(profiles: Sequence[SimProfile], shapes: Sequence[Shape]) -> dict[tuple[str, int], float]:
    try:
        from vllm_continuum_plugin.benchmarks.sim.aiconfigurator_model import AiconfiguratorStepModel
    except ImportError:
        from benchmarks.sim.aiconfigurator_model import AiconfiguratorStepModel  # type: ignore[no-redef]
    out: dict[tuple[str, int], float] = {}
    for profile in profiles:
        model = AiconfiguratorStepModel(profile)
        for i, shape in enumerate(shapes):
            out[(profile.name, i)] = model.forward_seconds(shape.batch) * 1e3
    return out


def edge_rows(profiles: Sequence[SimProfile], constants: RooflineConstants) -> list[str]:
    """Markdown rows for EDGE_SHAPES, plus one for aiconfigurator's literal prefill mapping."""
    try:
        from vllm_continuum_plugin.benchmarks.sim.aiconfigurator_model import AiconfiguratorStepModel
    except ImportError:
        from benchmarks.sim.aiconfigurator_model import AiconfiguratorStepModel  # type: ignore[no-redef]
    uneven = BatchShape(prefills=(PrefillChunk(4000, 0), PrefillChunk(100, 90_000)))
    out = []
    for profile in profiles:
        aic = AiconfiguratorStepModel(profile)
        literal = AiconfiguratorStepModel(profile, literal_prefill_kv=True)
        roof = RooflineStepModel(profile, constants)
        cases = [(label, batch, why, aic) for label, batch, why in EDGE_SHAPES]
        cases.append(("4000 after 0 + 100 after 90000, literal cached sum", uneven,
                      "aiconfigurator given the literal sum_prefill_kv_tokens prices two equal requests "
                      "of 2050 new after 45000 cached: why the wrapper passes the attention-equivalent sum",
                      literal))
        for label, batch, why, model in cases:
            a = model.forward_seconds(batch) * 1e3
            r = roof.step_seconds(batch) * 1e3
            out.append(f"| {profile.name} | {label} | {a:.2f} | {r:.2f} | {r / a - 1:+.1%} | {why} |")
    return out


def rows_for(profiles: Sequence[SimProfile], shapes: Sequence[Shape], aic: dict[tuple[str, int], float],
             constants: RooflineConstants) -> list[Row]:
    rows = []
    for profile in profiles:
        roof = RooflineStepModel(profile, constants)
        pool = profile.kv_pool_tokens()
        for i, shape in enumerate(shapes):
            rows.append(Row(profile.name, shape, shape.kv_tokens() <= pool, aic[(profile.name, i)],
                            roof.step_seconds(shape.batch) * 1e3))
    return rows


def stats(rows: Sequence[Row]) -> tuple[float, float, int]:
    errs = [abs(r.err) for r in rows if r.feasible]
    if not errs:
        return 0.0, 0.0, 0
    return statistics.median(errs), max(errs), len(errs)


def score(rows: Sequence[Row]) -> float:
    med, mx, _ = stats(rows)
    return med + 0.5 * mx


def calibrate(profiles: Sequence[SimProfile], shapes: Sequence[Shape], aic: dict[tuple[str, int], float],
              start: RooflineConstants, log: Callable[[str], None]) -> RooflineConstants:
    """Coordinate search: each constant in turn over a ladder of candidates, until no move helps."""
    ladders: dict[str, list[float]] = {
        "linear_mfu": [x / 100 for x in range(50, 96, 2)],
        "attention_mfu": [x / 100 for x in range(30, 96, 3)],
        "weight_bandwidth_eff": [x / 100 for x in range(60, 100, 2)],
        "kv_bandwidth_eff": [x / 100 for x in range(60, 100, 2)],
        "roofline_sharpness": [1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, float("inf")],
        "nvlink_eff": [x / 100 for x in range(40, 101, 5)],
        "allreduce_latency_s": [x * 1e-6 for x in (0, 2, 4, 6, 8, 10, 12, 15, 20, 25, 30)],
        "step_overhead_s": [x * 1e-4 for x in (0, 1, 2, 3, 5, 7, 10, 15, 20)],
    }
    best = start
    best_score = score(rows_for(profiles, shapes, aic, best))
    for sweep in range(6):
        moved = False
        for name, ladder in ladders.items():
            for value in ladder:
                cand = dataclasses.replace(best, **{name: value})
                s = score(rows_for(profiles, shapes, aic, cand))
                if s < best_score - 1e-9:
                    best, best_score, moved = cand, s, True
        log(f"calibration sweep {sweep}: score {best_score:.4f} {best}")
        if not moved:
            break
    return best


def kept_device_section(path: str) -> str:
    """The GPU measurements' section of the doc at ``path`` (written by
    scripts/device_step_timing.py on a lent GPU), to be kept when this
    rewrites the rest; "" when there is none."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from device_step_timing import BEGIN, END

    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as fh:
        old = fh.read()
    if BEGIN not in old or END not in old.split(BEGIN, 1)[1]:
        return ""
    return "\n" + BEGIN + old.split(BEGIN, 1)[1].split(END, 1)[0] + END + "\n"


def render(rows: Sequence[Row], version: str, command: str, constants: RooflineConstants,
           edges: Sequence[str] = ()) -> str:
    lines = [
        "# Step-time models: roofline vs aiconfigurator",
        "",
        f"Generated by `{command}` with aiconfigurator-core {version} "
        "(vLLM 0.24 kernel data, `RustForwardPassPerfModel.from_native`). Do not edit by hand.",
        "",
        "`err` is `roofline / aiconfigurator - 1` on the forward pass alone (neither side has KV "
        "transfers in these shapes). Shapes marked `no` under `fits` need more KV than the "
        "profile's pool holds: a replay never schedules them, so they are shown but left out "
        "of the statistics. Chunks above 8,192 tokens exceed vLLM's default "
        "`max_num_batched_tokens` on H100 and are there to show the trend.",
        "",
        "Roofline constants (`RooflineConstants` defaults in `benchmarks/sim/step_model.py`):",
        "",
    ]
    for f in dataclasses.fields(constants):
        lines.append(f"- `{f.name}` = {getattr(constants, f.name):g}")
    lines += ["", "## Summary", "", "| profile | kind | shapes | median abs err | max abs err |",
              "|---|---|---:|---:|---:|"]
    profiles = list(dict.fromkeys(r.profile for r in rows))
    kinds = list(dict.fromkeys(r.shape.kind for r in rows))
    for profile in profiles:
        for kind in kinds + ["all"]:
            sel = [r for r in rows if r.profile == profile and (kind == "all" or r.shape.kind == kind)]
            med, mx, n = stats(sel)
            lines.append(f"| {profile} | {kind} | {n} | {med:.1%} | {mx:.1%} |")
    med, mx, n = stats([r for r in rows if r.profile in CALIBRATION_PROFILES])
    lines.append(f"| H100 profiles (calibrated on) | all | {n} | {med:.1%} | {mx:.1%} |")
    med, mx, n = stats(rows)
    lines.append(f"| every profile | all | {n} | {med:.1%} | {mx:.1%} |")
    if edges:
        lines += ["", "## Where they part ways (outside the grid, not in the statistics)", "",
                  "| profile | shape | aiconfigurator ms | roofline ms | err | why |", "|---|---|---:|---:|---:|---|"]
        lines += list(edges)
    for profile in profiles:
        lines += ["", f"## {profile}", "", "| kind | shape | fits | aiconfigurator ms | roofline ms | ratio | err |",
                  "|---|---|---|---:|---:|---:|---:|"]
        for r in rows:
            if r.profile != profile:
                continue
            lines.append(f"| {r.shape.kind} | {r.shape.label} | {'yes' if r.feasible else 'no'} | "
                         f"{r.aic_ms:.2f} | {r.roof_ms:.2f} | {r.roof_ms / r.aic_ms:.3f} | {r.err:+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/step_models.md alone")
    parser.add_argument("--calibrate", action="store_true", help="search the roofline constants and report them")
    parser.add_argument("--output", default=OUTPUT, help="where to write the markdown (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        from vllm_continuum_plugin.benchmarks.sim.aiconfigurator_model import aiconfigurator_version
    except ImportError:
        from benchmarks.sim.aiconfigurator_model import aiconfigurator_version  # type: ignore[no-redef]
    version = aiconfigurator_version()
    if version is None:
        print("aiconfigurator-core is not installed: pip install 'vllm-continuum-plugin[sim]'", file=sys.stderr)
        return 2
    profiles = [PROFILES[name] for name in COMPARED_PROFILES]
    shapes = grid()
    aic = aic_times(profiles, shapes)
    constants = RooflineConstants()
    if args.calibrate:
        calib = [p for p in profiles if p.name in CALIBRATION_PROFILES]
        constants = calibrate(calib, shapes, aic, constants, lambda s: print(s, file=sys.stderr))
        print(f"best constants: {constants}", file=sys.stderr)
    rows = rows_for(profiles, shapes, aic, constants)
    command = "python scripts/compare_step_models.py" + (" --calibrate" if args.calibrate else "")
    calib_profiles = [p for p in profiles if p.name in CALIBRATION_PROFILES]
    text = render(rows, version, command, constants, edge_rows(calib_profiles, constants))
    print(text)
    if not args.no_write:
        os.makedirs(os.path.dirname(args.output), exist_ok=True)
        text += kept_device_section(args.output)
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
