#!/usr/bin/env python3
"""Time a Llama-3.1-8B-shaped model on a real GPU, and set the figures
beside the roofline step model's in docs/step_models.md.

Two halves, because vLLM cannot be installed on the lent GPU machine (its
CUDA wheel is far over what a call can carry, and nothing can be fetched
there) while PyTorch can:

* ``measure`` (on the GPU: PyTorch, and the simulator's stdlib-only
  model shapes; nothing imports vLLM) builds the model on the GPU itself with random bf16 weights --
  32 layers of fused QKV, rotary embedding, grouped-query attention (8 KV
  heads), SwiGLU MLP and RMSNorm, plus the LM head -- and times, with CUDA
  events (median of ``--repeats`` after a warm-up):

  - prefill: ``new`` tokens after ``cached`` ones (1k-32k over 0-64k), the
    whole forward pass. Attention is computed as two
    ``scaled_dot_product_attention`` calls, the new tokens over the cached
    ones (no mask) and over themselves (causal), whose outputs are summed:
    the same FLOPs and KV reads as one causal call over ``cached + new``,
    which SDPA cannot express with a prefix, though not the same values
    (random weights: only the time matters);
  - decode: a batch of ``batch`` sequences at ``context`` tokens each (1-256
    at 4k-64k), one token each, attention reading every sequence's KV once
    (grouped-query, as vLLM's kernels do);
  - pinned host <-> device copies of KV-sized buffers (the KV of 1k-32k
    tokens of all layers), GB/s each way.

  One layer's KV buffer serves every layer (the work is the same; the
  buffers are GBs, far past the L2 cache), so a 256 x 64k decode needs 64k x
  256 x 4 KiB of KV, not 32 times that; a shape that does not fit in the
  free memory is listed as skipped. Writes a JSON file.

* ``compare`` (here, with the plugin installed) prices the same shapes with
  the roofline step model of the matching profile (``h100-llama8b`` or
  ``h200-llama8b``, from the device's name) and writes the table into
  docs/step_models.md between its markers.

On the device (one call, well under 8 minutes on an H100)::

    python scripts/device_step_timing.py measure --out "$OUT/device_timing.json"

Then here::

    python scripts/device_step_timing.py compare device_timing.json

``measure --tiny`` runs a two-layer toy on whatever device there is (the
CPU included): the tests use it to check the script end to end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "step_models.md")
BEGIN = "<!-- device-step-timing: written by scripts/device_step_timing.py compare -->"
END = "<!-- /device-step-timing -->"


# The model's shape is the simulator profile's own (stdlib only, so it
# imports on the GPU machine, where the plugin is not installed).
sys.path.insert(0, ROOT)
from benchmarks.sim.profiles import LLAMA_3_1_8B, ModelArch  # noqa: E402

TINY = ModelArch(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=256)


def kv_bytes_per_token_per_layer(shape: ModelArch) -> int:
    """K and V of one token in one layer."""
    return shape.kv_bytes_per_token() // shape.num_layers


# The grids (issue "Capacity": prefill 1k-32k new over 0-64k cached; decode
# 1-256 sequences at 4k-64k; copies of 1k-32k tokens of KV).
PREFILL_NEW = (1024, 4096, 8192, 16384, 32768)
PREFILL_CACHED = (0, 8192, 32768, 65536)
DECODE_BATCH = (1, 8, 32, 128, 256)
DECODE_CONTEXT = (4096, 16384, 65536)
COPY_TOKENS = (1024, 8192, 32768)
TINY_GRID = {"prefill_new": (8, 32), "prefill_cached": (0, 16), "decode_batch": (1, 4),
             "decode_context": (16, 64), "copy_tokens": (16, 64)}


# ---------------------------------------------------------------------------
# measure (PyTorch only)
# ---------------------------------------------------------------------------


class Model:
    """Random-weight decoder layers, forward passes for timing only."""

    def __init__(self, shape: ModelArch, device: Any, dtype: Any) -> None:
        import torch

        self.torch = torch
        self.shape, self.device, self.dtype = shape, device, dtype
        s = shape
        qkv = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim

        def weight(*dims: int) -> Any:
            return torch.empty(*dims, device=device, dtype=dtype).normal_(0.0, 0.02)

        self.layers = [
            {
                "norm1": torch.ones(s.hidden_size, device=device, dtype=dtype),
                "qkv": weight(qkv, s.hidden_size),
                "o": weight(s.hidden_size, s.num_heads * s.head_dim),
                "norm2": torch.ones(s.hidden_size, device=device, dtype=dtype),
                "gate_up": weight(2 * s.intermediate_size, s.hidden_size),
                "down": weight(s.hidden_size, s.intermediate_size),
            }
            for _ in range(s.num_layers)
        ]
        self.final_norm = torch.ones(s.hidden_size, device=device, dtype=dtype)
        # How prefill attention runs: "gqa" (native) or "expanded" (see _attend).
        self.attention = "gqa"
        self.lm_head = weight(s.vocab_size, s.hidden_size)

    def _norm(self, x: Any, w: Any) -> Any:
        torch = self.torch
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * w

    def _rope(self, x: Any, positions: Any) -> Any:
        """Rotary embedding over the last dim (``x``: [..., T, head_dim])."""
        torch = self.torch
        half = x.shape[-1] // 2
        inv = 1.0 / (500000.0 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
        angles = positions.float()[:, None] * inv[None, :]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _mlp(self, x: Any, layer: dict[str, Any]) -> Any:
        F = self.torch.nn.functional
        gate, up = F.linear(self._norm(x, layer["norm2"]), layer["gate_up"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer["down"])

    def _split_qkv(self, h: Any) -> tuple[Any, Any, Any]:
        s = self.shape
        q, k, v = h.split((s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim), dim=-1)
        return q, k, v

    def _attend(self, q: Any, k: Any, v: Any, causal: bool) -> Any:
        """SDPA of [heads, T, d] queries over [kv_heads, S, d] keys/values.
        On a GPU only flash attention is allowed (a fallback to the math
        kernel would materialise a T x S score matrix per head: hundreds
        of GB at 32k x 64k); grouped-query natively (``enable_gqa``) when
        the kernel takes it, else over KV expanded to every head (which
        reads the KV ``heads / kv_heads`` times: ``attention`` in the
        results says which)."""
        torch, F = self.torch, self.torch.nn.functional
        if self.device.type != "cuda":
            return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal, enable_gqa=True)[0]
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            if self.attention == "gqa":
                try:
                    return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal,
                                                          enable_gqa=True)[0]
                except RuntimeError:
                    self.attention = "expanded"
            group = q.shape[0] // k.shape[0]
            k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
            return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal)[0]

    def prefill(self, new: int, cached: int, kv_cache: tuple[Any, Any]) -> Any:
        """One forward pass over ``new`` tokens after ``cached`` ones
        (``kv_cache``: one layer's K and V, [kv_heads, >= cached + new, d])."""
        torch, F, s = self.torch, self.torch.nn.functional, self.shape
        x = torch.empty(new, s.hidden_size, device=self.device, dtype=self.dtype).normal_()
        positions = torch.arange(cached, cached + new, device=self.device)
        k_cache, v_cache = kv_cache
        for layer in self.layers:
            q, k, v = self._split_qkv(F.linear(self._norm(x, layer["norm1"]), layer["qkv"]))
            q = self._rope(q.view(new, s.num_heads, s.head_dim).transpose(0, 1), positions)
            k = self._rope(k.view(new, s.num_kv_heads, s.head_dim).transpose(0, 1), positions)
            v = v.view(new, s.num_kv_heads, s.head_dim).transpose(0, 1)
            k_cache[:, cached:cached + new].copy_(k)  # the KV write of the new tokens
            v_cache[:, cached:cached + new].copy_(v)
            out = self._attend(q, k, v, causal=True)
            if cached:
                out = out + self._attend(q, k_cache[:, :cached], v_cache[:, :cached], causal=False)
            x = x + F.linear(out.transpose(0, 1).reshape(new, s.num_heads * s.head_dim), layer["o"])
            x = self._mlp(x, layer)
        return F.linear(self._norm(x[-1:], self.final_norm), self.lm_head)

    def decode(self, batch: int, context: int, kv_cache: tuple[Any, Any]) -> Any:
        """One decode step of ``batch`` sequences at ``context`` tokens each
        (``kv_cache``: [batch, kv_heads, context, d] K and V)."""
        torch, F, s = self.torch, self.torch.nn.functional, self.shape
        group = s.num_heads // s.num_kv_heads
        x = torch.empty(batch, s.hidden_size, device=self.device, dtype=self.dtype).normal_()
        positions = torch.full((1,), context, device=self.device)
        k_cache, v_cache = kv_cache
        scale = 1.0 / math.sqrt(s.head_dim)
        for layer in self.layers:
            q, _, _ = self._split_qkv(F.linear(self._norm(x, layer["norm1"]), layer["qkv"]))
            q = self._rope(q.view(batch, s.num_kv_heads, group, s.head_dim), positions)
            # Grouped-query attention reading each sequence's KV once.
            scores = torch.einsum("bkgd,bkld->bkgl", q, k_cache) * scale
            out = torch.einsum("bkgl,bkld->bkgd", scores.softmax(dim=-1), v_cache)
            x = x + F.linear(out.reshape(batch, s.num_heads * s.head_dim), layer["o"])
            x = self._mlp(x, layer)
        return F.linear(self._norm(x, self.final_norm), self.lm_head)


class Timer:
    """Median seconds of ``fn`` over ``repeats`` runs after one warm-up:
    CUDA events on a GPU, the wall clock (after the work is done) elsewhere."""

    def __init__(self, torch: Any, device: Any, repeats: int) -> None:
        self.torch, self.device, self.repeats = torch, device, repeats
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        fn()
        self._sync()
        times = []
        for _ in range(self.repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def _free_bytes(torch: Any, device: Any) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return 4 * 2**30  # the CPU toy: a bound that keeps it small


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = TINY if args.tiny else LLAMA_3_1_8B
    grid = TINY_GRID if args.tiny else {
        "prefill_new": PREFILL_NEW, "prefill_cached": PREFILL_CACHED, "decode_batch": DECODE_BATCH,
        "decode_context": DECODE_CONTEXT, "copy_tokens": COPY_TOKENS,
    }
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", flush=True)

    model = Model(shape, device, dtype)
    timer = Timer(torch, device, args.repeats)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    progress(f"built {shape.num_layers}-layer model on {name} ({dtype})")
    out: dict[str, Any] = {
        "device": name, "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__,
        "shape": asdict(shape), "tiny": bool(args.tiny), "repeats": args.repeats,
        "prefill": [], "decode": [], "copies": [], "skipped": [],
    }
    per_token = kv_bytes_per_token_per_layer(shape)
    # Leave room for activations (the 32k-token MLP holds ~2 GB) and the allocator.
    budget = int(_free_bytes(torch, device) * 0.8) - 4 * 2**30 * (not args.tiny)
    with torch.inference_mode():
        longest = max(grid["prefill_cached"]) + max(grid["prefill_new"])
        kv = tuple(torch.zeros(shape.num_kv_heads, longest, shape.head_dim, device=device, dtype=dtype)
                   for _ in range(2))
        for cached in grid["prefill_cached"]:
            for new in grid["prefill_new"]:
                seconds = timer(lambda: model.prefill(new, cached, kv))
                out["prefill"].append({"new": new, "cached": cached, "seconds": seconds})
                progress(f"prefill {new} new after {cached} cached: {seconds * 1e3:.2f} ms")
        del kv
        for context in grid["decode_context"]:
            for batch in grid["decode_batch"]:
                need = batch * context * per_token  # K and V of one layer
                if need > budget:
                    out["skipped"].append({"kind": "decode", "batch": batch, "context": context,
                                           "kv_bytes": need})
                    continue
                kv = tuple(torch.zeros(batch, shape.num_kv_heads, context, shape.head_dim, device=device, dtype=dtype)
                           for _ in range(2))
                seconds = timer(lambda: model.decode(batch, context, kv))
                del kv
                out["decode"].append({"batch": batch, "context": context, "seconds": seconds})
                progress(f"decode {batch} x {context}: {seconds * 1e3:.2f} ms")
        for tokens in grid["copy_tokens"]:
            nbytes = tokens * per_token * shape.num_layers
            dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
            h2d = timer(lambda: dev.copy_(host, non_blocking=True))
            d2h = timer(lambda: host.copy_(dev, non_blocking=True))
            del dev, host
            out["copies"].append({"tokens": tokens, "bytes": nbytes, "h2d_seconds": h2d, "d2h_seconds": d2h})
            progress(f"copy {tokens} tokens of KV ({nbytes / 2**20:.0f} MiB): "
                     f"h2d {nbytes / h2d / 1e9:.1f} GB/s, d2h {nbytes / d2h / 1e9:.1f} GB/s")
    out["attention"] = model.attention
    out["wall_seconds"] = time.perf_counter() - started
    return out


# ---------------------------------------------------------------------------
# compare (with the plugin's step model)
# ---------------------------------------------------------------------------


def profile_for(device_name: str) -> str:
    """The simulator profile a device's figures are compared with."""
    return "h200-llama8b" if "H200" in device_name.upper() else "h100-llama8b"


def _step_model(profile_name: str) -> tuple[Any, Any, Any, Any]:
    from benchmarks.sim.batch import BatchShape, PrefillChunk
    from benchmarks.sim.profiles import PROFILES
    from benchmarks.sim.step_model import RooflineStepModel, pcie_transfer_seconds

    profile = PROFILES[profile_name]
    return RooflineStepModel(profile), BatchShape, PrefillChunk, (profile, pcie_transfer_seconds)


def render(results: dict[str, Any], source: str) -> str:
    """The markdown section (between the markers) for ``results``."""
    profile_name = profile_for(results["device"])
    model, BatchShape, PrefillChunk, (profile, pcie) = _step_model(profile_name)
    lines = [
        BEGIN,
        "## Measured on a GPU: a Llama-3.1-8B-shaped model in PyTorch",
        "",
        f"`{source}`: {results['device']}, {results['dtype']}, PyTorch {results['torch']}, random weights "
        f"({results['shape']['num_layers']} layers; prefill attention {results['attention']}), median of {results['repeats']} after a warm-up, "
        f"{results['wall_seconds']:.0f} s in all (`python scripts/device_step_timing.py measure`, then "
        "`compare`). PyTorch's own kernels (SDPA, cuBLAS), not vLLM's: an upper bound on vLLM's step "
        f"time for the same shapes. Beside each: the roofline step model of `{profile_name}` "
        "(docs/step_models.md above) and measured / roofline.",
        "",
        "| step | measured ms | roofline ms | measured / roofline |",
        "|---|---:|---:|---:|",
    ]

    def row(label: str, measured: float, modelled: float) -> None:
        ratio = measured / modelled if modelled > 0 else float("nan")
        lines.append(f"| {label} | {measured * 1e3:.2f} | {modelled * 1e3:.2f} | {ratio:.2f} |")

    for p in results["prefill"]:
        shape = BatchShape(prefills=(PrefillChunk(p["new"], p["cached"]),))
        row(f"prefill {p['new']:,} new after {p['cached']:,} cached", p["seconds"], model.step_seconds(shape))
    for d in results["decode"]:
        shape = BatchShape(decode_contexts=(d["context"],) * d["batch"])
        row(f"decode {d['batch']} x {d['context']:,}", d["seconds"], model.step_seconds(shape))
    for c in results["copies"]:
        modelled = pcie(profile, BatchShape(loaded_tokens=c["tokens"]))
        row(f"host -> GPU, KV of {c['tokens']:,} tokens ({c['bytes'] / 2**20:.0f} MiB)", c["h2d_seconds"],
            modelled)
        modelled = pcie(profile, BatchShape(stored_tokens=c["tokens"]))
        row(f"GPU -> host, KV of {c['tokens']:,} tokens", c["d2h_seconds"], modelled)
    for s in results["skipped"]:
        lines.append(f"| decode {s['batch']} x {s['context']:,} | does not fit ({s['kv_bytes'] / 2**30:.0f} GiB "
                     "of KV) | | |")
    lines += ["", END]
    return "\n".join(lines)


def write_section(doc_path: str, section: str) -> None:
    """Put ``section`` between the markers of ``doc_path`` (appended once)."""
    with open(doc_path, encoding="utf-8") as f:
        text = f.read()
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        if END not in rest:
            raise ValueError(f"{doc_path} has {BEGIN!r} without {END!r}")
        tail = rest.split(END, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(doc_path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time the model on this machine's GPU (PyTorch only)")
    m.add_argument("--out", required=True, help="JSON file to write")
    m.add_argument("--device", default="", help="torch device (default: cuda if there is one, else cpu)")
    m.add_argument("--repeats", type=int, default=3)
    m.add_argument("--tiny", action="store_true", help="a two-layer toy (checks the script; any device)")
    c = sub.add_parser("compare", help="write the measured figures beside the roofline's into the doc")
    c.add_argument("results", help="the JSON file `measure` wrote")
    c.add_argument("--doc", default=DOC)
    args = ap.parse_args(argv)
    if args.command == "measure":
        if args.repeats < 1:
            ap.error(f"--repeats must be >= 1, got {args.repeats}")
        results = measure(args)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")
        return 0
    with open(args.results, encoding="utf-8") as f:
        results = json.load(f)
    if results.get("tiny"):
        ap.error(f"{args.results} holds the --tiny toy's figures, not a Llama-3.1-8B-shaped model's")
    write_section(args.doc, render(results, os.path.basename(args.results)))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
