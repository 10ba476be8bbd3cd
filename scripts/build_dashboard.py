#!/usr/bin/env python3
"""Write the Grafana dashboard for the plugin's metrics next to vLLM's.

    python scripts/build_dashboard.py            # writes dashboards/vllm-continuum.json
    python scripts/build_dashboard.py --check    # exit 1 if the file is stale

The JSON is generated so that every query is written once, in Python, where
``tests/test_dashboard.py`` can read it back; the test parses every query
(PromQL) and checks each metric name, label matcher and ``by (...)`` label
against a real ``/metrics`` scrape of a server running the plugin.

Template variables: ``datasource`` (a Prometheus data source), ``instance``
(the replicas: Prometheus's scrape label, so every panel can be narrowed to
one replica or compared across them) and ``model_name``. Rows: overview
(vLLM's own KV, queue and prefix-cache metrics), pins, TTL and tool time,
ContextServe, jobs, CPU offload, and a per-replica table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join(ROOT, "dashboards", "vllm-continuum.json")
UID = "vllm-continuum"

DS = {"type": "prometheus", "uid": "${datasource}"}
INST = 'instance=~"$instance"'  # every selector is narrowed to the chosen replicas
MODEL = 'model_name=~"$model_name"'  # vLLM's own metrics also carry model_name
RATE = "$__rate_interval"


def rate(metric: str, matchers: str = "", by: str = "instance") -> str:
    sel = f"{metric}{{{INST}{', ' + matchers if matchers else ''}}}"
    return f"sum by ({by}) (rate({sel}[{RATE}]))"


def quantile(q: float, metric: str, by: str = "") -> str:
    labels = "le" + (f", {by}" if by else "")
    return f"histogram_quantile({q}, sum by ({labels}) (rate({metric}_bucket{{{INST}}}[{RATE}])))"


def p50_p90(metric: str) -> list[tuple[str, str]]:
    return [(quantile(0.5, metric), "p50"), (quantile(0.9, metric), "p90")]


class Layout:
    """Places panels on Grafana's 24-column grid, row by row."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({
            "type": "row", "title": title, "id": self._id(), "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": [],
        })
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x, self.row_h = 0, 0

    def panel(
        self,
        title: str,
        targets: list[tuple[str, str]],
        *,
        unit: str = "short",
        description: str = "",
        kind: str = "timeseries",
        w: int = 8,
        h: int = 8,
        stack: bool = False,
        instant: bool = False,
    ) -> None:
        if self.x + w > 24:
            self._newline()
        panel: dict[str, Any] = {
            "type": kind,
            "title": title,
            "description": description,
            "id": self._id(),
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "targets": [
                {
                    "refId": chr(ord("A") + i),
                    "datasource": DS,
                    "expr": expr,
                    "legendFormat": legend,
                    **({"instant": True, "range": False, "format": "table"} if instant else {}),
                }
                for i, (expr, legend) in enumerate(targets)
            ],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        }
        if kind == "timeseries":
            panel["fieldConfig"]["defaults"]["custom"] = {
                "drawStyle": "line", "lineWidth": 1, "fillOpacity": 20 if stack else 0,
                "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            }
            panel["options"] = {
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        if kind == "table":
            # One row per replica: merge the instant queries on `instance`.
            panel["transformations"] = [
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": {"Time": True}}},
            ]
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def build() -> dict[str, Any]:
    g = Layout()
    handed = rate("vllm_continuum:pins_released_total", 'reason="handoff"')
    ended = rate("vllm_continuum:pins_released_total", 'reason!="shutdown"')
    hit_rate = (f"{rate('vllm:prefix_cache_hits_total', MODEL)} / "
                f"{rate('vllm:prefix_cache_queries_total', MODEL)}")

    g.row("Overview (vLLM)")
    g.panel("KV cache usage", [(f"vllm:kv_cache_usage_perc{{{INST}, {MODEL}}}", "{{instance}}")],
            unit="percentunit", description="vLLM's GPU KV pool in use, pinned blocks included.")
    g.panel("Requests running / waiting", [
        (f"sum by (instance) (vllm:num_requests_running{{{INST}, {MODEL}}})", "running {{instance}}"),
        (f"sum by (instance) (vllm:num_requests_waiting{{{INST}, {MODEL}}})", "waiting {{instance}}"),
    ])
    g.panel("Prefix-cache hit rate", [(hit_rate, "{{instance}}")], unit="percentunit",
            description="Share of prompt tokens found in the KV cache (pins make next turns hit).")
    g.panel("Preemptions", [(rate("vllm:num_preemptions_total", MODEL), "{{instance}}")], unit="ops")
    g.panel("Prompt tokens: computed vs cached", [
        (rate("vllm:prompt_tokens_total", MODEL), "prompt {{instance}}"),
        (rate("vllm:prompt_tokens_cached_total", MODEL), "cached {{instance}}"),
    ], unit="short")
    g.panel("Time to first token p90", [
        (quantile(0.9, "vllm:time_to_first_token_seconds", "instance"), "{{instance}}"),
    ], unit="s")

    g.row("Pins (Continuum)")
    g.panel("Pinned KV blocks", [
        (f"sum by (instance) (vllm_continuum:pinned_blocks{{{INST}}})", "{{instance}}"),
    ], description="Distinct blocks held by pins (a shared prefix counts once).")
    g.panel("Jobs holding a pin", [
        (f"sum by (instance) (vllm_continuum:pinned_jobs{{{INST}}})", "{{instance}}"),
    ])
    g.panel("Pins released, by reason", [
        (rate("vllm_continuum:pins_released_total", by="reason"), "{{reason}}"),
    ], unit="ops", stack=True,
        description="handoff: the next turn took the pin over; ttl: lapsed unused; pressure/cap: "
                    "released for room; last_step/finish_action: the job ended.")
    g.panel("Pins handed over (share of releases)", [(f"{handed} / {ended}", "{{instance}}")],
            unit="percentunit", description="Pins that paid off: taken over by the job's next turn.")
    g.panel("Prompt tokens served from pins", [
        (rate("vllm_continuum:pin_hit_tokens_total"), "{{instance}}"),
    ], unit="short")
    g.panel("Pins created / tail blocks trimmed", [
        (rate("vllm_continuum:pins_created_total"), "created {{instance}}"),
        (rate("vllm_continuum:pin_blocks_trimmed_total"), "trimmed blocks {{instance}}"),
    ], unit="ops")

    g.row("TTL and tool time")
    g.panel("TTL chosen (p50 / p90)", p50_p90("vllm_continuum:ttl_seconds"), unit="s")
    g.panel("Measured tool time (p50 / p90)", p50_p90("vllm_continuum:tool_seconds"), unit="s")
    g.panel("Mean TTL vs mean tool time", [
        (f"{rate('vllm_continuum:ttl_seconds_sum')} / {rate('vllm_continuum:ttl_seconds_count')}",
         "TTL {{instance}}"),
        (f"{rate('vllm_continuum:tool_seconds_sum')} / {rate('vllm_continuum:tool_seconds_count')}",
         "tool {{instance}}"),
    ], unit="s")

    g.row("ContextServe")
    g.panel("Decisions by class and layer", [
        (rate("vllm_continuum:decisions_total", by="speed, layer"), "{{speed}} by {{layer}}"),
    ], unit="ops", stack=True, w=12)
    g.panel("FAST pins by outcome", [
        (rate("vllm_continuum:fast_pins_total", by="outcome"), "{{outcome}}"),
    ], unit="ops", stack=True, w=6)
    g.panel("Prediction error (p50 / p90)", p50_p90("vllm_continuum:prediction_error_seconds"), unit="s", w=6)

    g.row("Jobs")
    g.panel("Jobs ended, by how the end was known", [
        (rate("vllm_continuum:jobs_ended_total", by="reason"), "{{reason}}"),
    ], unit="ops", stack=True, w=12)
    g.panel("Untagged agent turns (implicit jobs)", [
        (rate("vllm_continuum:implicit_turns_total", by="event"), "{{event}}"),
    ], unit="ops", w=12)

    g.row("CPU offload")
    g.panel("Offload traffic", [
        (rate("vllm_continuum:kv_offload_stored_bytes_total"), "stored {{instance}}"),
        (rate("vllm_continuum:kv_offload_loaded_bytes_total"), "loaded {{instance}}"),
    ], unit="Bps")
    g.panel("Prompt tokens reloaded instead of recomputed", [
        (rate("vllm_continuum:kv_offload_load_hit_tokens_total"), "{{instance}}"),
    ])
    g.panel("CPU store: used / held for jobs / capacity", [
        (f"sum by (instance) (vllm_continuum:kv_offload_store_used_bytes{{{INST}}})", "used {{instance}}"),
        (f"sum by (instance) (vllm_continuum:kv_offload_store_held_bytes{{{INST}}})", "held {{instance}}"),
        (f"sum by (instance) (vllm_continuum:kv_offload_store_capacity_bytes{{{INST}}})", "capacity {{instance}}"),
    ], unit="bytes")
    g.panel("Store evictions, dropped stores, failed loads", [
        (rate("vllm_continuum:kv_offload_evicted_blocks_total"), "evicted {{instance}}"),
        (rate("vllm_continuum:kv_offload_dropped_store_blocks_total"), "dropped {{instance}}"),
        (rate("vllm_continuum:kv_offload_load_failed_blocks_total"), "load failed {{instance}}"),
    ], unit="ops")
    g.panel("Copy time per step (p90)", [
        (quantile(0.9, "vllm_continuum:kv_offload_load_seconds", "instance"), "load {{instance}}"),
        (quantile(0.9, "vllm_continuum:kv_offload_store_seconds", "instance"), "store {{instance}}"),
    ], unit="s")
    g.panel("External prefix-cache hit rate (vLLM)", [
        (f"{rate('vllm:external_prefix_cache_hits_total', MODEL)} / "
         f"{rate('vllm:external_prefix_cache_queries_total', MODEL)}", "{{instance}}"),
    ], unit="percentunit", description="vLLM's own count of prompt tokens a KV connector served.")

    g.row("Per replica")
    g.panel("Replicas", [
        (f"sum by (instance) (vllm:kv_cache_usage_perc{{{INST}, {MODEL}}})", "KV usage"),
        (f"sum by (instance) (vllm_continuum:pinned_blocks{{{INST}}})", "pinned blocks"),
        (f"sum by (instance) (vllm_continuum:pinned_jobs{{{INST}}})", "pinned jobs"),
        (hit_rate, "prefix hit rate"),
        (f"{handed} / {ended}", "pins handed over"),
        (f"sum by (instance) (vllm:num_requests_running{{{INST}, {MODEL}}})", "running"),
    ], kind="table", w=24, instant=True,
        description="One row per replica behind the router: a job kept on its replica shows as a "
                    "high handed-over share there; a router that spreads turns shows pins lapsing.")

    def variable(name: str, query: str, label: str) -> dict[str, Any]:
        return {
            "name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
            "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        }

    return {
        "uid": UID,
        "title": "vLLM Continuum plugin",
        "description": "Pins, TTLs, ContextServe decisions and CPU offload of vllm-continuum-plugin, "
                       "next to vLLM's own metrics; one or many replicas.",
        "tags": ["vllm", "continuum", "kv-cache"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus"},
            variable("instance", "label_values(vllm:num_requests_running, instance)", "Replica"),
            variable("model_name", "label_values(vllm:num_requests_running, model_name)", "Model"),
        ]},
        "panels": g.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    parser.add_argument("--out", default=OUTPUT, help=f"output path (default {OUTPUT})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        try:
            with open(args.out) as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            print(f"{args.out} is stale: run python scripts/build_dashboard.py", file=sys.stderr)
        return 0 if same else 1
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
