"""The test-only logits processor behind the agent-client tests, without a server.

``scripted_replies`` picks a reply by the markers a prompt holds and forces
it token by token; ``agent_clients.SCRIPTS`` are the replies the real
clients get (``tests/test_e2e_agent_clients.py``, opt-in). These checks are
fast and run in every suite: a script whose tool calls vLLM's ``hermes``
parser could not read would only show up in the opt-in run.
"""

from __future__ import annotations

import json

import pytest
import torch
from agent_clients import CLAUDE_MATCH, OPENCODE_MATCH, SCRIPTS, SMOLAGENTS_MATCH
from scripted_replies import _ForcedReply, choose_reply


@pytest.mark.parametrize("match", [CLAUDE_MATCH, OPENCODE_MATCH, SMOLAGENTS_MATCH])
def test_the_step_is_the_number_of_markers_in_the_prompt(match):
    steps = next(s for s in SCRIPTS["scripts"] if s["match"] == match)["steps"]
    prompt = f"system: {match}. user: the task."
    for i, step in enumerate(steps):
        assert choose_reply(SCRIPTS, prompt) == (match, step["reply"], i)
        prompt += " assistant: " + step["reply"] + " tool: output"
    # Past the end (a client that goes on): the final answer again.
    assert choose_reply(SCRIPTS, prompt)[1] == steps[-1]["reply"]


def test_a_prompt_of_no_script_gets_the_default():
    assert choose_reply(SCRIPTS, "Generate a title for this conversation") == ("", SCRIPTS["default"], 0)


def test_every_scripted_tool_call_is_read_by_vllms_hermes_parser():
    from transformers import AutoTokenizer
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    from harness import DEFAULT_MODEL

    parser = Hermes2ProToolParser(AutoTokenizer.from_pretrained(DEFAULT_MODEL))
    for script in SCRIPTS["scripts"]:
        for step in script["steps"]:
            if "<tool_call>" not in step["reply"]:
                continue
            info = parser.extract_tool_calls(step["reply"], None)
            assert info.tools_called and len(info.tool_calls) == 1, step
            call = info.tool_calls[0].function
            assert call.name.lower() == "bash" and step["marker"] in json.loads(call.arguments)["command"]


class _Owner:
    eos_id = 2

    def reply_ids(self, prompt_ids):
        return [7, 8]


def test_the_reply_is_forced_token_by_token_then_end_of_sequence():
    forced = _ForcedReply(_Owner())
    output: list[int] = []
    for expected in (7, 8, 2, 2):
        logits = forced([1, 2, 3], output, torch.zeros(16))
        assert int(torch.argmax(logits)) == expected and torch.isinf(logits).sum() == 15
        output.append(expected)
