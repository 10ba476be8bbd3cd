"""The Grafana dashboard (dashboards/vllm-continuum.json) against real metrics.

Every query is parsed as PromQL; every metric it selects must exist on a
real ``/metrics`` scrape of ``vllm serve`` running the plugin (ContextServe,
which adds its decision metrics to Continuum's, plus the plugin's CPU offload
connector), and every label it matches on or groups by must be a label those
samples carry (``instance`` and ``job`` are added by Prometheus at scrape
time). A renamed metric or label therefore fails here instead of leaving an
empty panel in an operator's Grafana.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections import defaultdict
from typing import Any

import openai
import promql_parser
import pytest
import requests
from harness import DEFAULT_MODEL, serve_args, wait_for
from prometheus_client.parser import text_string_to_metric_families

from vllm_continuum_plugin.benchmarks.server import VLLMServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "dashboards", "vllm-continuum.json")
SCRAPE_LABELS = {"instance", "job"}  # attached by Prometheus, not by the server
# Grafana's template variables, replaced the way Grafana would before the
# query reaches Prometheus.
VARIABLES = {"$__rate_interval": "1m", "$instance": ".*", "$model_name": ".*"}


def _builder() -> Any:
    spec = importlib.util.spec_from_file_location("build_dashboard", os.path.join(ROOT, "scripts", "build_dashboard.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dashboard() -> dict[str, Any]:
    with open(DASHBOARD) as f:
        return json.load(f)


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["definition"]))
    return out


def _expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def _label_values(query: str) -> str:
    """``label_values(metric, label)`` (a Grafana variable) -> ``metric``."""
    inner = query[len("label_values("):-1]
    return inner.rsplit(",", 1)[0].strip()


class Uses:
    """What one query asks of the metrics: selected names with their label
    matchers, and labels it groups by (attributed to every name below the
    aggregation)."""

    def __init__(self, expr: str) -> None:
        self.selectors: list[tuple[str, list[tuple[str, str, str]]]] = []
        self.grouped: list[tuple[set[str], list[str]]] = []
        if expr.startswith("label_values("):
            expr = _label_values(expr)
        tree = promql_parser.parse(_expand(expr))
        promql_parser.walk(tree, self._visit)

    def _visit(self, node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = [(m.name, str(m.op), m.value) for m in node.matchers.matchers]
            self.selectors.append((node.name, matchers))
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            if node.modifier.type == promql_parser.AggModifierType.By:
                names: list[str] = []

                def collect(inner: Any) -> bool:
                    if isinstance(inner, promql_parser.VectorSelector):
                        names.append(inner.name)
                    return True

                promql_parser.walk(node.expr, collect)
                self.grouped.append((set(node.modifier.labels), names))
        return True


def test_the_committed_dashboard_is_what_the_builder_writes():
    with open(DASHBOARD) as f:
        assert f.read() == _builder().render(), "run: python scripts/build_dashboard.py"


def test_every_query_parses_and_the_layout_is_sound():
    dashboard = _dashboard()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"panel {panel['title']!r} overlaps another"
                cells.add((x, y))
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    for title, expr in _queries(dashboard):
        Uses(expr)  # raises on a PromQL syntax error
        if not title.startswith("variable"):
            # Every panel can be narrowed to the replicas chosen in $instance.
            assert '$instance' in expr, (title, expr)
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Per replica", "Pins (Continuum)", "ContextServe", "CPU offload", "TTL and tool time"} <= titles


class Scrape:
    """Metric families of a real ``/metrics`` text: sample names -> the set
    of label names and the values seen per label; and declared family names
    (a labelled family with no child yet has HELP/TYPE lines only)."""

    def __init__(self, text: str) -> None:
        self.labels: dict[str, set[str]] = defaultdict(set)
        self.values: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.declared: set[str] = set()
        for family in text_string_to_metric_families(text):
            suffixes = {"counter": ["_total", "_created"],
                        "histogram": ["_bucket", "_sum", "_count", "_created"]}.get(family.type, [""])
            self.declared.update(family.name + s for s in suffixes)
            for sample in family.samples:
                self.labels[sample.name].update(sample.labels)
                for k, v in sample.labels.items():
                    self.values[(sample.name, k)].add(v)

    def has(self, name: str) -> bool:
        return name in self.labels or name in self.declared


LONG_TTL_S = 600


@pytest.fixture(scope="module")
def scrape(tmp_path_factory):
    """A real server's ``/metrics`` after ContextServe decided and pinned,
    a job ended, an untagged turn ran and the offload connector stored."""
    if not os.path.isdir(DEFAULT_MODEL):
        pytest.fail(f"embedded model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    rules = tmp_path_factory.mktemp("rules") / "rules.json"
    rules.write_text(json.dumps({"version": 1, "rules": [{"match": "ls", "class": "fast", "ttl_s": LONG_TTL_S}]}))
    connector = {"kv_connector": "ContinuumOffloadConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"cpu_bytes": 200_000_000}}
    args = [*serve_args("context_serve", 96, 400_000_000, 2048, {"rules_path": str(rules), "max_ttl_s": LONG_TTL_S},
                        prompt_details=False),
            "--kv-transfer-config", json.dumps(connector)]
    with VLLMServer(DEFAULT_MODEL, args, served_name="smollm2") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "system", "content": "You are a software agent. Answer with one ```bash block."},
                    {"role": "user", "content": "What files are there? " * 30}]
        for i, (command, last) in enumerate([("ls -la", False), ("cat main\\.py", True)]):
            r = client.chat.completions.create(
                model="smollm2", messages=messages, max_tokens=24, temperature=0.0,
                extra_body={"job_id": "dash", "is_last_step": last,
                            "structured_outputs": {"regex": f"```bash\\n{command}\\n```"}})
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": f"output {i}\n" * 5}]
        # An untagged turn that calls a tool starts an implicit job.
        client.chat.completions.create(
            model="smollm2", messages=messages[:2] + [{"role": "user", "content": "Untagged."}],
            max_tokens=24, temperature=0.0, extra_body={"structured_outputs": {"regex": "```bash\\nls\\n```"}})
        assert wait_for(lambda: srv.metric("vllm_continuum:jobs_ended_total", reason="last_step") >= 1)
        assert wait_for(lambda: srv.metric("vllm_continuum:implicit_turns_total", event="started") >= 1)
        assert wait_for(lambda: srv.metric("vllm_continuum:kv_offload_stored_blocks_total") > 0)
        yield Scrape(requests.get(srv.url + "/metrics", timeout=10).text)


def problems(queries: list[tuple[str, str]], scrape: Scrape) -> list[tuple[Any, ...]]:
    """What in ``queries`` a server with these metrics cannot answer: a
    metric it does not export, a label its samples do not carry, a label
    value it never exports, a ``by (...)`` label missing below it."""
    found: list[tuple[Any, ...]] = []
    for title, expr in queries:
        uses = Uses(expr)
        for name, matchers in uses.selectors:
            if not scrape.has(name):
                found.append(("no such metric", title, name))
                continue
            present = scrape.labels.get(name)
            if present is None:
                continue  # declared, no child yet: the name is all there is to check
            for label, op, value in matchers:
                if label in SCRAPE_LABELS or label == "__name__":
                    continue
                if label not in present:
                    found.append(("no such label", title, name, label))
                elif op in ("MatchOp.Equal", "MatchOp.NotEqual") and value not in scrape.values[(name, label)]:
                    found.append(("no such label value", title, name, label, value))
        for labels, names in uses.grouped:
            for name in names:
                present = scrape.labels.get(name)
                if present is not None and labels - present - SCRAPE_LABELS:
                    found.append(("grouped by a missing label", title, name, sorted(labels - present)))
    return found


@pytest.mark.e2e
def test_every_dashboard_query_selects_metrics_and_labels_a_real_server_exports(scrape):
    assert problems(_queries(_dashboard()), scrape) == []


@pytest.mark.e2e
def test_the_check_catches_a_renamed_metric_label_or_value(scrape):
    """The check above can fail: typical drift, one mistake per query."""
    broken = [
        ("renamed metric", 'sum by (instance) (vllm_continuum:pinned_block{instance=~"$instance"})'),
        ("renamed label", 'sum by (instance) (rate(vllm_continuum:pins_released_total{why="ttl"}[$__rate_interval]))'),
        ("unknown value", 'sum by (instance) (rate(vllm_continuum:pins_released_total{reason="expired"}[$__rate_interval]))'),
        ("wrong grouping", 'sum by (phase) (rate(vllm_continuum:decisions_total{instance=~"$instance"}[$__rate_interval]))'),
    ]
    kinds = [p[0] for p in problems(broken, scrape)]
    assert kinds == ["no such metric", "no such label", "no such label value", "grouped by a missing label"]


@pytest.mark.e2e
def test_the_plugin_panels_are_backed_by_samples_not_just_names(scrape):
    """After the scripted traffic, the plugin's own series have samples with
    their labels (so the label checks above ran on them, not only names)."""
    for name in ["vllm_continuum:pinned_blocks", "vllm_continuum:pins_released_total",
                 "vllm_continuum:decisions_total", "vllm_continuum:ttl_seconds_bucket",
                 "vllm_continuum:jobs_ended_total", "vllm_continuum:implicit_turns_total",
                 "vllm_continuum:fast_pins_total", "vllm_continuum:kv_offload_stored_bytes_total"]:
        assert name in scrape.labels, name
    assert {"speed", "layer"} <= scrape.labels["vllm_continuum:decisions_total"]
    assert "handoff" in scrape.values[("vllm_continuum:pins_released_total", "reason")]
