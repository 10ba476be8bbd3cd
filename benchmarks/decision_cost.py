"""ContextServe decision cost: microseconds per FAST/SLOW/UNCERTAIN decision.

Builds the real ``ContextAwarePredictor`` (shipped rules, Bayesian layer,
shipped bootstrap XGBoost model, Continuum's CDF rule as fallback), feeds the
Bayesian layer some measured history, and times ``predict`` on the commands
of the bootstrap corpus: warm (the steady state: agents re-run the same
commands, so parsed features are cached) and cold (every command text new).
Model refits run in a background thread and are not on this path.

Usage: python benchmarks/decision_cost.py [--repeats N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from vllm_continuum_plugin.estimators.context_config import ContextServeConfig, data_path
from vllm_continuum_plugin.estimators.context_predictor import ContextAwarePredictor, measure_decision_cost
from vllm_continuum_plugin.estimators.history import ToolDurationHistory
from vllm_continuum_plugin.estimators.parser import ToolCall, split_commands, tool_key_for_command
from vllm_continuum_plugin.estimators.prefill import PrefillCostModel
from vllm_continuum_plugin.estimators.ttl import CDFTTLPolicy


def corpus_calls() -> list[tuple[ToolCall, float]]:
    calls = []
    with open(data_path("bootstrap_commands.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            command = row["command"]
            calls.append((ToolCall(command, tool_key_for_command(command), tuple(split_commands(command))), row["seconds"]))
    return calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=50, help="timed passes over the corpus (default: 50)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)

    history = ToolDurationHistory()
    rng = np.random.default_rng(0)
    for v in rng.lognormal(0, 1, 500):
        history.record("global", float(v))
    fallback = CDFTTLPolicy(history, PrefillCostModel(), 2.0, 60.0, 100)
    predictor = ContextAwarePredictor(ContextServeConfig(), fallback=fallback.decide)
    calls = corpus_calls()
    for call, seconds in calls[::2]:  # half the corpus as measured history
        predictor.observe(call, seconds)
    only_calls = [c for c, _ in calls]
    warm = measure_decision_cost(predictor, only_calls, repeats=args.repeats)
    cold_calls = [ToolCall(c.command + f" # {i}", c.tool_key, c.commands) for i, c in enumerate(only_calls)]
    cold = measure_decision_cost(predictor, cold_calls, repeats=1)
    predictor.close()

    print(f"ContextServe decision cost over {len(only_calls)} corpus commands (microseconds)")
    print(f"{'':34} {'mean':>8} {'p50':>8} {'p99':>8}")
    print(f"{'predict(), warm':34} {warm['mean_us']:>8.1f} {warm['p50_us']:>8.1f} {warm['p99_us']:>8.1f}")
    print(f"{'predict(), every command new':34} {cold['mean_us']:>8.1f} {cold['p50_us']:>8.1f} {cold['p99_us']:>8.1f}")
    for name, stats in warm["layers"].items():  # type: ignore[union-attr]
        print(f"{'  layer ' + name + ', warm':34} {stats['mean_us']:>8.1f} {stats['p50_us']:>8.1f} {stats['p99_us']:>8.1f}")
    print("decided by: " + ", ".join(f"{k}={v}" for k, v in warm["decided_by"].items()))  # type: ignore[union-attr]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"warm": warm, "cold": cold}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
