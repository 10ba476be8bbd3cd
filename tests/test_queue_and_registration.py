"""Job-aware queue ordering, pin table bookkeeping, and policy registration."""


import pytest
from harness import make_request, prompt_of
from vllm.v1.request import RequestStatus

from vllm_continuum_plugin._version import UnsupportedVLLMVersion, check_vllm_version
from vllm_continuum_plugin.job_queue import ContinuumRequestQueue
from vllm_continuum_plugin.pin_table import Pin, PinTable


def queue_with(pinned_jobs: set, job_arrival: dict):
    def key(r):
        job = (r.sampling_params.extra_args or {}).get("job_id")
        tier = 0 if r.status == RequestStatus.PREEMPTED else (1 if job in pinned_jobs else 2)
        return (tier, job_arrival.get(job, r.arrival_time), r.arrival_time)
    return ContinuumRequestQueue(key)


def test_queue_orders_preempted_then_pinned_then_job_fcfs():
    pinned, arrivals = {"p"}, {"old": 1.0, "new": 5.0, "p": 9.0}
    q = queue_with(pinned, arrivals)
    new = make_request(prompt_of(1, 8), job_id="new", arrival_time=6.0)
    old = make_request(prompt_of(2, 8), job_id="old", arrival_time=7.0)
    pin = make_request(prompt_of(3, 8), job_id="p", arrival_time=10.0)
    pre = make_request(prompt_of(4, 8), job_id="new", arrival_time=8.0)
    pre.status = RequestStatus.PREEMPTED
    for r in (new, old, pin):
        q.add_request(r)
    q.prepend_request(pre)
    assert len(q) == 4 and q.peek_request() is pre
    assert [q.pop_request() for _ in range(4)] == [pre, pin, old, new]
    assert not q
    with pytest.raises(IndexError):
        q.pop_request()


def test_queue_reprioritize_remove_and_iter():
    pinned, arrivals = set(), {"a": 1.0, "b": 2.0}
    q = queue_with(pinned, arrivals)
    a = make_request(prompt_of(1, 8), job_id="a", arrival_time=3.0)
    b = make_request(prompt_of(2, 8), job_id="b", arrival_time=4.0)
    q.add_request(a)
    q.add_request(b)
    assert list(q) == [a, b]
    pinned.add("b")  # b's job gains a pin while it waits
    q.reprioritize([b])
    assert list(q) == [b, a] and len(q) == 2
    q.remove_requests([b])
    assert list(q) == [a] and b not in q
    with pytest.raises(ValueError, match=b.request_id):
        q.remove_request(b)
    for _ in range(500):  # stale heap entries are compacted
        q.reprioritize([a])
    assert len(q._heap) < 200 and q.pop_request() is a


def test_pin_table_deadlines_lateness_and_single_release():
    t = PinTable()
    mk = lambda job, arrival, deadline: Pin(job, job, [[object(), object()]], arrival, 0.0, deadline, deadline, "ls")
    t.add(mk("a", 1.0, 5.0))
    t.add(mk("b", 2.0, 3.0))
    with pytest.raises(KeyError, match="'a'"):
        t.add(mk("a", 1.0, 9.0))
    assert t.num_pinned_blocks == 4 and t.next_deadline() == 3.0
    assert [p.job_id for p in t.expired(4.0)] == ["b"]
    assert t.latest_job_pin().job_id == "b" and t.latest_job_pin(exclude_job="b").job_id == "a"
    assert t.pop("b") is not None and t.pop("b") is None  # never released twice
    assert t.num_pinned_blocks == 2 and t.next_deadline() == 5.0


def test_pin_table_counts_shared_blocks_once():
    t = PinTable()
    shared = [object() for _ in range(3)]
    own_a, own_b = object(), object()
    t.add(Pin("a", "a", [shared + [own_a]], 1.0, 0.0, 9.0, 9.0, "ls"))
    b = Pin("b", "b", [shared + [own_b]], 2.0, 0.0, 9.0, 9.0, "ls")
    assert t.new_blocks(b.blocks_by_group) == 1
    t.add(b)
    assert t.num_pinned_blocks == 5 and t.exclusive_blocks(b) == 1
    assert t.is_held(shared[0]) and not t.is_held(object())
    t.pop("a")
    assert t.num_pinned_blocks == 4 and t.exclusive_blocks(b) == 4
    t.pop("b")
    assert t.num_pinned_blocks == 0


def test_cli_accepts_plugin_policies_and_lists_them_in_help():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--scheduling-policy", "continuum"])
    assert args.scheduling_policy == "continuum"
    assert "context_serve" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--scheduling-policy", "bogus"])


def test_explicit_scheduler_cls_wins_and_stock_policies_unchanged():
    from vllm.config import SchedulerConfig
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_continuum_plugin.registration import register
    from vllm_continuum_plugin.scheduler import ContinuumScheduler

    register()
    register()  # idempotent
    kw = dict(max_model_len=1024, is_encoder_decoder=False, async_scheduling=False)
    assert SchedulerConfig(policy="continuum", **kw).get_scheduler_cls() is ContinuumScheduler
    assert SchedulerConfig(policy="fcfs", **kw).get_scheduler_cls() is Scheduler
    custom = SchedulerConfig(policy="continuum", scheduler_cls="vllm.v1.core.sched.scheduler.Scheduler", **kw)
    assert custom.get_scheduler_cls() is Scheduler
    with pytest.raises(Exception, match="policy"):
        SchedulerConfig(policy="bogus", **kw)


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0", "garbage"])
def test_unsupported_vllm_versions_are_refused_naming_both(version):
    with pytest.raises(UnsupportedVLLMVersion, match="0.32,<0.34"):
        check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.1"])
def test_supported_vllm_versions(version):
    check_vllm_version(version)
