"""Per-step budget: the plugin's worst cost on one engine step under hostile input.

Everything the plugin does per finished turn runs on the EngineCore thread,
inside ``update_from_output``: reading the reply, parsing the tool call or
the client's hints, deciding the TTL, pinning. A hostile client controls the
hints it sends and, through its prompt, the model's reply. This benchmark
measures what that costs one step, on real vLLM schedulers (the engine rig,
``benchmarks/engine_rig.py``: no weights, the tiny model's tokenizer), for
vLLM's stock ``fcfs`` and both plugin policies, on identical request streams.

Each *round* submits ``--batch`` requests that all finish in the same step
(the fake model emits a request's whole scripted reply in one step, as
speculative decoding may), so that step carries ``--batch`` turn ends. A
round is timed as the sum of ``schedule()`` and ``update_from_output()`` over
its steps; rounds of the policies are interleaved, so machine noise hits
all of them alike. Phases (every request distinct):

* ``plain``: tagged non-final turns, a short hint (``ls -la``), a short reply;
* ``hostile_hints``: tagged, each with the largest ``tool_command`` the API
  accepts (16,384 characters) in the shapes that cost the parser most: many
  simple commands ``a;b;c;...``, quoted words, a run of spaces, one word;
* ``hostile_replies``: untagged (the implicit-job path reads every reply),
  64k-character replies: a fence and spaces, an unclosed ``<think>``, tabs,
  a hermes ``<tool_call>`` whose JSON never closes;
* ``refit`` (``context_serve`` only): ``hostile_hints`` rounds while the
  ContextServe classifier refits in its background thread (started by
  feeding it ``refit_every`` observations between rounds, untimed);
* ``sessions``: every turn of a round names the same session id with its
  own 4,000-token prompt, so each ``add_request`` matches its prompt against
  the session's conversations so far (up to 8, by shared prefix:
  ``prompt_prefix``), the most a request's arrival costs.

Prints, per phase and policy, the per-round time (median and max, ms) and
the plugin's added cost per turn end against ``fcfs`` in the same phase
(median over rounds). The budget it checks is the issue's: a step never
waits more than a few milliseconds for the plugin (``BUDGET_MS`` per turn
end). ``--json`` writes the figures; ``--doc`` writes docs/step_budget.md.

Usage: ``python -m benchmarks.step_budget [--rounds 30] [--batch 8] [--json PATH] [--doc PATH]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm.v1.request import Request

from vllm_continuum_plugin.clock import SYSTEM_CLOCK

from .dtype import cpu_flags, cpu_name
from .engine_rig import TINY_MODEL, fake_model_output, make_request, make_scheduler, prompt_of

__all__ = ["BUDGET_MS", "PHASES", "POLICIES", "main", "measure"]

POLICIES = ("fcfs", "continuum", "context_serve")
PHASES = ("plain", "hostile_hints", "hostile_replies", "refit", "sessions")
SESSION_PROMPT_TOKENS = 4000
# The most the plugin may add to a step per turn that ends in it.
BUDGET_MS = 3.0
MAX_HINT_CHARS = 16384  # metadata.MAX_TOOL_COMMAND_CHARS: the largest hint the API accepts
REPLY_CHARS = 65536


def hostile_hint(i: int) -> str:
    """A distinct 16,384-character ``tool_command``, shape by ``i``."""
    tag = f"x{i}"
    shapes = (
        lambda: ";".join(f"{tag}c{j} a{j}" for j in range(MAX_HINT_CHARS)),
        lambda: " ".join(f"'{tag}{j}'" for j in range(MAX_HINT_CHARS)),
        lambda: tag + " " * MAX_HINT_CHARS,
        lambda: tag + "w" * MAX_HINT_CHARS,
    )
    return shapes[i % len(shapes)]()[:MAX_HINT_CHARS]


def hostile_reply(i: int) -> str:
    """A distinct 64k-character reply, shape by ``i``."""
    tag = f"r{i}"
    shapes = (
        lambda: "```" + tag + " " * REPLY_CHARS,
        lambda: "<think>" + tag + "a " * REPLY_CHARS,
        lambda: tag + "\t" * REPLY_CHARS,
        lambda: '<tool_call>\n{"name": "bash", "arguments": {"command": "' + tag + "[" * REPLY_CHARS,
    )
    return shapes[i % len(shapes)]()[:REPLY_CHARS]


class _Tokenizer:
    def __init__(self) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(TINY_MODEL)
        self.eos = int(self._tok.eos_token_id)

    def ids(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)


@dataclass
class Turn:
    """One request of a round, the same for every policy."""

    prompt: list[int]
    reply: list[int]
    job_id: str | None
    hint: str | None


class Rig:
    """One real scheduler, fed the rounds."""

    def __init__(self, policy: str, batch: int, reply_tokens: int) -> None:
        self.policy = policy
        self.scheduler = make_scheduler(
            policy, num_blocks=4 * batch * (reply_tokens // 16 + 16) + 64, max_num_seqs=batch,
            max_num_batched_tokens=max(8192, batch * 64), max_model_len=reply_tokens + 256,
            continuum=None if policy == "fcfs" else {"default_ttl_s": 600, "max_ttl_s": 600,
                                                    "max_pinned_fraction": 1.0},
            clock=SYSTEM_CLOCK,
        )
        self._replies: dict[str, list[int]] = {}
        # Time inside the turn-end hook (vLLM's own ``_free_request_blocks``
        # for fcfs, the plugin's override otherwise), per round.
        self._hook_ns = 0
        hook = self.scheduler._free_request_blocks

        def timed_hook(request: Request) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return hook(request)
            finally:
                self._hook_ns += time.perf_counter_ns() - t0

        self.scheduler._free_request_blocks = timed_hook  # type: ignore[method-assign]

    def run_round(self, turns: list[Turn]) -> tuple[float, float, float]:
        """Submit ``turns``, step until they finish. Returns the steps'
        scheduler time, the time in the turn-end hook and the time in
        ``add_request``, in ms."""
        requests: list[Request] = []
        for t in turns:
            extra = {"tool_command": t.hint} if t.hint is not None else None
            r = make_request(t.prompt, max_tokens=len(t.reply), job_id=t.job_id,
                             is_last_step=False if t.job_id is not None else None, extra=extra)
            self._replies[r.request_id] = t.reply
            requests.append(r)
        s = self.scheduler
        t0 = time.perf_counter_ns()
        for r in requests:
            s.add_request(r)
        add_ns = time.perf_counter_ns() - t0
        self._hook_ns = 0
        total = 0
        for _ in range(100):
            t0 = time.perf_counter_ns()
            output = s.schedule()
            t1 = time.perf_counter_ns()
            runner = fake_model_output(s, output, replies=self._replies, whole_reply=True)
            t2 = time.perf_counter_ns()
            s.update_from_output(output, runner)
            total += (t1 - t0) + (time.perf_counter_ns() - t2)
            if all(r.is_finished() for r in requests):
                break
        else:
            raise RuntimeError(f"{self.policy}: a round did not finish in 100 steps")
        for r in requests:
            self._replies.pop(r.request_id, None)
        return total / 1e6, self._hook_ns / 1e6, add_ns / 1e6

    def xgb_refitter(self) -> Any:
        predictor = getattr(getattr(self.scheduler, "decider", None), "predictor", None)
        for layer in getattr(predictor, "layers", ()):
            if hasattr(layer, "refitter"):
                return layer
        return None

    def start_refit(self) -> bool:
        """Feed the classifier ``refit_every`` observations (untimed); True
        when a background refit is now running."""
        layer = self.xgb_refitter()
        if layer is None:
            return False
        from vllm_continuum_plugin.estimators.parser import shell_call

        rng = random.Random(len(self._replies))
        for i in range(layer.config.refit_every):
            self.scheduler.decider.observe(shell_call(f"pytest -k t{rng.randrange(10**6)}"), rng.uniform(0.1, 60))
            if layer.refitter.busy:
                return True
        return layer.refitter.busy

    def close(self) -> None:
        layer = self.xgb_refitter()
        if layer is not None:
            layer.refitter.wait(60)


def build_rounds(
    tok: _Tokenizer, phase: str, rounds: int, batch: int, reply_tokens: int, warmup: bool = False,
) -> list[list[Turn]]:
    """The phase's rounds. Every hint and reply is distinct across phases
    and from the warm-up round's, so no parse is served from a cache."""
    plain_reply = tok.ids("I will look at the files first.")[:32] + [tok.eos]
    out: list[list[Turn]] = []
    n = 10**6 * (2 * PHASES.index(phase) + warmup)
    for _ in range(rounds):
        turns = []
        for _ in range(batch):
            n += 1
            # Distinct prompts (no prefix-cache hit, no implicit-job match
            # between rounds), in the tiny model's 32k vocabulary.
            prompt = [100 + n // 20000 % 20000, 100 + n % 20000, *prompt_of(n % 5000, 62)]
            if phase == "plain":
                turns.append(Turn(prompt, plain_reply, f"job-{phase}-{n}", "ls -la"))
            elif phase == "sessions":
                long_prompt = prompt + [100 + (n * 31 + i) % 20000 for i in range(SESSION_PROMPT_TOKENS - len(prompt))]
                turns.append(Turn(long_prompt, plain_reply, f"session-{len(out)}-{warmup}", "ls -la"))
            elif phase in ("hostile_hints", "refit"):
                turns.append(Turn(prompt, plain_reply, f"job-{phase}-{n}", hostile_hint(n)))
            else:
                turns.append(Turn(prompt, tok.ids(hostile_reply(n))[:reply_tokens] + [tok.eos], None, None))
        out.append(turns)
    return out


def measure(rounds: int, batch: int, log: Callable[[str], None]) -> dict[str, Any]:
    # 64k-character replies outgrow the tiny model's 4,096 positions. No
    # model runs here (the engine rig has no weights): only the scheduler's
    # length checks see the limit.
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    tok = _Tokenizer()
    reply_tokens = max(len(tok.ids(hostile_reply(i))) for i in range(4)) + 1
    rigs = {p: Rig(p, batch, reply_tokens) for p in POLICIES}
    # policy -> phase -> [[round ms, hook ms, add_request ms] per round]
    results: dict[str, dict[str, Any]] = {p: {} for p in POLICIES}
    try:
        for phase in PHASES:
            policies = ("fcfs", "context_serve") if phase == "refit" else POLICIES
            plan = build_rounds(tok, phase, rounds, batch, reply_tokens)
            gc.collect()  # the previous phase's garbage is not this one's cost
            for p in policies:  # warm-up round, untimed
                rigs[p].run_round(build_rounds(tok, phase, 1, batch, reply_tokens, warmup=True)[0])
            refits = 0
            for i, turns in enumerate(plan):
                if phase == "refit" and rigs["context_serve"].start_refit():
                    refits += 1
                for p in policies:
                    results[p].setdefault(phase, []).append(list(rigs[p].run_round(turns)))
                if (i + 1) % max(1, rounds // 5) == 0:
                    log(f"[step-budget] {phase}: {i + 1}/{rounds} rounds")
            if phase == "refit":
                log(f"[step-budget] refit: {refits} of {rounds} rounds ran beside a background refit")
                results["context_serve"]["refit_rounds"] = refits
    finally:
        for rig in rigs.values():
            rig.close()
    return {"rounds": rounds, "batch": batch, "reply_tokens": reply_tokens, "rounds_ms": results}


def summarise(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows per phase and policy: round time (median, max), and per turn
    the time in the turn-end hook plus ``add_request`` (median, max), and
    what the plugin adds to fcfs's (the per-round differences / batch)."""
    batch = data["batch"]
    rows = []
    for phase in PHASES:
        stock = data["rounds_ms"]["fcfs"].get(phase)
        if not stock:
            continue
        for policy in POLICIES:
            samples = data["rounds_ms"][policy].get(phase)
            if not samples:
                continue
            per_turn = [(hook + add) / batch for _, hook, add in samples]
            added = [(hook + add - s_hook - s_add) / batch for (_, hook, add), (_, s_hook, s_add) in zip(samples, stock)]
            rounds = [r for r, _, _ in samples]
            rows.append({
                "phase": phase, "policy": policy,
                "round_median_ms": statistics.median(rounds), "round_max_ms": max(rounds),
                "turn_median_ms": statistics.median(per_turn), "turn_max_ms": max(per_turn),
                "added_median_ms": statistics.median(added), "added_max_ms": max(added),
            })
    return rows


def report(data: dict[str, Any], command: str) -> str:
    rows = summarise(data)
    machine = f"{platform.machine()}, {_cpu_name()}"
    lines = [
        "# Per-step budget under hostile input",
        "",
        f"Written by `{command}` (`benchmarks/step_budget.py`; method in its docstring).",
        f"Machine: {machine}; Python {platform.python_version()}. Real vLLM schedulers (engine rig, no "
        f"weights, so no dtype is involved); {data['rounds']} rounds of {data['batch']} turns that end in the same step, per phase; "
        f"hostile replies are {REPLY_CHARS:,} characters ({data['reply_tokens']:,} tokens at most), hostile "
        f"hints {MAX_HINT_CHARS:,}.",
        "",
        "Per turn: the time in the turn-end hook (`_free_request_blocks`: vLLM's own for fcfs, the "
        "plugin's override otherwise, where replies and hints are read and the TTL decided) plus "
        "`add_request`; *added* is that minus fcfs's on the same round.",
        "",
        "| phase | policy | round median (ms) | round max (ms) | per turn median (ms) | per turn max (ms) "
        "| added per turn median (ms) | added per turn max (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['phase']} | {r['policy']} | {r['round_median_ms']:.2f} | {r['round_max_ms']:.2f} | "
                     f"{r['turn_median_ms']:.3f} | {r['turn_max_ms']:.3f} | {r['added_median_ms']:.3f} | "
                     f"{r['added_max_ms']:.3f} |")
    worst = max((r["added_max_ms"] for r in rows), default=0.0)
    refits = data["rounds_ms"].get("context_serve", {}).get("refit_rounds", 0)
    lines += [
        "",
        f"Budget: at most {BUDGET_MS:g} ms added per turn end. Worst round: {worst:.3f} ms per turn end "
        f"({worst * data['batch']:.1f} ms for the {data['batch']} in one step) -- "
        f"{'within' if worst <= BUDGET_MS else 'OVER'} budget.",
        f"`refit`: {refits} of {data['rounds']} rounds ran beside a background classifier refit "
        "(its Python parts share the GIL with the engine thread).",
        "The round columns include vLLM's own work (for hostile replies: appending 64k-token outputs and "
        "hashing their blocks, which stock vLLM does too) and the machine's noise; the per-turn columns "
        "isolate the hooks.",
        "",
    ]
    return "\n".join(lines)


def _cpu_name() -> str:
    """The CPU's model name, its cores and its widest vector extension."""
    flags = cpu_flags()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{cpu_name()}, {os.cpu_count()} cores, {vector}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="rounds per phase (default 30)")
    parser.add_argument("--batch", type=int, default=8, help="turns ending in the same step (default 8)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--doc", help="write the markdown report here (e.g. docs/step_budget.md)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.batch < 1:
        parser.error(f"--rounds and --batch must be >= 1, got {args.rounds}, {args.batch}")
    data = measure(args.rounds, args.batch, lambda line: print(line, file=sys.stderr, flush=True))
    command = "python -m benchmarks.step_budget " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(data, command.strip())
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**data, "rows": summarise(data)}, f, indent=1)
    if args.doc:
        with open(args.doc, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
