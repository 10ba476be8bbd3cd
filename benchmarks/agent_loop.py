"""A mini-swe-agent style agent loop against an OpenAI-compatible vLLM server.

Each agent (job) gets a throw-away workspace: a small generated Python
project whose test fails (``calc.add`` subtracts), committed to a git
repository when ``git`` is available. The agent is asked to fix the bug. Every
turn re-sends the whole conversation (system prompt + all earlier messages)
with the plugin's job metadata in the request body::

    extra_body={"job_id": "job-0003", "is_last_step": False}

The reply must end with exactly one ```bash block; its command is parsed with
the plugin's own parser (``estimators.parser.extract_tool_call``), checked
against a command allow-list, run in the workspace with
``bash -lc`` under a timeout, and its (truncated) output becomes the next user
message. A reply without a ```bash block gets a format-error reminder
instead, as mini-swe-agent does.

Which request is flagged ``is_last_step``
    A client only knows a turn was the last after reading its reply, but the
    flag must be on the request. This loop therefore makes the flagged request
    really the job's last one:

    * when the step budget is about to run out (``step == max_steps - 1``) the
      request is sent with ``is_last_step=True`` and nothing in its reply is
      executed;
    * when the model submits (its command contains ``SUBMIT`` or runs
      ``submit``) on an earlier step, the command is still run, then one short
      wrap-up turn ("Summarize what you changed.") is sent with
      ``is_last_step=True``. The wrap-up uses the next step, so a job never
      sends more than ``max_steps`` requests.

    A job that ends on a request error never sends a flagged request; the
    server then keeps its last pin until the TTL expires.

Command policy (default on)
    Every simple command of the block (split on ``&&``, ``||``, ``;``,
    newlines and pipes outside quotes; heredoc bodies are data) must start
    (after ``VAR=value`` prefixes) with an allowed program: ls cat head tail
    grep find wc pwd echo sed python python3 pytest git diff sort uniq cd true
    submit; ``git`` only with status/diff/log/show; ``find`` without
    -exec/-delete. Network tools, sudo, package installers, ``rm -rf /``,
    variable and command substitution, and paths outside the workspace (absolute paths, ``~``, ``..`` escapes) are
    refused. A refused command is not run; the agent sees
    ``command not allowed: <reason>``. The policy guards against a weak model's
    accidents; it is not a sandbox (``python`` can do anything).
    ``--allow-any-command`` turns it off: DANGEROUS, the model then runs
    arbitrary shell commands as your user.

Trace (``--trace PATH``)
    JSON lines, one per turn (request), grouped by job in turn order::

        {"job": "job-0003", "turn": 0, "arrival_s": 1.25, "system_tokens": 120,
         "new_tokens": 180, "output_tokens": 24, "tool": "ls",
         "tool_command": "ls -la", "tool_seconds": 0.08}

    ``arrival_s``: offset of the job's first request from the run's start
    (same on every line of a job); ``system_tokens``: tokens of the system
    prompt; ``new_tokens``: tokens of the user message appended before this
    turn (the task on turn 0, then the previous tool output, refusal or
    format error); ``output_tokens``: completion tokens of the reply;
    ``tool``: the parser's tool key (``<no-tool>`` when the reply had no
    ```bash block); ``tool_command``: the command (``""`` if none);
    ``tool_seconds``: measured time from receiving this reply to sending the
    next request (the tool's real run time). The last turn has tool ``""``,
    command ``""`` and 0.0 seconds. Tokens are counted with the server's
    tokenizer (``POST /tokenize``), or ``len(text) // 4`` when that endpoint
    is unavailable; counting happens after a job ends so that it never adds
    to the measured tool gaps.

Weak models (the embedded SmolLM2-135M rarely writes a ```bash block) can be
held to the format with ``--force-bash-block``: vLLM structured outputs then
constrain each reply to a THOUGHT line and one single-line command starting
with an allowed program; the command itself is still the model's choice.

At the end a per-job summary is printed: steps, whether the agent submitted,
total tool seconds, mean request latency, prompt and cached prompt tokens
(cached needs the server's ``--enable-prompt-tokens-details``).

Example::

    python -m vllm_continuum_plugin.benchmarks.agent_loop \\
        --url http://127.0.0.1:8000 --agents 2 --max-steps 6 --trace trace.jsonl
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from vllm_continuum_plugin.estimators.parser import NO_TOOL_KEY, extract_tool_call

# The loop's parts, one module per concept (re-exported here: this module's
# names are the public surface, e.g. for tests and scripts).
from .agent_client import (
    ChatClient,
    ChatReply,
    OpenAIChatClient,
    ServerTokenCounter,
    fetch_default_model,
    forced_reply_regex,
)
from .agent_commands import (
    DEFAULT_ALLOWED_PROGRAMS,
    DEFAULT_GIT_SUBCOMMANDS,
    CommandPolicy,
    CommandResult,
    CommandRunner,
    format_observation,
    is_submission,
    truncate_output,
)
from .agent_results import (
    TRACE_KEYS,
    JobResult,
    TokenCounter,
    TraceRecord,
    TraceWriter,
    TurnLog,
    build_trace_records,
    format_summary,
)
from .agent_task import (
    FORMAT_ERROR,
    SUBMIT_TOKEN,
    SYSTEM_PROMPT,
    TASK_TEMPLATE,
    WORKSPACE_FILES,
    WRAP_UP,
    Workspace,
    login_shell_test_command,
)

__all__ = [
    "DEFAULT_ALLOWED_PROGRAMS",
    "DEFAULT_GIT_SUBCOMMANDS",
    "FORMAT_ERROR",
    "SUBMIT_TOKEN",
    "SYSTEM_PROMPT",
    "TASK_TEMPLATE",
    "TRACE_KEYS",
    "WORKSPACE_FILES",
    "WRAP_UP",
    "AgentJob",
    "AgentRun",
    "ChatClient",
    "ChatReply",
    "CommandPolicy",
    "CommandResult",
    "CommandRunner",
    "JobResult",
    "LoopConfig",
    "OpenAIChatClient",
    "ServerTokenCounter",
    "TokenCounter",
    "TraceRecord",
    "TraceWriter",
    "TurnLog",
    "Workspace",
    "build_parser",
    "build_trace_records",
    "fetch_default_model",
    "forced_reply_regex",
    "format_observation",
    "format_summary",
    "is_submission",
    "login_shell_test_command",
    "main",
    "truncate_output",
]

# --------------------------------------------------------------------------
# The agent loop
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopConfig:
    """Settings of one run; ``__post_init__`` rejects bad values by name."""

    agents: int = 1
    max_steps: int = 20
    per_command_timeout_s: float = 30.0
    max_output_chars: int = 4000
    max_tokens: int = 512
    temperature: float = 0.0
    stagger_s: float = 1.0
    allow_any_command: bool = False
    job_prefix: str = "job"

    def __post_init__(self) -> None:
        checks = {
            "agents": self.agents >= 1,
            "max_steps": self.max_steps >= 1,
            "per_command_timeout_s": self.per_command_timeout_s > 0,
            "max_output_chars": self.max_output_chars >= 1,
            "max_tokens": self.max_tokens >= 1,
            "temperature": self.temperature >= 0,
            "stagger_s": self.stagger_s >= 0,
            "job_prefix": bool(self.job_prefix.strip()),
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"invalid {name}: {getattr(self, name)!r}")

    def job_id(self, index: int) -> str:
        return f"{self.job_prefix}-{index:04d}"


class AgentJob:
    """Runs one agent job to completion.

    Invariants: request ``k`` carries the system prompt and every earlier
    message; at most ``max_steps`` requests are sent; exactly one request is
    flagged ``is_last_step`` and it is the last one sent (unless a request
    fails, which ends the job with ``error`` set and no flagged request).
    """

    def __init__(
        self,
        job_id: str,
        workspace: Workspace,
        chat: ChatClient,
        config: LoopConfig,
        policy: CommandPolicy,
        runner: CommandRunner,
        clock: Callable[[], float],
        on_turn: Callable[[str, TurnLog], None] | None = None,
    ) -> None:
        self.job_id = job_id
        self.workspace = workspace
        self.chat = chat
        self.config = config
        self.policy = policy
        self.runner = runner
        self.clock = clock
        self.on_turn = on_turn

    def run(self) -> JobResult:
        result = JobResult(self.job_id, self.workspace.path)
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        new_message = self.workspace.task()
        wrap_up_pending = False
        for step in range(self.config.max_steps):
            last = wrap_up_pending or step == self.config.max_steps - 1
            messages.append({"role": "user", "content": new_message})
            sent = self.clock()
            if step == 0:
                result.arrival_s = sent
            elif result.turns:
                previous = result.turns[-1]
                previous.tool_seconds = sent - (previous.sent_s + previous.latency_s)
            try:
                reply = self.chat.complete(messages, self.job_id, last)
            except Exception as exc:  # noqa: BLE001 - any failure ends this job only
                result.error = f"turn {step}: {type(exc).__name__}: {exc}"
                break
            turn = TurnLog(step, new_message, last, sent, self.clock() - sent, reply.text,
                           reply.prompt_tokens, reply.completion_tokens, reply.cached_tokens)
            result.turns.append(turn)
            messages.append({"role": "assistant", "content": reply.text})
            if last:
                self._report(turn)
                break
            new_message, submitted = self._act(turn)
            self._report(turn)
            if submitted:
                result.submitted = True
                wrap_up_pending = True
        return result

    def _act(self, turn: TurnLog) -> tuple[str, bool]:
        """Run the reply's command; returns (next user message, submitted)."""
        call = extract_tool_call(turn.reply)
        if call is None:
            turn.tool = NO_TOOL_KEY
            return FORMAT_ERROR, False
        turn.tool, turn.tool_command = call.tool_key, call.command
        submitted = is_submission(call.command)
        turn.refused = self.policy.check(call.command)
        if turn.refused is not None:
            observation = f"command not allowed: {turn.refused}\nThe command was not run."
        else:
            outcome = self.runner.run(call.command, self.workspace.path)
            turn.returncode, turn.timed_out, turn.exec_seconds = (
                outcome.returncode, outcome.timed_out, outcome.seconds)
            observation = format_observation(outcome, self.config.max_output_chars,
                                             self.config.per_command_timeout_s)
        if submitted:
            return WRAP_UP.format(observation=observation), True
        return observation, False

    def _report(self, turn: TurnLog) -> None:
        if self.on_turn is not None:
            self.on_turn(self.job_id, turn)


# --------------------------------------------------------------------------
# Orchestration and CLI
# --------------------------------------------------------------------------


def _turn_line(job: str, turn: TurnLog) -> str:
    if turn.is_last_step:
        what = "final turn (is_last_step)"
    elif turn.tool == NO_TOOL_KEY:
        what = "no ```bash block -> format error"
    elif turn.refused is not None:
        what = f"refused {turn.tool_command!r}: {turn.refused}"
    elif turn.timed_out:
        what = f"{turn.tool_command!r} timed out after {turn.exec_seconds:.1f}s"
    else:
        what = f"{turn.tool_command!r} rc={turn.returncode} ({turn.exec_seconds:.2f}s)"
    cached = f" cached={turn.cached_tokens}" if turn.cached_tokens is not None else ""
    return (f"[{job} turn {turn.turn}] {turn.latency_s:.2f}s prompt={turn.prompt_tokens}"
            f"{cached} out={turn.completion_tokens}  {what}")


class AgentRun:
    """Runs ``config.agents`` jobs concurrently (one thread each), starting
    job ``i`` at ``i * stagger_s`` seconds after the run's start, and writes
    each job's trace lines when it ends. Workspaces are removed at the end
    unless ``keep_workspaces``."""

    def __init__(self, config: LoopConfig, chat: ChatClient, counter: TokenCounter,
                 trace: TraceWriter | None, keep_workspaces: bool = False,
                 verbose: bool = True, show_replies: bool = False) -> None:
        self.config = config
        self.chat = chat
        self.counter = counter
        self.trace = trace
        self.keep_workspaces = keep_workspaces
        self.verbose = verbose
        self.show_replies = show_replies
        self._print_lock = threading.Lock()

    def _print(self, line: str) -> None:
        if self.verbose:
            with self._print_lock:
                print(line, flush=True)

    def _report(self, job: str, turn: TurnLog) -> None:
        line = _turn_line(job, turn)
        if self.show_replies:
            reply = truncate_output(turn.reply.strip(), 400)
            line += "".join(f"\n    | {reply_line}" for reply_line in reply.split("\n"))
        self._print(line)

    def run(self) -> list[JobResult]:
        workspaces = [Workspace(prefix=f"{self.config.job_id(i)}-") for i in range(self.config.agents)]
        results: list[JobResult | None] = [None] * self.config.agents
        runner = CommandRunner(self.config.per_command_timeout_s)
        login_shell_test_command()  # probe now, not inside the first job's arrival
        start = time.perf_counter()
        clock = lambda: time.perf_counter() - start  # noqa: E731

        def work(index: int) -> None:
            delay = index * self.config.stagger_s - clock()
            if delay > 0:
                time.sleep(delay)
            ws = workspaces[index]
            job = AgentJob(
                self.config.job_id(index), ws, self.chat, self.config,
                CommandPolicy(ws.path, allow_any=self.config.allow_any_command),
                runner, clock, on_turn=self._report,
            )
            result = job.run()
            results[index] = result
            if self.trace is not None:
                self.trace.write(build_trace_records(result, self.counter))

        threads = [threading.Thread(target=work, args=(i,), name=self.config.job_id(i), daemon=True)
                   for i in range(self.config.agents)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            if self.keep_workspaces:
                for ws in workspaces:
                    self._print(f"kept workspace {ws.path}")
            else:
                for ws in workspaces:
                    ws.remove()
        return [r for r in results if r is not None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_continuum_plugin.benchmarks.agent_loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True,
                        help="server base URL, e.g. http://127.0.0.1:8000 (no /v1)")
    parser.add_argument("--model", default=None,
                        help="served model name (default: the first model of GET /v1/models)")
    parser.add_argument("--agents", type=int, default=1, help="concurrent agent jobs (default: 1)")
    parser.add_argument("--stagger", type=float, default=1.0,
                        help="seconds between the starts of consecutive jobs (default: 1.0)")
    parser.add_argument("--max-steps", type=int, default=20,
                        help="most requests per job, wrap-up turn included (default: 20)")
    parser.add_argument("--per-command-timeout", type=float, default=30.0,
                        help="seconds a command may run before its process group is killed (default: 30)")
    parser.add_argument("--max-output-chars", type=int, default=4000,
                        help="command output kept per turn, head + tail (default: 4000)")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="max_tokens of each reply (default: 512)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0.0)")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds to wait for one reply (default: 600)")
    parser.add_argument("--job-prefix", default="job",
                        help="job ids are PREFIX-0000, PREFIX-0001, ... (default: job)")
    parser.add_argument("--trace", default=None, metavar="PATH",
                        help="write the JSON-lines trace (one line per turn) to PATH")
    parser.add_argument("--keep-workspaces", action="store_true",
                        help="do not delete the generated workspaces at the end")
    parser.add_argument("--allow-any-command", action="store_true",
                        help="DANGEROUS: run every command the model emits, with your "
                             "user's rights, without the allow-list")
    parser.add_argument("--force-bash-block", action="store_true",
                        help="constrain every reply with vLLM structured outputs to THOUGHT + one "
                             "single-line ```bash block whose first word is an allowed program "
                             "(any non-comment with --allow-any-command); for models too weak "
                             "to follow the format")
    parser.add_argument("--quiet", action="store_true", help="no per-turn lines, only the summary")
    parser.add_argument("--show-replies", action="store_true",
                        help="print each reply (head and tail of 400 characters) under its turn line")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    url = args.url.rstrip("/")
    try:
        config = LoopConfig(
            agents=args.agents,
            max_steps=args.max_steps,
            per_command_timeout_s=args.per_command_timeout,
            max_output_chars=args.max_output_chars,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            stagger_s=args.stagger,
            allow_any_command=args.allow_any_command,
            job_prefix=args.job_prefix,
        )
        model = args.model or fetch_default_model(url)
    except (ValueError, RuntimeError, requests.RequestException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.allow_any_command:
        print("WARNING: --allow-any-command: the model's commands run unchecked", file=sys.stderr)
    chat = OpenAIChatClient(url, model, config.max_tokens, config.temperature, args.request_timeout,
                            forced_regex=forced_reply_regex(
                                None if config.allow_any_command else DEFAULT_ALLOWED_PROGRAMS)
                            if args.force_bash_block else None)
    counter = ServerTokenCounter(url, model)
    trace_file = open(args.trace, "w") if args.trace else None
    try:
        run = AgentRun(config, chat, counter, TraceWriter(trace_file) if trace_file else None,
                       keep_workspaces=args.keep_workspaces, verbose=not args.quiet,
                       show_replies=args.show_replies)
        started = time.perf_counter()
        results = run.run()
        elapsed = time.perf_counter() - started
    finally:
        if trace_file is not None:
            trace_file.close()
    print(f"\n{len(results)} jobs on {model} in {elapsed:.1f}s")
    print(format_summary(results))
    if args.trace:
        note = " (token counts estimated as len/4: /tokenize unavailable)" if counter.used_fallback else ""
        print(f"trace: {args.trace}{note}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
