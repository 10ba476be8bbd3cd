"""End to end: two `vllm serve --scheduling-policy continuum` replicas behind a
real `vllm-router` (PyPI 0.1.17, installed by scripts/setup.sh).

Each replica computes on its own core. Jobs identify themselves the way
routers and the plugin both read: ``X-Session-ID: <job id>`` (the plugin
takes it as the job id). Which replica served a turn is read off the
response's ``model``: each replica's first served name is its own.

The plugin's counters reach ``/metrics`` within the engine's snapshot
interval (0.1 s), not with the response, so every check of them after a
response waits for them (``wait_for``). No check races a TTL against the
machine's speed: pins that must be handed
over live for the 600 s cold-start TTL; pins that must lapse ask for a short
TTL and are waited for through counters (bounded by ``wait_for``'s 120 s).
The replica kill is triggered by an event (every job finished its first
turn), not by a timer.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import requests
from harness import TINY_MODEL, all_free, filler, serve_args, wait_for

from vllm_continuum_plugin.benchmarks.router import VLLMRouter
from vllm_continuum_plugin.benchmarks.server import VLLMServer, start_all

pytestmark = pytest.mark.e2e

LONG_TTL_S = 600
SHORT_TOOL_S = 0.3  # -> a TTL of a few seconds: pins that must lapse


@pytest.fixture(scope="module")
def replicas():
    if not os.path.isdir(TINY_MODEL):
        pytest.fail(f"test model missing at {TINY_MODEL}: run scripts/setup.sh")
    args = serve_args("continuum", 128, 200_000_000, 2048, {"default_ttl_s": LONG_TTL_S, "max_ttl_s": LONG_TTL_S})
    cores = max(1, os.cpu_count() or 1)
    servers = [VLLMServer(TINY_MODEL, args, served_name=f"tiny-r{i}", aliases=("tiny",), dtype="float32",
                          env={"VLLM_CPU_OMP_THREADS_BIND": str(i % cores)}) for i in range(2)]
    start_all(servers)
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


def ask(url: str, job: str, messages: list[dict], last: bool, tool_s: float | None = None,
        retries: int = 0) -> dict:
    """One turn through ``url`` (retried like an agent harness would on a
    5xx or a dropped connection)."""
    body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0.0,
            "ignore_eos": True, "is_last_step": last}
    if tool_s is not None:
        body["expected_tool_seconds"] = tool_s
    for attempt in range(retries + 1):
        try:
            r = requests.post(url + "/v1/chat/completions", json=body, headers={"X-Session-ID": job}, timeout=120)
            if r.status_code == 200:
                return r.json()
            error = f"HTTP {r.status_code}: {r.text[:200]}"
        except requests.RequestException as e:
            error = repr(e)
        if attempt == retries:
            raise AssertionError(f"job {job}: {error}")
        time.sleep(0.5)
    raise AssertionError("unreachable")


def replica_of(response: dict, replicas) -> int:
    """Which replica answered: each serves the shared alias ``tiny`` under a
    first name of its own, ``tiny-r<i>``, which vLLM puts in every response
    (the router forwards responses untouched). Read off the response itself,
    not off the replicas' counters, so nothing else that reaches a replica
    can be mistaken for this turn."""
    names = [s.served_name for s in replicas]
    assert response["model"] in names, (response["model"], names)
    return names.index(response["model"])


def released(replicas, reason: str) -> list[float]:
    return [s.metric("vllm_continuum:pins_released_total", reason=reason) for s in replicas]


def run_job(url: str, job: str, turns: int, replicas=None, tool_s: float | None = None) -> list[tuple[int, dict]]:
    """Sequential turns of one job; returns (replica, response) per turn."""
    messages = [{"role": "system", "content": filler("system", 60)},
                {"role": "user", "content": filler(job, 80)}]
    out = []
    for t in range(turns):
        r = ask(url, job, messages, last=t == turns - 1, tool_s=tool_s)
        out.append((replica_of(r, replicas) if replicas else -1, r))
        messages += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                     {"role": "user", "content": filler(f"{job}-out{t}", 40)}]
    return out


def test_consistent_hashing_on_the_session_keeps_every_turn_on_its_pin(replicas):
    assert wait_for(lambda: all_free(replicas))
    handoff0, ttl0 = sum(released(replicas, "handoff")), sum(released(replicas, "ttl"))
    with VLLMRouter([s.url for s in replicas], "consistent_hash") as router:
        homes = {}
        for j in range(6):
            turns = run_job(router.url, f"ch-{j}", 4, replicas)
            homes[f"ch-{j}"] = {replica for replica, _ in turns}
            # Every later turn found the earlier turns' KV pinned on its replica.
            prompt1 = turns[0][1]["usage"]["prompt_tokens"]
            for _, r in turns[1:]:
                assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt1 - 32
    assert all(len(h) == 1 for h in homes.values()), homes
    assert wait_for(lambda: sum(released(replicas, "handoff")) - handoff0 == 6 * 3)  # every pin taken over
    assert sum(released(replicas, "ttl")) - ttl0 == 0  # none stranded
    assert wait_for(lambda: all_free(replicas))


def test_round_robin_sends_next_turns_where_the_pin_is_not(replicas):
    """The control: strict rotation puts turn 2 on the other replica, and a
    pin left behind by the job's second-to-last turn can only lapse."""
    assert wait_for(lambda: all_free(replicas))
    handoff0, ttl0 = sum(released(replicas, "handoff")), sum(released(replicas, "ttl"))
    with VLLMRouter([s.url for s in replicas], "round_robin") as router:
        turns = run_job(router.url, "rr-0", 4, replicas, tool_s=SHORT_TOOL_S)
    where = [replica for replica, _ in turns]
    assert where[1] != where[0] and where[2] != where[1] and where[3] != where[2], where
    # Turn 2 found no pin of the job on its replica: only the system prompt
    # (shared with the other tests' jobs) can be cached there.
    assert turns[1][1]["usage"]["prompt_tokens_details"]["cached_tokens"] < turns[0][1]["usage"]["prompt_tokens"] - 32
    assert wait_for(lambda: sum(released(replicas, "ttl")) - ttl0 >= 1)  # turn 3's pin, stranded
    assert sum(released(replicas, "handoff")) - handoff0 < 3
    assert wait_for(lambda: all_free(replicas))


def test_a_job_moved_off_a_drained_replica_is_served_elsewhere_and_its_old_pin_frees(replicas):
    assert wait_for(lambda: all_free(replicas))
    with VLLMRouter([s.url for s in replicas], "consistent_hash") as router:
        messages = [{"role": "system", "content": filler("system", 60)},
                    {"role": "user", "content": filler("moved", 80)}]
        first = ask(router.url, "moved", messages, last=False, tool_s=SHORT_TOOL_S)
        home = replica_of(first, replicas)
        ttl_home = released(replicas, "ttl")[home]
        assert wait_for(lambda: replicas[home].metric("vllm_continuum:pinned_blocks") > 0)
        # Drain: the router stops sending to the job's replica.
        r = requests.post(router.url + "/remove_worker", params={"url": replicas[home].url}, timeout=10)
        assert r.status_code in (200, 202), r.text
        messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                     {"role": "user", "content": filler("moved-out0", 40)}]
        second = ask(router.url, "moved", messages, last=True)
        elsewhere = replica_of(second, replicas)
    assert elsewhere != home
    # Served in full on the new replica (recomputed: no shared KV tier here).
    assert second["usage"]["completion_tokens"] == 8
    assert second["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]
    # Nothing leaks where the job was: its pin lapses by TTL and every block frees.
    assert wait_for(lambda: released(replicas, "ttl")[home] >= ttl_home + 1)
    assert wait_for(lambda: all_free(replicas))


def test_killing_a_replica_mid_run_loses_only_its_pins_and_every_job_completes(replicas):
    """Last in the module: it kills a replica by PID."""
    assert wait_for(lambda: all_free(replicas))
    jobs = [f"kill-{j}" for j in range(6)]
    first_turn_done = threading.Barrier(len(jobs) + 1)
    killed = threading.Event()
    results: dict[str, object] = {}
    with VLLMRouter([s.url for s in replicas], "consistent_hash") as router:
        def job(name: str) -> None:
            try:
                messages = [{"role": "system", "content": filler("system", 60)},
                            {"role": "user", "content": filler(name, 80)}]
                for t in range(4):
                    r = ask(router.url, name, messages, last=t == 3, retries=20)
                    assert r["usage"]["completion_tokens"] == 8
                    messages += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                                 {"role": "user", "content": filler(f"{name}-out{t}", 40)}]
                    if t == 0:
                        first_turn_done.wait(timeout=300)
                        killed.wait(timeout=300)
                results[name] = "done"
            except BaseException as e:  # reported below
                results[name] = e

        threads = [threading.Thread(target=job, args=(name,)) for name in jobs]
        for t in threads:
            t.start()
        first_turn_done.wait(timeout=300)
        # Every job holds a pin now; kill the replica holding most of them.
        assert wait_for(lambda: sum(r.metric("vllm_continuum:pinned_jobs") for r in replicas) == len(jobs))
        victim = max(range(2), key=lambda i: replicas[i].metric("vllm_continuum:pinned_jobs"))
        survivor = replicas[1 - victim]
        moved = replicas[victim].metric("vllm_continuum:pinned_jobs")
        assert moved >= 1
        replicas[victim].kill()
        killed.set()
        for t in threads:
            t.join(timeout=600)
    assert results == {name: "done" for name in jobs}
    # The survivor served the moved jobs' remaining turns and ended every job:
    # no pin and no block left on it.
    assert wait_for(lambda: all_free([survivor]))
    assert survivor.metric("vllm_continuum:pinned_jobs") == 0
