"""Issue 37 part 6: the Grafana dashboard (deploy/grafana/pitstop.json) asks only for metrics that
``/metrics`` serves — every PromQL expression's metric names, against a real scrape of the admin
listener — and shows jobs' state, goodput, incidents by kind, restarts and Slack delivery."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bot.runtime.serve import FRESH
from tests.test_slack_http import MakeStack, make_stack  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "pitstop.json"
#: PromQL words that are no metric: keywords, aggregation modifiers, set operators
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}
KEYWORDS |= {"inf", "nan"}


def _exprs(node: Any) -> Iterator[str]:
    """Every PromQL expression in the dashboard: panel targets' ``expr``, template variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, str) and "(" in value:
                yield value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers less function calls, keywords,
    label matchers (``{…}``), grouping labels (``by (…)``), ranges (``[5m]``), strings and numbers."""
    expr = re.sub(r"label_values\(([^,()]+),\s*\w+\)", r"\1", expr)  # Grafana's: its 2nd argument is a label
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(\s*\()?", expr):
        if m.group(2) is None and m.group(1) not in KEYWORDS:
            names.add(m.group(1))
    return names


def test_metric_names_reads_promql() -> None:
    """Functions, matchers, grouping labels, ranges, numbers and label_values' label are not metric names."""
    expr = (
        'sum by (job) (rate(a_total{job=~"x|y", b="c"}[5m])) / clamp_min(b_seconds, 1e-9) > bool 0 or c_ratio'
    )
    assert metric_names(expr) == {"a_total", "b_seconds", "c_ratio"}
    assert metric_names("label_values(pitstop_job_state, job)") == {"pitstop_job_state"}


async def test_the_dashboard_reads_only_served_metrics(make_stack: MakeStack) -> None:  # noqa: F811
    """Every metric the dashboard's expressions name is served by /metrics (a real scrape), and it has
    a panel for jobs' state, goodput, GPU-hours lost, incidents, restarts and Slack delivery."""
    stack = await make_stack(gpus={"target": [0], "drafter": [1]})
    stack.clock.now += FRESH
    async with stack.http.get(f"{stack.admin.url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    served = {
        f.name + "_total" if f.type == "counter" else f.name for f in text_string_to_metric_families(text)
    }
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = list(_exprs(dashboard))
    assert len(exprs) >= 10
    named = set().union(*(metric_names(e) for e in exprs))
    assert named <= served, f"the dashboard names metrics /metrics does not serve: {sorted(named - served)}"
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted, metric in (
        ("Job state", "pitstop_job_state"),
        ("Goodput (24 h)", "pitstop_goodput_ratio"),
        ("GPU-hours lost (24 h) by cause", "pitstop_gpu_hours_lost_total"),
        ("Open incidents by kind", "pitstop_incidents_open"),
        ("Restarts by verdict (newest 500 runs)", "pitstop_runs_recent"),
        ("Slack delivery: outbox queue", "pitstop_outbox_queue_depth"),
    ):
        assert wanted in titles and metric in named
    assert "deploy/grafana/pitstop.json" in (ROOT / "README.md").read_text()
