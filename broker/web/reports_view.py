"""The task page's reports beyond scalars, shaped for its template: single values, tables,
images (a slider over each series' iterations), plots, histograms, texts and media files.
Markdown is rendered with HTML off (a task's `<script>` is shown as text), links only to
http(s) pages; nothing a task reports becomes markup of its own."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from markdown_it import MarkdownIt
from markupsafe import Markup

from broker.tasks.report_schemas import ReportOut

TABLE_ROWS = 200  # rows of one table (or one plot's trace) shown on the page
SHOWN_PER_KIND = 50  # the newest reports of each kind the page shows
# CommonMark with raw HTML off: tags in a text are escaped; markdown-it's own link check
# refuses javascript:, vbscript: and file: links.
MARKDOWN = MarkdownIt("commonmark", {"html": False})


@dataclass
class ReportsView:
    """What the template shows, kind by kind (empty lists: nothing of that kind)."""

    singles: list[dict[str, Any]] = field(default_factory=list)
    tables: list[dict[str, Any]] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    plots: list[dict[str, Any]] = field(default_factory=list)
    histograms: list[dict[str, Any]] = field(default_factory=list)
    texts: list[dict[str, Any]] = field(default_factory=list)
    media: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        kinds = (self.singles, self.tables, self.images, self.plots, self.histograms)
        return not any(kinds) and not self.texts and not self.media


def reports_view(reports: Iterable[ReportOut]) -> ReportsView:
    """The page's view of a task's reports (in the order they came)."""
    by_kind: dict[str, list[ReportOut]] = {}
    for r in reports:
        by_kind.setdefault(r.kind, []).append(r)

    def newest(kind: str) -> list[ReportOut]:
        return by_kind.get(kind, [])[-SHOWN_PER_KIND:]

    singles = {r.title: r for r in by_kind.get("single", [])}  # the newest value of each
    return ReportsView(
        singles=[{"title": t, "value": _value(r.data)} for t, r in sorted(singles.items())],
        tables=[_table(r) for r in newest("table")],
        images=_image_series(by_kind.get("image", [])),
        plots=[_plot(r) for r in newest("plot")],
        histograms=[_histogram(r) for r in newest("histogram")],
        texts=[_text(r) for r in newest("text")],
        media=[_media(r) for r in newest("media")],
    )


def web_link(url: Any) -> str | None:
    """The URL if it is an http(s) one a page may link to; None for anything else."""
    if isinstance(url, str) and url.startswith(("https://", "http://")):
        return url
    return None


def _head(r: ReportOut) -> dict[str, Any]:
    return {"id": r.id, "title": r.title, "series": r.series, "iteration": r.iteration}


def _value(data: Any) -> Any:
    return data.get("value") if isinstance(data, dict) else None


def _table(r: ReportOut) -> dict[str, Any]:
    data = r.data if isinstance(r.data, dict) else {}
    rows, columns = _list(data.get("rows")), _list(data.get("columns"))
    shown = [row if isinstance(row, list) else [row] for row in rows[:TABLE_ROWS]]
    return {
        **_head(r),
        "columns": [str(c) for c in columns],
        "rows": shown,
        "total": len(rows),
        "url": web_link(data.get("url")),
    }


def _image_series(reports: list[ReportOut]) -> list[dict[str, Any]]:
    """One figure per (title, series): its iterations, each an image; the newest shown."""
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in reports:
        data = r.data if isinstance(r.data, dict) else {}
        src = r.file or web_link(data.get("url"))
        if src:
            step = {"iteration": r.iteration, "src": src, "name": str(data.get("name") or "")}
            series.setdefault((r.title, r.series), []).append(step)
    return [
        {"title": title, "series": name, "steps": steps[-SHOWN_PER_KIND:]}
        for (title, name), steps in series.items()
    ]


def _plot(r: ReportOut) -> dict[str, Any]:
    """A Plotly figure as tables: one per trace, of its x and y (no Plotly is bundled)."""
    data = r.data if isinstance(r.data, dict) else {}
    traces = []
    for i, trace in enumerate(data.get("data") or []):
        if not isinstance(trace, dict):
            continue
        xs, ys = _list(trace.get("x")), _list(trace.get("y"))
        n = max(len(xs), len(ys))
        points = [
            [xs[k] if k < len(xs) else "", ys[k] if k < len(ys) else ""]
            for k in range(min(n, TABLE_ROWS))
        ]
        name = str(trace.get("name") or f"trace {i + 1}")
        kind = str(trace.get("type") or "")
        traces.append({"name": name, "type": kind, "points": points, "total": n})
    return {**_head(r), "traces": traces}


def _histogram(r: ReportOut) -> dict[str, Any]:
    data = r.data if isinstance(r.data, dict) else {}
    values = _list(data.get("values"))
    labels = _list(data.get("xlabels")) or list(range(len(values)))
    chart = {"title": r.title, "series": r.series or r.title, "labels": labels, "values": values}
    return {**_head(r), "chart": chart, "xaxis": data.get("xaxis"), "yaxis": data.get("yaxis")}


def _text(r: ReportOut) -> dict[str, Any]:
    data = r.data if isinstance(r.data, dict) else {}
    text = str(data.get("text") or "")
    html = Markup(MARKDOWN.render(text)) if data.get("markdown") else None  # noqa: S704
    return {**_head(r), "text": text, "html": html}


def _media(r: ReportOut) -> dict[str, Any]:
    data = r.data if isinstance(r.data, dict) else {}
    name = str(data.get("name") or f"report-{r.id}")
    return {**_head(r), "name": name, "href": r.file or web_link(data.get("url")), "size": r.size}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
