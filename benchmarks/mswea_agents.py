"""Run real mini-swe-agent agents, unchanged, against a vLLM server.

This is the client side of the "unchanged agents" check: mini-swe-agent 2.x
(``pip install mini-swe-agent``, pinned by ``scripts/setup.sh`` in a venv of
its own, ``~/.venvs/vllm-continuum-agents``) with its stock ``DefaultAgent``,
its litellm model with native function calling (``tools=[bash]``) and its
``LocalEnvironment``: every command really runs, in a throw-away git
repository per agent. **No job id and no last-step flag are sent**: the
plugin must recognise each agent's turns by their prefix and its last turn
by mini-swe-agent's ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``.

The embedded 135M model cannot be trusted to produce valid tool calls, so
each request carries a vLLM structured-outputs regex in litellm's
``extra_body`` (the ``model_kwargs`` channel mini-swe-agent documents) that
forces one Hermes ``<tool_call>`` running the script's next command; the
server still parses it with its own ``--tool-call-parser hermes``, returns
``tool_calls``, and the agent executes them. The only code here that is not
mini-swe-agent's is that per-turn choice of regex (a model subclass that
changes ``extra_body``, nothing else).

Run with the agents venv's Python (it imports ``minisweagent``, which the
serving venv does not have)::

    ~/.venvs/vllm-continuum-agents/bin/python benchmarks/mswea_agents.py \\
        --url http://127.0.0.1:8000/v1 --model smollm2 --agents 3

Prints one JSON object: per agent its exit status, the commands it ran,
and per model call the prompt and cached tokens from ``usage``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

FINISH = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
DEFAULT_SCRIPT = ["ls", "cat README.md", "git status", "cat main.py", FINISH]
SYSTEM_TEMPLATE = "You are a helpful assistant that can interact with a computer using the bash tool."
INSTANCE_TEMPLATE = (
    "Please solve this task: {{task}}\n\n"
    "Call the bash tool with exactly one command per response. "
    "When done, call it with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`."
)
TASK = "The tests in this repository fail. Find out why ({i})."
_REGEX_META = set(r"\.^$|?*+()[]{}")


def hermes_regex(command: str) -> str:
    """A regex for exactly one Hermes tool call of ``bash`` running
    ``command``, spelled as the chat template re-renders it (``tojson``)."""
    literal = "".join("\\" + ch if ch in _REGEX_META else ch for ch in json.dumps(command)[1:-1])
    return r'<tool_call>\n\{"name": "bash", "arguments": \{"command": "' + literal + r'"\}\}\n</tool_call>'


def make_workspace(index: int) -> str:
    """A throw-away git repository with a failing test."""
    path = tempfile.mkdtemp(prefix=f"mswea-agent{index}-")
    files = {
        "README.md": f"# calc {index}\nA tiny calculator.\n",
        "main.py": "def add(a, b):\n    return a - b\n",
        "test_main.py": "from main import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n",
    }
    for name, text in files.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=a@b", "-c", "user.name=agent", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=path, check=True, capture_output=True)
    return path


def build_agent(args: argparse.Namespace, workdir: str) -> Any:
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel

    script = args.script

    class ScriptedToolCalls(LitellmModel):
        """Stock LitellmModel; only the structured-outputs regex in
        ``extra_body`` follows the script (turn = assistant messages so far,
        so a format error does not advance it)."""

        def _query(self, messages: list[dict], **kwargs: Any) -> Any:
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            extra_body = dict(self.config.model_kwargs.get("extra_body", {}))
            extra_body["structured_outputs"] = {"regex": hermes_regex(script[min(turn, len(script) - 1)])}
            return super()._query(messages, **(kwargs | {"extra_body": extra_body}))

    model = ScriptedToolCalls(
        model_name=f"hosted_vllm/{args.model}",
        model_kwargs={
            "api_base": args.url,
            "api_key": "unused",
            "temperature": 0.0,
            "max_tokens": args.max_tokens,
            "timeout": args.request_timeout,
            "extra_body": {},
        },
        cost_tracking="ignore_errors",
    )
    env = LocalEnvironment(cwd=workdir, timeout=30, env={"PAGER": "cat", "GIT_PAGER": "cat"})
    return DefaultAgent(
        model, env, system_template=SYSTEM_TEMPLATE, instance_template=INSTANCE_TEMPLATE,
        step_limit=len(script) + 2, cost_limit=0,
    )


def run_agent(index: int, args: argparse.Namespace) -> dict[str, Any]:
    time.sleep(index * args.stagger_s)  # agents start one after another
    workdir = make_workspace(index)
    agent = build_agent(args, workdir)
    started = time.time()
    try:
        status = agent.run(TASK.format(i=index)).get("exit_status")
    except Exception as e:  # a failed request ends only this agent
        status = f"{type(e).__name__}: {e}"
    calls = []
    for message in agent.messages:
        extra = message.get("extra") or {}
        if message.get("role") != "assistant" or "response" not in extra:
            continue
        usage = extra["response"].get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        calls.append({
            "commands": [a.get("command") for a in extra.get("actions", [])],
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": details.get("cached_tokens") or 0,
        })
    return {"agent": index, "exit_status": status, "seconds": round(time.time() - started, 2),
            "workdir": workdir, "calls": calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="smollm2", help="served model name")
    parser.add_argument("--agents", type=int, default=3, help="agents run at once")
    parser.add_argument("--script", default=";;".join(DEFAULT_SCRIPT),
                        help="';;'-separated commands, one per turn (the last one should finish)")
    parser.add_argument("--stagger-s", type=float, default=0.5, help="delay between agent starts")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    args.script = [c for c in args.script.split(";;") if c.strip()]
    # Read at import time by mini-swe-agent / litellm: no banner, no user
    # config, no cost map download, few retries.
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mswea-config-"))
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # litellm imports its MCP handler lazily on the first call with tools=;
    # import it once here so agent threads do not race on it.
    import litellm.responses.mcp.chat_completions_handler  # noqa: F401

    with ThreadPoolExecutor(max_workers=args.agents) as pool:
        results = list(pool.map(lambda i: run_agent(i, args), range(args.agents)))
    json.dump({"agents": results}, sys.stdout)
    sys.stdout.write("\n")
    return 0 if all(r["exit_status"] == "Submitted" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
