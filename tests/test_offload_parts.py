"""``ContinuumOffloadConnector``'s parts as pure logic (no engine).

The byte-budgeted LRU store (budget never exceeded, LRU order, holds and
pins, vLLM block-hash keys), the layout-agnostic block view the worker
copies through, the scheduler side's job holds, the settings and the stats
payload. The same connector inside a real vLLM engine:
tests/test_connector.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from vllm_continuum_plugin.connectors import cpu_store, kv_offload, offload_metrics

CPUStore = cpu_store.CPUStore


# ----------------------------------------------------------------------
# The store
# ----------------------------------------------------------------------
def test_store_budget_is_never_exceeded_under_random_traffic():
    rng = random.Random(7)
    evicted: list[bytes] = []
    store = CPUStore(10_000, on_evict=lambda k, n: evicted.append(k))
    for step in range(3000):
        op = rng.random()
        key = rng.randrange(400).to_bytes(4, "big")
        if op < 0.6:
            size = rng.choice([100, 700, 1500, 4000])
            value = torch.empty(size, dtype=torch.uint8)
            store.put(key, value)
        elif op < 0.75:
            store.pin(key)
        elif op < 0.9:
            store.unpin(key)
        else:
            store.get(key)
        assert 0 <= store.used_bytes <= store.capacity_bytes
        assert store.pinned_bytes <= store.used_bytes
        assert store.used_bytes == sum(store.nbytes_of(k) for k in store.keys_lru())
    assert evicted, "the workload must have needed evictions"
    assert store.counters.evicted_items == len(evicted)


def test_store_refuses_items_bigger_than_the_budget_without_evicting():
    store = CPUStore(1000)
    assert store.put(b"a", None, nbytes=600)
    assert not store.put(b"big", None, nbytes=1001)
    assert b"a" in store and b"big" not in store
    store.pin(b"a")
    # 600 pinned: a 500-byte item cannot fit, and nothing is evicted.
    assert not store.put(b"b", None, nbytes=500)
    assert b"a" in store and store.used_bytes == 600
    assert store.counters.refused_items == 2
    store.unpin(b"a")
    assert store.put(b"b", None, nbytes=500)
    assert b"a" not in store and store.used_bytes == 500


def test_store_evicts_least_recently_used_first():
    store = CPUStore(300)
    for k in (b"a", b"b", b"c"):
        assert store.put(k, None, nbytes=100)
    assert store.keys_lru() == [b"a", b"b", b"c"]
    store.get(b"a")  # a becomes most recently used
    store.put(b"b", None, nbytes=100)  # re-put = touch, no copy
    assert store.keys_lru() == [b"c", b"a", b"b"]
    store.put(b"d", None, nbytes=100)
    assert b"c" not in store
    store.demote(b"b")
    store.put(b"e", None, nbytes=150)  # needs 2 evictions: b then a
    assert store.keys_lru() == [b"d", b"e"]
    assert store.used_bytes == 250


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_held_entries_outlive_every_unheld_entry():
    """Blocks held for a job whose next turn is expected survive traffic
    that evicts everything else, until the hold ends."""
    clock = _Clock()
    store = CPUStore(500, clock=clock)
    for k in (b"job-1", b"job-2"):
        store.put(k, None, nbytes=100)
        assert store.hold(k, clock.now + 60)
    assert store.held_bytes == 200 and store.num_held == 2
    for i in range(10):  # 10 x 100 bytes through a 300-byte unheld room
        assert store.put(f"other-{i}".encode(), None, nbytes=100)
    assert b"job-1" in store and b"job-2" in store
    assert store.keys_lru() == [b"other-7", b"other-8", b"other-9", b"job-1", b"job-2"]
    # Touching a held entry keeps the hold; releasing makes it recently used.
    store.touch(b"job-1")
    assert store.is_held(b"job-1")
    assert store.release_hold(b"job-1") and not store.is_held(b"job-1")
    assert store.keys_lru()[-2:] == [b"job-1", b"job-2"]
    assert store.held_bytes == 100


def test_held_entries_go_last_by_deadline_and_pins_still_win():
    clock = _Clock()
    store = CPUStore(300, clock=clock)
    store.put(b"late", None, nbytes=100)
    store.put(b"early", None, nbytes=100)
    store.put(b"pinned", None, nbytes=100)
    store.hold(b"late", clock.now + 50)
    store.hold(b"early", clock.now + 10)
    store.hold(b"pinned", clock.now + 1)
    store.pin(b"pinned")
    # Only held entries are left: the earliest deadline goes first, a pinned
    # one never.
    assert store.put(b"x", None, nbytes=100)
    assert b"early" not in store and b"late" in store and b"pinned" in store
    assert store.put(b"y", None, nbytes=100)  # x is unheld: it goes first
    assert b"x" not in store and b"late" in store
    assert store.hold(b"late", clock.now + 5) and store.hold(b"late", clock.now + 80)
    assert store.keys_lru() == [b"y", b"pinned", b"late"]  # extended, not shortened
    assert not store.put(b"big", None, nbytes=201)  # 100 pinned: refused, nothing evicted
    assert len(store) == 3


def test_a_hold_lapses_so_a_job_that_never_returns_cannot_keep_its_blocks():
    clock = _Clock()
    store = CPUStore(300, clock=clock)
    store.put(b"gone-job", None, nbytes=100)
    store.hold(b"gone-job", clock.now + 30)
    store.put(b"a", None, nbytes=100)
    store.put(b"b", None, nbytes=100)
    clock.now += 31
    assert store.put(b"c", None, nbytes=100)  # the lapsed hold is the first victim
    assert b"gone-job" not in store and b"a" in store
    assert store.held_bytes == 0 and store.num_held == 0
    assert not store.hold(b"a", clock.now - 1)  # a deadline in the past holds nothing
    # demote() ends a hold and makes the entry the next victim.
    store.hold(b"b", clock.now + 30)
    assert store.demote(b"b") and not store.is_held(b"b")
    store.put(b"d", None, nbytes=100)
    assert b"b" not in store


def test_a_lapsed_context_leaves_the_store_from_its_tail():
    """A context's blocks are held tail first (as the scheduler hands them
    over and as the GPU evicts them). When the hold lapses they become the
    first victims in that order, so what is left of the context is still a
    prefix a load can match, not a tail behind a missing head."""
    clock = _Clock()
    store = CPUStore(400, clock=clock)
    chain = [b"head", b"mid", b"tail"]
    for key in reversed(chain):  # tail first
        store.put(key, None, nbytes=100)
        store.hold(key, clock.now + 30)
    store.put(b"other", None, nbytes=100)
    clock.now += 31
    assert store.expire_holds() == 3
    assert store.keys_lru() == [b"tail", b"mid", b"head", b"other"]
    store.put(b"new-1", None, nbytes=100)
    store.put(b"new-2", None, nbytes=100)  # two victims: the tail, then the middle
    assert b"head" in store and b"mid" not in store and b"tail" not in store


def test_store_accounting_stays_exact_with_pins_and_holds():
    rng = random.Random(11)
    clock = _Clock()
    store = CPUStore(5_000, clock=clock)
    for _ in range(4000):
        op = rng.random()
        key = rng.randrange(120).to_bytes(2, "big")
        if op < 0.45:
            store.put(key, None, nbytes=rng.choice([100, 400, 900]))
        elif op < 0.55:
            store.pin(key)
        elif op < 0.65:
            store.unpin(key)
        elif op < 0.8:
            store.hold(key, clock.now + rng.uniform(0.1, 5))
        elif op < 0.85:
            store.release_hold(key)
        elif op < 0.9:
            store.demote(key)
        elif op < 0.95:
            store.pop(key)
        else:
            clock.now += rng.uniform(0, 1)
        keys = store.keys_lru()
        assert len(keys) == len(set(keys)) == len(store)
        assert 0 <= store.used_bytes <= store.capacity_bytes
        assert store.used_bytes == sum(store.nbytes_of(k) for k in keys)
        assert store.held_bytes == sum(store.nbytes_of(k) for k in keys if store.is_held(k))
        assert store.pinned_bytes == sum(store.nbytes_of(k) for k in keys if store.is_pinned(k))
    assert store.counters.evicted_items > 0


def test_store_is_keyed_by_vllm_block_hashes():
    """Keys are vLLM's chained block hashes: a prefix-chain lookup finds the
    shared prefix of two prompts, and same-length prompts that differ in an
    early block share nothing after it."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash

    init_none_hash(sha256)

    def chain(tokens: list[int], bs: int = 4) -> list[bytes]:
        out: list[bytes] = []
        parent = None
        for i in range(0, len(tokens) - len(tokens) % bs, bs):
            parent = hash_block_tokens(sha256, parent, tokens[i : i + bs])
            out.append(parent)
        return out

    a = chain(list(range(16)))
    b = chain(list(range(8)) + [99, 98, 97, 96] + list(range(12, 16)))
    c = chain([1, 0] + list(range(2, 16)))  # differs in block 0, same length
    store = CPUStore(10**6)
    for key in a:
        store.put(key, None, nbytes=10)
    assert store.prefix_hits(a) == 4
    assert store.prefix_hits(b) == 2  # blocks 0-1 shared, block 2 differs
    assert b[3] not in store  # same tokens as a's block 3, different prefix
    assert store.prefix_hits(c) == 0 and not any(k in store for k in c)


def test_block_major_view_handles_vllm_layouts():
    view = kv_offload.block_major_view
    nb = 6
    # vLLM 0.32 [B, H, N, C]
    t = torch.arange(nb * 2 * 4 * 3, dtype=torch.float32).reshape(nb, 2, 4, 3)
    assert view(t, nb).data_ptr() == t.data_ptr() and view(t, nb).shape[0] == nb
    # legacy [2, B, N, H, D]
    t2 = torch.arange(2 * nb * 4 * 3, dtype=torch.float32).reshape(2, nb, 4, 3)
    v2 = view(t2, nb)
    assert v2.shape == (nb, 2, 4, 3) and torch.equal(v2[4], t2[:, 4])
    # kernel blocks: B * 2 rows
    t3 = torch.arange(nb * 2 * 5, dtype=torch.float32).reshape(nb * 2, 5)
    v3 = view(t3, nb)
    assert v3.shape == (nb, 2, 5) and torch.equal(v3[1].reshape(-1), t3[2:4].reshape(-1))
    # writes through the view reach the cache
    v2.index_copy_(0, torch.tensor([1]), torch.zeros(1, 2, 4, 3))
    assert torch.count_nonzero(t2[:, 1]) == 0
    with pytest.raises(ValueError):
        view(torch.zeros(5, 7), nb)


class _FakeSpec:
    def __init__(self, page_size_bytes: int, block_size: int = 32) -> None:
        self.page_size_bytes = page_size_bytes
        self.block_size = block_size


class _FakeGroup:
    def __init__(self, spec, layer_names) -> None:
        self.kv_cache_spec = spec
        self.layer_names = layer_names


class _FakeKVCacheConfig:
    def __init__(self, num_blocks: int, page_size_bytes: int, layer_names) -> None:
        self.num_blocks = num_blocks
        self.kv_cache_groups = [_FakeGroup(_FakeSpec(page_size_bytes), list(layer_names))]


def _worker_spec(capacity_bytes: int) -> kv_offload.SideSpec:
    return kv_offload.SideSpec(kv_offload.OffloadSettings(), block_size=32, capacity_bytes=capacity_bytes)


def _layouts(nb: int):
    """Per-layer KV tensors (2 layers) in the layouts vLLM uses: [B, H, N, C]
    views of one allocation (layer-outermost and block-outermost), the legacy
    [2, B, N, H, D], and kernel-split blocks [B * 2, ...]."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    # One layer's block holds (2, 32, 16) values (K/V, tokens, heads*dim).
    layer_outer = rand(2, nb, 2, 32, 16)
    yield "layer-outermost", {"l0": layer_outer[0], "l1": layer_outer[1]}
    block_outer = rand(nb, 2, 2, 32, 16)
    yield "block-outermost", {"l0": block_outer[:, 0], "l1": block_outer[:, 1]}
    legacy = rand(2, 2, nb, 32, 16)
    yield "legacy [2, B, ...]", {"l0": legacy[0], "l1": legacy[1]}
    split = rand(2, nb * 2, 2, 16, 16)
    yield "kernel blocks", {"l0": split[0], "l1": split[1]}


@pytest.mark.parametrize("layout", range(4))
def test_worker_copies_whole_blocks_in_any_layout(layout):
    nb = 8
    name, caches = list(_layouts(nb))[layout]
    page = 2 * 32 * 16 * 2  # bytes of one layer's block (bf16)
    cfg = _FakeKVCacheConfig(nb, page, caches)
    worker = kv_offload._WorkerSide(_worker_spec(10 * 2 * (page + 16)), None, cfg)
    worker.register_kv_caches(caches)
    assert worker.block_nbytes == 2 * page
    views = {k: kv_offload.block_major_view(v, nb) for k, v in caches.items()}
    original = {k: v.clone() for k, v in views.items()}
    meta = kv_offload.ContinuumOffloadMetadata(stores=[(b"k3", 3), (b"k5", 5)])
    worker.after_forward(meta)
    for v in views.values():  # the GPU blocks get overwritten
        v[3].zero_()
        v[5].zero_()
        v[6].fill_(7)
    load = kv_offload.ContinuumOffloadMetadata(
        loads=[kv_offload.LoadJob("r", [b"k5", b"k3", b"gone"], [6, 3, 2])]
    )
    worker.before_forward(load)
    worker.load(load)
    for k, v in views.items():
        assert torch.equal(v[6], original[k][5]), name
        assert torch.equal(v[3], original[k][3]), name
        assert torch.equal(v[2], original[k][2]), name  # untouched
    assert worker.take_load_errors() == {2} and worker.take_missing() == {b"gone"}
    stats = worker.take_stats()
    assert stats.counter("stored_blocks") == 2 and stats.counter("loaded_blocks") == 2


def test_worker_loads_blocks_the_same_step_copies_out():
    """Victim mode may load, in one step, blocks that step's allocations
    evicted (their pre-stores): the worker copies the pre-stores out before
    it copies the loads in, even into the very blocks they came from."""
    nb = 8
    _, caches = next(iter(_layouts(nb)))
    page = 2 * 32 * 16 * 2
    worker = kv_offload._WorkerSide(_worker_spec(10 * 2 * (page + 16)), None, _FakeKVCacheConfig(nb, page, caches))
    worker.register_kv_caches(caches)
    views = {k: kv_offload.block_major_view(v, nb) for k, v in caches.items()}
    original = {k: v.clone() for k, v in views.items()}
    meta = kv_offload.ContinuumOffloadMetadata(
        pre_stores=[(b"k3", 3), (b"k4", 4)], loads=[kv_offload.LoadJob("r", [b"k3", b"k4"], [4, 3])]
    )
    worker.before_forward(meta)
    worker.load(meta)
    for k, v in views.items():
        assert torch.equal(v[4], original[k][3]) and torch.equal(v[3], original[k][4])
    assert worker.take_load_errors() == set()


class _Block:
    def __init__(self, name: str, block_id: int, ref_cnt: int = 1) -> None:
        self.block_hash = name.encode().ljust(8, b"-") + (0).to_bytes(4, "big")  # + group id
        self.key = name.encode().ljust(8, b"-")
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self.is_null = False


class _BlocksOf:
    def __init__(self, blocks) -> None:
        self.blocks = [blocks]


class _Manager:
    def __init__(self, blocks_by_req) -> None:
        self.blocks_by_req = blocks_by_req

    def get_blocks(self, req_id):
        return _BlocksOf(self.blocks_by_req[req_id])


def _scheduler_side(manager, hold_seconds: float = 300.0, capacity_bytes: int = 100):
    """The connector's scheduler side on a 32-token block, a store of
    ``capacity_bytes`` and ``manager`` as the bound KV cache manager."""
    spec = kv_offload.SideSpec(kv_offload.OffloadSettings(hold_seconds=hold_seconds), 32, capacity_bytes)
    return kv_offload._SchedulerSide(spec, None, None, lambda: manager)


class _Req:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


def test_job_holds_end_at_the_next_turn_and_a_finished_job_goes_first():
    """Scheduler side: blocks handed over for a job are held; admission of
    its next turn releases them to plain LRU; its last turn demotes the
    blocks only it uses (a system prompt shared with a running request keeps
    its place)."""
    shared, own1, own2, other = (
        _Block("system", 1, ref_cnt=2), _Block("job-a-1", 2), _Block("job-a-2", 3), _Block("other", 4)
    )
    side = _scheduler_side(_Manager({"turn-2": [shared, own1, own2]}))
    index = side.index
    for b in (shared, own1, own2, other):
        index.put(b.key, None, nbytes=1)
    assert side.save_blocks([own1, own2], hold_job="job-a") == 0  # already stored
    assert index.is_held(own1.key) and index.is_held(own2.key)
    # Held entries go last, the chain's tail before its head.
    assert index.keys_lru() == [shared.key, other.key, own2.key, own1.key]
    assert side.end_hold("job-a", demote=False) == 2  # the next turn was admitted
    assert index.held_bytes == 0 and not side.job_holds
    assert index.keys_lru()[-2:] == [own2.key, own1.key]  # head most recently used
    # The job's last turn finishes.
    side.save_blocks([own1, own2], hold_job="job-a")
    side.end_hold("job-a", demote=True)
    assert side.demote_request(_Req("turn-2")) == 2
    assert index.keys_lru()[:2] == [own2.key, own1.key]  # next victims, tail first
    assert index.keys_lru()[2] == shared.key  # untouched by the demotion
    assert index.num_held == 0


def test_holds_are_capped_per_job_and_in_all():
    """A client claiming hour-long tools on every turn cannot take the
    store: a job's holds stop at max_job_held_fraction (its chain's head is
    what stays held), all jobs' at max_held_fraction."""
    side = _scheduler_side(_Manager({}))  # 100 one-byte blocks
    index = side.index
    chains = {job: [_Block(f"{job}-{i}", 10 + 40 * n + i) for i in range(40)] for n, job in enumerate("abc")}
    for job, blocks in chains.items():
        for b in blocks:
            index.put(b.key, None, nbytes=1) if len(index) < 100 else None
    for job in "abc":
        side.save_blocks([b for b in chains[job] if b.key in index], hold_job=job)
    held = {job: [b for b in chains[job] if index.is_held(b.key)] for job in "abc"}
    assert len(held["a"]) == 25 and held["a"] == chains["a"][:25]  # the head
    assert len(held["b"]) == 25 and held["c"] == []  # 50 in all
    assert index.held_bytes == 50


def test_blocks_not_yet_stored_are_held_once_admitted():
    from types import SimpleNamespace

    block = _Block("job-b-1", 5)
    side = _scheduler_side(_Manager({}))
    assert side.save_blocks([block], hold_job="job-b") == 1  # queued for a pre-forward copy
    assert block.key in side.pending_holds
    side.mode = "explicit"  # no eager planning: only the handed-over block
    meta = side.build_connector_meta(SimpleNamespace(num_scheduled_tokens={}))
    assert meta.pre_stores == [(block.key, 5)]
    assert side.index.is_held(block.key) and not side.pending_holds
    side.reset()
    assert not side.job_holds and len(side.index) == 0


def test_the_store_evicts_a_prefix_chain_from_its_tail():
    """Eager stores enter a request's chain tail first, so under LRU the
    head -- without which no later block of the chain can be matched -- is
    evicted last, and what is left still reloads as a prefix."""
    from types import SimpleNamespace

    keys = [_Block(f"chain-{i}", i + 1) for i in range(3)]
    manager = SimpleNamespace(get_block_ids=lambda req_id: [[1, 2, 3]])
    side = _scheduler_side(manager, capacity_bytes=3)  # three 1-byte entries
    request = SimpleNamespace(
        request_id="r", num_computed_tokens=0, num_tokens=100,
        block_hashes=[b.key for b in keys],  # already group-free BlockHashes
    )
    side.requests["r"] = request
    out = SimpleNamespace(
        num_scheduled_tokens={"r": 96}, preempted_req_ids=[], kv_connector_block_state=None,
        scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=[]),
    )
    meta = side.build_connector_meta(out)
    assert sorted(meta.stores) == [(b.key, b.block_id) for b in keys]
    assert side.index.keys_lru() == [keys[2].key, keys[1].key, keys[0].key]
    side.index.put(b"newcomer", None, nbytes=1)
    assert keys[2].key not in side.index  # the tail went first
    request.num_computed_tokens = 0
    assert side.stored_prefix_tokens(request) == 64  # blocks 0 and 1 still reload


def test_settings_are_validated():
    s = kv_offload.OffloadSettings.from_extra_config({"cpu_bytes": 2e9, "store_mode": "finish"})
    assert s.cpu_bytes == 2_000_000_000 and s.store_mode == "finish"
    with pytest.raises(ValueError, match="unknown"):
        kv_offload.OffloadSettings.from_extra_config({"cpu_byte": 1})
    with pytest.raises(ValueError, match="store_mode"):
        kv_offload.OffloadSettings.from_extra_config({"store_mode": "lazy"})
    assert kv_offload.OffloadSettings.from_extra_config({}).hold_seconds == 300.0
    for bad in (-1, "soon", float("nan"), float("inf")):
        with pytest.raises(ValueError, match="hold_seconds"):
            kv_offload.OffloadSettings.from_extra_config({"hold_seconds": bad})
    # The LMCache 0.3 backend is gone: a config naming it says where LMCache 0.5 lives.
    for old in ({"store_backend": "lmcache"}, {"lmcache_config": {}}):
        with pytest.raises(ValueError, match="LMCacheMPConnector"):
            kv_offload.OffloadSettings.from_extra_config(old)


def test_stats_payload_aggregates_and_exports():
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    Stats = offload_metrics.ContinuumOffloadStats
    a = Stats()
    a.inc("stored_blocks", 3)
    a.observe("load_seconds", 0.002)
    a.set_gauge("store_used_bytes", 100)
    b = Stats()
    b.inc("stored_blocks", 2)
    b.observe("load_seconds", 0.004)
    b.set_gauge("store_used_bytes", 300)
    b.set_gauge("store_capacity_bytes", 1000)
    merged = Stats(data=a.to_dict()).aggregate(b)
    assert merged.counter("stored_blocks") == 5
    assert merged.samples("load_seconds") == [0.002, 0.004]
    reduced = merged.reduce()
    assert reduced["stored_blocks"] == 5 and reduced["store_used_pct"] == 30.0
    assert a.counter("stored_blocks") == 3  # the input payload is not mutated
    # IPC-safe: only str keys, numbers and lists
    import msgspec

    assert msgspec.msgpack.decode(msgspec.msgpack.encode(merged.to_dict())) == merged.to_dict()

    registry = CollectorRegistry()

    def bind(cls):
        return lambda *args, **kw: cls(*args, registry=registry, **kw)

    prom = kv_offload.ContinuumOffloadConnector.build_prom_metrics(
        _FakeConfig(),
        {Gauge: bind(Gauge), Counter: bind(Counter), Histogram: bind(Histogram)},
        ["engine"],
        {0: ["0"]},
    )
    prom.observe(merged.to_dict(), 0)
    value = registry.get_sample_value
    assert value("vllm_continuum:kv_offload_stored_blocks_total", {"engine": "0"}) == 5
    assert value("vllm_continuum:kv_offload_store_used_bytes", {"engine": "0"}) == 300
    assert value("vllm_continuum:kv_offload_load_seconds_count", {"engine": "0"}) == 2


class _FakeConfig:
    kv_transfer_config = None


# --- victim mode: the GPU prefix cache's evictions ---------------------------
def _cached_pool(num_blocks: int, names: list[str]):
    """A real vLLM ``BlockPool`` whose blocks 1..len(names) hold the cached
    prefix ``names`` (then freed: eviction candidates, head first)."""
    from types import SimpleNamespace

    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(num_gpu_blocks=num_blocks, enable_caching=True, hash_block_size=16)
    blocks = pool.get_new_blocks(len(names))
    request = SimpleNamespace(request_id="r", block_hashes=[n.encode().ljust(8, b"-") for n in names])
    pool.cache_full_blocks(request, blocks, 0, len(names), 16, 0)
    pool.free_blocks(blocks)
    return pool, blocks


def test_the_eviction_tap_sees_what_an_allocation_evicts_before_its_hash_goes():
    from vllm_continuum_plugin.connectors.eviction_tap import EvictionTap

    pool, cached = _cached_pool(8, ["a", "b", "c"])
    seen: list[tuple[int, bytes]] = []
    tap = EvictionTap(pool, lambda block: seen.append((block.block_id, bytes(block.block_hash))))
    with pytest.raises(RuntimeError, match="already has an eviction tap"):
        EvictionTap(pool, seen.append)
    got = pool.get_new_blocks(5)  # four never-used blocks first, then cached "a"
    assert [b for b, _ in seen] == [cached[0].block_id]
    assert seen[0][1].startswith(b"a-------") and got[-1].block_hash is None
    # An eviction outside an allocation (a failed load's blocks: invalid
    # content) is not offered for storing.
    pool.evict_blocks({cached[1].block_id})
    assert len(seen) == 1 and tap.reported == 1
    tap.remove()
    tap.remove()  # idempotent
    pool.free_blocks(got)
    pool.get_new_blocks(pool.get_num_free_blocks())  # evicts "c": nobody listens now
    assert len(seen) == 1


def test_victim_mode_stores_what_the_gpu_evicts_but_not_an_ended_jobs_blocks():
    """``store_mode: victim``: each cached block the GPU pool evicts is queued
    as a pre-store (copied before the step's forward writes the block); one
    the store already has is not copied again; the blocks of a job that
    ended are skipped; eager planning and finish-time stores stay off."""
    from types import SimpleNamespace

    pool, cached = _cached_pool(8, ["a", "b", "c"])
    spec = kv_offload.SideSpec(kv_offload.OffloadSettings(store_mode="victim"), 16, 100)
    ended = SimpleNamespace(request_id="ended")
    side = kv_offload._SchedulerSide(spec, None, None, lambda: _Manager({"ended": [cached[2]]}))
    side.bind_block_pool(pool)
    side.index.put(b"b-------", None, nbytes=1)  # already stored
    cached[2].ref_cnt = 1
    side.demote_request(ended)  # "c"'s job ended
    cached[2].ref_cnt = 0
    pool.get_new_blocks(7)  # every block: evicts a, b, c
    meta = side.build_connector_meta(SimpleNamespace(num_scheduled_tokens={}))
    assert meta.pre_stores == [(b"a-------", cached[0].block_id)]
    assert b"a-------" in side.index and b"c-------" not in side.index
    assert side.stats.counter("victim_blocks") == 1 and side.stats.counter("skipped_dead_blocks") == 1
    assert not side.dead_blocks  # the skipped entry went with its block
    assert side.request_finished(SimpleNamespace(request_id="r"), [1]) is False
    side.eviction_tap.remove()


def test_victim_mode_holds_a_handed_over_block_when_the_gpu_evicts_it():
    """A pin released while the GPU still has its blocks: victim mode copies
    nothing then (the GPU has them), remembers the job's hold, and applies
    it when the tap stores the block. The job's next turn ends the hold
    before any copy: then the block is stored, if ever, as plain LRU."""
    from types import SimpleNamespace

    pool, cached = _cached_pool(8, ["a", "b"])
    spec = kv_offload.SideSpec(kv_offload.OffloadSettings(store_mode="victim"), 16, 100)
    side = kv_offload._SchedulerSide(spec, None, None, lambda: None)
    side.bind_block_pool(pool)
    assert side.save_blocks(cached[:1], hold_job="job-a") == 0  # nothing copied yet
    assert side.save_blocks(cached[1:], hold_job="job-b") == 0
    assert not side.pending_pre_stores and len(side.deferred_holds) == 2
    side.end_hold("job-b", demote=False)  # job-b's next turn came first
    assert list(side.deferred_holds) == [b"a-------"]
    pool.get_new_blocks(7)
    side.build_connector_meta(SimpleNamespace(num_scheduled_tokens={}))
    assert side.index.is_held(b"a-------") and not side.index.is_held(b"b-------")
    assert not side.deferred_holds
    side.eviction_tap.remove()


def test_a_victim_tier_prices_the_whole_context_as_a_reload_up_to_its_size():
    """Victim mode copies what the GPU evicts, so a context just computed
    rebuilds by a reload even though the store does not hold it yet (the
    TTL rule must not price it as a prefill); never more than the store
    can hold. Other modes count only what the store holds."""
    from types import SimpleNamespace

    pool, _ = _cached_pool(8, ["a"])
    request = SimpleNamespace(block_hashes=[f"k{i}".encode().ljust(8, b"-") for i in range(10)])
    victim = kv_offload._SchedulerSide(
        kv_offload.SideSpec(kv_offload.OffloadSettings(store_mode="victim"), 16, 6), None, None, lambda: None)
    victim.bind_block_pool(pool)
    assert victim.stored_prefix_tokens(request) == 6 * 16  # a 6-block store
    assert victim.stored_prefix_tokens(request, start_tokens=8 * 16) == 2 * 16
    explicit = kv_offload._SchedulerSide(
        kv_offload.SideSpec(kv_offload.OffloadSettings(store_mode="explicit"), 16, 6), None, None, lambda: None)
    explicit.index.put(request.block_hashes[0], None, nbytes=1)
    assert explicit.stored_prefix_tokens(request) == 16
    victim.eviction_tap.remove()


def test_victim_mode_loads_a_block_evicted_in_the_same_step_and_refreshes_a_stored_one():
    """A turn that waits for room while the step's allocations evict its own
    context: the block evicted in this step is still matched (its pre-store
    is copied out before the step's loads), not recomputed with everything
    behind it. A block the store already had becomes the store's most
    recently used when the GPU evicts it again, so the store's LRU does not
    drop a context's head before its newer tail (a hole: a load matches a
    prefix only)."""
    from types import SimpleNamespace

    pool, cached = _cached_pool(8, ["a", "b", "c"])
    spec = kv_offload.SideSpec(kv_offload.OffloadSettings(store_mode="victim"), 16, 100)
    side = kv_offload._SchedulerSide(spec, None, None, lambda: None)
    side.bind_block_pool(pool)
    old = b"old-----"
    side.index.put(b"b-------", None, nbytes=1)  # stored earlier (a reloaded context)
    side.index.put(old, None, nbytes=1)  # stored after it
    assert side.index.keys_lru()[:2] == [b"b-------", old]
    got = pool.get_new_blocks(6)  # four never-used blocks, then evicts "a" and "b"
    assert side.index.keys_lru()[:2] == [old, b"b-------"]  # "b" refreshed, not copied again
    assert b"a-------" not in side.index  # queued: copied out by this step's metadata
    request = SimpleNamespace(request_id="next-turn", num_tokens=4 * 16 + 1,
                              block_hashes=[b"a-------", b"b-------", b"c-------", b"d-------"])
    # "c" is still on the GPU (not stored), so the match stops there.
    assert side.get_num_new_matched_tokens(request, 0) == 2 * 16
    # Loaded into the very blocks the step just evicted: the worker copies
    # the pre-stores out before it copies the loads in.
    dest = got[-2:]
    side.update_state_after_alloc(request, SimpleNamespace(get_block_ids=lambda: [[b.block_id for b in dest]]), 32)
    meta = side.build_connector_meta(SimpleNamespace(num_scheduled_tokens={}))
    assert meta.pre_stores == [(b"a-------", cached[0].block_id)]
    assert [(job.keys, job.block_ids) for job in meta.loads] == [
        ([b"a-------", b"b-------"], [b.block_id for b in dest])]
    assert b"a-------" in side.index and not side.pending_pre_stores
    assert side.index.pinned_bytes == 0  # nothing stays pinned past the step's planning
    # A later step no longer counts it as queued: only the store answers.
    side.index.discard(b"a-------")
    assert side.get_num_new_matched_tokens(request, 0) == 0
    pool.free_blocks(got)
    side.eviction_tap.remove()
