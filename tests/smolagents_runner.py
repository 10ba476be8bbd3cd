"""Run one smolagents ``CodeAgent``, unchanged, against a server (test helper).

Runs in the agents venv (``scripts/setup.sh`` installs smolagents there, so
its dependencies never move vLLM's)::

    ~/.venvs/vllm-continuum-agents/bin/python tests/smolagents_runner.py \
        --url http://127.0.0.1:PORT/v1 --model smollm2 --task "..."

The agent is stock: ``OpenAIServerModel`` pointed at the server, no tools
beyond the built-in ``final_answer``, the local Python executor. It sends no
job id and no last-step flag. Prints one JSON line: the final answer, the
steps (model output, the code it ran, the observation) and each step's token
usage as the server reported it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="the server's /v1 base URL")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--task", required=True)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args(argv)

    import smolagents
    from smolagents import CodeAgent, OpenAIServerModel
    from smolagents.memory import ActionStep

    model = OpenAIServerModel(model_id=args.model, api_base=args.url, api_key="unused",
                              max_tokens=args.max_tokens, temperature=0.0)
    agent = CodeAgent(tools=[], model=model, max_steps=args.max_steps, verbosity_level=0)
    started = time.monotonic()
    answer = agent.run(args.task)
    elapsed = time.monotonic() - started
    steps = []
    for step in agent.memory.steps:
        if not isinstance(step, ActionStep):
            continue
        usage = step.token_usage
        steps.append({
            "model_output": step.model_output if isinstance(step.model_output, str) else None,
            "code": step.code_action,
            "observation": step.observations,
            "error": str(step.error) if step.error else None,
            "input_tokens": usage.input_tokens if usage else None,
            "is_final_answer": bool(step.is_final_answer),
        })
    print(json.dumps({"smolagents": smolagents.__version__, "answer": str(answer), "seconds": elapsed,
                      "steps": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
