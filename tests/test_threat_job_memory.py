"""Memory per job: at most 16 KB in the worst case (issue 23, finding 4).

What the plugin keeps for one live job, built the worst way a client can:
a 256-character job id, a 128-character scope, every turn with the hint
``tests/test_threat_parsing.py`` found to parse into the largest call, a
full window of round-trip samples, and the conversation's full window of
remembered prompts -- on a real vLLM scheduler. Counted: the job's state
(``JobTracker``), its conversation (``Conversations``) and its pin entry
(without vLLM's KV block objects: those are the pool's, bounded by it).
The bound is documented in docs/clients.md.
"""

from __future__ import annotations

from harness import make_request, make_scheduler, prompt_of, run_until_finished, scripted, tiny_tokens
from test_threat_parsing import _adversarial_hints, _deep_size

from vllm_continuum_plugin.conversations import MAX_PROMPTS
from vllm_continuum_plugin.estimators.parser import parsed_prefix, shell_call
from vllm_continuum_plugin.metadata import MAX_JOB_ID_LENGTH, MAX_SCOPE_CHARS

MAX_JOB_BYTES = 16 * 1024
EOS = 2


def _worst_hint() -> str:
    hints = _adversarial_hints()
    return max(hints.values(), key=lambda h: _deep_size(shell_call(parsed_prefix(h))))


def test_a_live_job_keeps_at_most_16_kb_in_the_worst_case():
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    s = make_scheduler(num_blocks=256, continuum={"default_ttl_s": 600, "max_ttl_s": 600})
    job = "j" * MAX_JOB_ID_LENGTH
    # A tool time hint makes every next arrival a round-trip sample.
    extra = {"continuum_scope": "s" * MAX_SCOPE_CHARS, "tool_command": _worst_hint(), "expected_tool_seconds": 0.5}
    reply = tiny_tokens("```bash\nls\n```") + [EOS]
    prompt = prompt_of(1, 40)
    last = None
    for turn in range(MAX_PROMPTS + 8):  # more turns than any window keeps
        r = scripted(make_request(prompt, max_tokens=len(reply), job_id=job, is_last_step=False, extra=extra), reply)
        s.add_request(r)
        run_until_finished(s, [r])
        s.clock.advance(1.0 + turn)  # a round trip sample per turn
        prompt = list(r.all_token_ids) + prompt_of(2 + turn, 20)
        last = r
    state = s.jobs.get(job)
    assert state is not None and state.last_call is not None and len(state.overhead_samples or ()) > 0
    sizes = {
        "job state": _deep_size(state, skip=KVCacheBlock),
        "conversation": _deep_size(s.conversations._sessions[job], skip=KVCacheBlock),
        "pin": _deep_size(s.pins.get(job), skip=KVCacheBlock),
    }
    total = sum(sizes.values())
    print(f"\nper job, worst case: {total} bytes {sizes}")
    assert s.pins.get(job).request_id == last.request_id
    assert total <= MAX_JOB_BYTES, sizes
