"""Which prompt continues which: the shared-prefix rule (``prompt_prefix``), as pure logic.

Block hashes are stand-ins that chain as vLLM's do: ``h(i, tag)`` is equal
for two prompts exactly when they agree up to block ``i``.
"""

from __future__ import annotations

import pytest

from vllm_continuum_plugin.prompt_prefix import CHECKPOINTS, CONTINUE_SHARE, TAIL_CHECKPOINTS, PromptPrefix


def chain(n: int, diverge_at: int | None = None, tag: str = "b") -> list[str]:
    """n chained hashes; from ``diverge_at`` on they belong to branch ``tag``."""
    return [f"{i}" if diverge_at is None or i < diverge_at else f"{i}-{tag}" for i in range(n)]


@pytest.mark.parametrize("n", [1, 5, CHECKPOINTS, CHECKPOINTS + 1, 1000, 6250])
def test_a_prompt_continued_whole_shares_all_its_blocks(n):
    prefix = PromptPrefix(chain(n), n)
    assert prefix.shared_blocks(chain(n + 7)) == n
    assert prefix.continued_by(chain(n + 7))


@pytest.mark.parametrize("n, diverge", [(1000, 999), (1000, 700), (1000, 501), (6250, 3126), (40, 30), (7, 4)])
def test_the_shared_prefix_is_known_to_one_checkpoint_and_never_overstated(n, diverge):
    prefix = PromptPrefix(chain(n), n)
    shared = prefix.shared_blocks(chain(n + 3, diverge_at=diverge))
    assert shared <= diverge  # never more than really shared
    assert diverge - shared < n / min(n, CHECKPOINTS) + 1  # within one checkpoint's spacing


@pytest.mark.parametrize("n", [33, 100, 731, 6250, 100_000])
@pytest.mark.parametrize("d", [0, 1, 2, 3, 5, 11, 31])
def test_a_prefix_that_stops_near_the_end_is_known_to_within_the_unshared_tail_again(n, d):
    # A tail rewrite leaves all but the last d blocks shared: the checkpoints
    # near the end know that to within another d + 1 blocks, however long
    # the prompt (evenly spaced ones alone would lose up to n / 16).
    prefix = PromptPrefix(chain(n), n)
    shared = prefix.shared_blocks(chain(n + 5, diverge_at=n - d))
    assert n - 2 * d - 1 <= shared <= n - d


def test_a_sibling_whose_base_is_nearly_its_whole_prompt_is_continued_after_a_tail_rewrite():
    # Parallel sub-agents started together share all but a few blocks of
    # their first prompts (720 of 731 blocks came from a sibling). The next
    # prompt rewrites the last 3 blocks and appends a tool result: it shares
    # 728 > 720 and continues; a sibling's prompt, sharing only the 720,
    # does not.
    prefix = PromptPrefix(chain(731), 731)
    assert prefix.continued_by(chain(760, diverge_at=728), base_blocks=720)
    assert not prefix.continued_by(chain(760, diverge_at=720, tag="sibling"), base_blocks=720)


def test_a_rewritten_tail_continues_and_a_compacted_history_does_not():
    prefix = PromptPrefix(chain(1000), 1000)
    assert prefix.continued_by(chain(1010, diverge_at=995))  # AIPerf's tail block, a reminder
    assert prefix.continued_by(chain(800, diverge_at=600))  # reasoning dropped from history
    assert not prefix.continued_by(chain(300, diverge_at=200))  # a summary after the system prompt


def test_the_base_others_share_is_no_continuation_even_when_it_is_most_of_the_prompt():
    prefix = PromptPrefix(chain(100), 100)
    # 40 blocks of system prompt and tools came from other traffic: a sub-agent
    # sharing 45 shares too little beyond them; one sharing 75 continues.
    assert not prefix.continued_by(chain(120, diverge_at=45), base_blocks=40)
    assert prefix.continued_by(chain(120, diverge_at=75), base_blocks=40)
    # A sub-agent beside a prompt that is mostly system prompt and tools (80
    # of its 100 blocks, computed by earlier traffic) shares all of them and
    # nothing of its own: no continuation.
    assert not prefix.continued_by(chain(120, diverge_at=80), base_blocks=80)
    assert prefix.continuation(chain(120, diverge_at=40), base_blocks=40) is None
    # A resumed session whose first turn hit everything: its exact
    # continuation still continues it (the base stops a block short).
    assert prefix.continued_by(chain(120), base_blocks=100)


def test_a_prompt_shorter_than_a_block_continues_nothing():
    prefix = PromptPrefix([], 0)
    assert prefix.shared_blocks(chain(10)) == 0
    assert not prefix.continued_by(chain(10)) and not prefix.continued_by([])


def test_the_threshold_is_half_of_the_own_blocks():
    assert CONTINUE_SHARE == 0.5
    prefix = PromptPrefix(chain(10), 10)
    assert prefix.continued_by(chain(12, diverge_at=5))
    assert not prefix.continued_by(chain(12, diverge_at=4))


def test_memory_is_bounded_whatever_the_prompt_length():
    for n in (33, 1000, 100_000):
        assert len(PromptPrefix(chain(n), n)._hashes) <= CHECKPOINTS + TAIL_CHECKPOINTS
    with pytest.raises(ValueError, match="num_blocks"):
        PromptPrefix(chain(3), 4)
