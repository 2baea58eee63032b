"""`task.log` (also `task.get_logger()`): what a run reports, with ClearML's method names.

    log = task.get_logger()
    log.report_scalar("loss", "train", 0.3, iteration=10)  # a chart per title, a line per series
    log.report_single_value("accuracy", 0.93)
    log.report_table("confusion", "val", iteration=3, table_plot=data_frame)
    log.report_image("samples", "val", iteration=3, local_path="sample.png")
    log.report_text("**done**", markdown=True)

Each report is one line in the job folder's reports.jsonl (scalars: scalars.jsonl); the
runner's reporter sends them to the task with the task's own token, where the task's bounds
keep them (the estate's limits.max_reports and max_report_bytes). Outside any Klique job or
local run, nothing is kept. Standard library only: pandas, numpy, Pillow, plotly and
matplotlib are used when the objects given are theirs."""

from __future__ import annotations

import base64
import io
import json
import math
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# The most one report of each kind may carry (its JSON and its file together): the server's
# own table (broker/bounds.py ITEM_BYTES), checked here so that the error comes at once.
_MIB = 1024 * 1024
ITEM_BYTES = {
    "single": 4 * 1024,
    "text": 1 * _MIB,
    "table": 4 * _MIB,
    "histogram": 4 * _MIB,
    "plot": 8 * _MIB,
    "image": 8 * _MIB,
    "media": 16 * _MIB,
}
# PNG (RFC 2083 section 3.1) and JPEG (ITU T.81 annex B): the images a page shows.
IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"))


class Logger:
    """Reports of one task, written to its folder (None: this run keeps none)."""

    def __init__(self, folder: Optional[str]) -> None:
        self._folder = folder
        self._flushers: List[Callable[[], None]] = []  # what flush() reads first (TensorBoard)

    @property
    def folder(self) -> Optional[str]:
        """Where this run's reports are written (None: it keeps none)."""
        return self._folder

    # Scalars

    def scalar(self, name: str, value: float, step: Optional[int] = None) -> None:
        """task.log.scalar("loss", 0.3, step=10): a point of chart `name`."""
        self.report_scalar(name, "", value, step)

    def report_scalar(
        self, title: str, series: str, value: float, iteration: Optional[int] = None
    ) -> None:
        """A point of chart `title`, on its line `series`, at `iteration`."""
        from inside_job import report  # on its path only: every task imports klique

        _check_name("title", title)
        if self._folder is not None:
            report.append(self._folder, title, value, iteration, series=str(series or ""))

    def report_single_value(self, name: str, value: float) -> None:
        """One number that sums the run up (an accuracy, a score): the newest one shows."""
        self._report("single", name, "", None, {"value": _number(value)})

    # Tables, plots, histograms, text

    def report_table(
        self,
        title: str,
        series: str,
        iteration: Optional[int] = None,
        table_plot: Any = None,
        csv: Optional[str] = None,
        url: Optional[str] = None,
        extra_layout: Any = None,
    ) -> None:
        """A table: a pandas DataFrame, a list of dicts, or a list of lists (the first one the
        header) as `table_plot`; or a CSV file (`csv`, its first row the header); or a link to
        one (`url`)."""
        if url is not None:
            data: Dict[str, Any] = {"url": _web_url(url)}
        elif csv is not None:
            import csv as csv_module  # on its path only: every task imports klique

            with open(csv, newline="", encoding="utf-8") as f:
                data = table_of(list(csv_module.reader(f)))
        elif table_plot is not None:
            data = table_of(table_plot)
        else:
            raise ValueError("report_table() needs table_plot=, csv= or url=")
        self._report("table", title, series, iteration, data)

    def report_plotly(
        self, title: str, series: str, figure: Any, iteration: Optional[int] = None
    ) -> None:
        """A Plotly figure (a plotly Figure, or its dict: {"data": [...], "layout": {...}})."""
        self._report("plot", title, series, iteration, plotly_of(figure))

    def report_matplotlib_figure(
        self,
        title: str,
        series: str,
        figure: Any,
        iteration: Optional[int] = None,
        report_image: bool = False,
    ) -> str:
        """A matplotlib figure: as a Plotly figure where plotly's converter is installed and
        succeeds (and report_image is False), else as a PNG image. Returns which: "plot" or
        "image"."""
        if not report_image:
            converted = _mpl_to_plotly(figure)
            if converted is not None:
                self._report("plot", title, series, iteration, converted)
                return "plot"
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        self._report_file("image", title, series, iteration, buffer.getvalue(), "image/png", {})
        return "image"

    def report_histogram(
        self,
        title: str,
        series: str,
        values: Any,
        iteration: Optional[int] = None,
        labels: Optional[Sequence[str]] = None,
        xlabels: Optional[Sequence[Any]] = None,
        xaxis: Optional[str] = None,
        yaxis: Optional[str] = None,
    ) -> None:
        """A bar per value (the bar's height), labelled by `xlabels` (else 0, 1, ...)."""
        data = histogram_of(values, xlabels)
        data.update(xaxis=xaxis, yaxis=yaxis, labels=list(labels) if labels else None)
        self._report("histogram", title, series, iteration, data)

    def report_text(
        self,
        msg: str,
        level: Any = None,
        print_console: bool = False,
        markdown: bool = False,
        title: str = "text",
        iteration: Optional[int] = None,
    ) -> None:
        """A text on the task's page (markdown=True: rendered as markdown, its HTML shown as
        text); print_console=True prints it too."""
        if print_console:
            print(msg, flush=True)
        self._report("text", title, "", iteration, {"text": str(msg), "markdown": bool(markdown)})

    def report_markdown(
        self, msg: str, title: str = "text", iteration: Optional[int] = None
    ) -> None:
        """A markdown text (report_text(msg, markdown=True))."""
        self.report_text(msg, markdown=True, title=title, iteration=iteration)

    # Files: images and media

    def report_image(
        self,
        title: str,
        series: str,
        iteration: Optional[int] = None,
        local_path: Optional[str] = None,
        image: Any = None,
        matrix: Any = None,
        url: Optional[str] = None,
        max_image_history: Optional[int] = None,
        delete_after_upload: bool = False,
    ) -> None:
        """An image at `iteration` (the page has a slider over them): a PNG or JPEG file
        (`local_path`), a numpy array or a PIL image (`image`, `matrix`; Pillow encodes it as
        PNG), or a link (`url`)."""
        if url is not None:
            self._report("image", title, series, iteration, {"url": _web_url(url)})
            return
        if local_path is not None:
            content, name = _read_local(local_path, delete_after_upload)
        elif image is not None or matrix is not None:
            content, name = png_of(image if image is not None else matrix), f"{title}.png"
        else:
            raise ValueError("report_image() needs local_path=, image= or url=")
        kind = image_type(content)
        if kind is None:
            raise ValueError(
                f"report_image({title!r}): {name} is neither PNG nor JPEG; fix: save it as "
                "PNG, or pass the array as image= (Pillow encodes it)"
            )
        self._report_file("image", title, series, iteration, content, kind, {"name": name})

    def report_media(
        self,
        title: str,
        series: str,
        iteration: Optional[int] = None,
        local_path: Optional[str] = None,
        stream: Any = None,
        file_extension: Optional[str] = None,
        url: Optional[str] = None,
        delete_after_upload: bool = False,
    ) -> None:
        """A file (audio, video, anything) to download from the task's page: `local_path`, or
        the bytes of `stream` (name it with `file_extension`), or a link (`url`)."""
        if url is not None:
            self._report("media", title, series, iteration, {"url": _web_url(url)})
            return
        if local_path is not None:
            content, name = _read_local(local_path, delete_after_upload)
        elif stream is not None:
            content = stream.read()
            name = f"{title}{file_extension or ''}"
        else:
            raise ValueError("report_media() needs local_path=, stream= or url=")
        import mimetypes  # on its path only: every task imports klique

        media_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        self._report_file("media", title, series, iteration, content, media_type, {"name": name})

    def flush(self) -> None:
        """Read the TensorBoard event files now (when captured); nothing else waits here:
        each report is in the job folder once its call returns, and the runner sends what is
        new every half second, and the rest at the end."""
        for flusher in self._flushers:
            flusher()

    # The line each report is

    def _report_file(
        self,
        kind: str,
        title: str,
        series: str,
        iteration: Optional[int],
        content: bytes,
        media_type: str,
        data: Dict[str, Any],
    ) -> None:
        extra = {"content": base64.b64encode(content).decode("ascii"), "content_type": media_type}
        self._report(kind, title, series, iteration, data, extra, len(content))

    def _report(
        self,
        kind: str,
        title: str,
        series: str,
        iteration: Optional[int],
        data: Any,
        extra: Optional[Dict[str, Any]] = None,
        file_bytes: int = 0,
    ) -> None:
        from inside_job import report  # on its path only: every task imports klique

        _check_name("title", title)
        item = report_line(kind, title, series, iteration, data)
        size = len(json.dumps(data).encode("utf-8")) + file_bytes
        if size > ITEM_BYTES[kind]:
            raise ValueError(
                f"the {kind} report {title!r} takes {size / _MIB:.1f} MiB, over "
                f"{ITEM_BYTES[kind] / _MIB:g} MiB, the most one {kind} report may take; fix: "
                "report less (a sample, a smaller image), or keep it with task.upload_artifact"
            )
        if self._folder is not None:
            report.append_report(self._folder, {**item, **(extra or {})})


def report_line(
    kind: str, title: str, series: str, iteration: Optional[int], data: Any
) -> Dict[str, Any]:
    """One report as the runner sends it (broker/tasks/report_schemas.py ReportIn)."""
    import time  # on its path only: most tasks report nothing

    return {
        "kind": kind,
        "title": title,
        "series": str(series or ""),
        "iteration": None if iteration is None else int(iteration),
        "time": time.time(),
        "data": data,
    }


# Shaping: what each kind's data is (pure; tests/unit/test_logger.py)


def table_of(table: Any) -> Dict[str, Any]:
    """{"columns": [...], "rows": [[...], ...]} of a pandas DataFrame (its index a first
    column, when named or not the default), a list of dicts (their keys, in first-seen order),
    or a list of lists (the first one the header)."""
    if hasattr(table, "columns") and hasattr(table, "itertuples"):  # a pandas DataFrame
        return _frame_table(table)
    rows = list(table)
    if not rows:
        return {"columns": [], "rows": []}
    if all(isinstance(row, dict) for row in rows):
        columns: List[str] = []
        for row in rows:
            columns += [str(k) for k in row if str(k) not in columns]
        body = [[jsonable(_get(row, c)) for c in columns] for row in rows]
        return {"columns": columns, "rows": body}
    if all(isinstance(row, (list, tuple)) for row in rows):
        header, body_rows = rows[0], rows[1:]
        return {
            "columns": [str(c) for c in header],
            "rows": [[jsonable(v) for v in row] for row in body_rows],
        }
    raise TypeError(
        "report_table() takes a pandas DataFrame, a list of dicts, or a list of lists (the "
        f"first one the header); not a list of {type(rows[0]).__name__}"
    )


def _frame_table(frame: Any) -> Dict[str, Any]:
    index = frame.index
    default_index = index.name is None and list(index) == list(range(len(index)))
    columns = [str(c) for c in frame.columns]
    rows = [[jsonable(v) for v in row] for row in frame.itertuples(index=not default_index)]
    if not default_index:
        columns = [str(index.name or "")] + columns
    return {"columns": columns, "rows": rows}


def _get(row: Dict[Any, Any], column: str) -> Any:
    for key, value in row.items():
        if str(key) == column:
            return value
    return None


def histogram_of(values: Any, xlabels: Optional[Sequence[Any]] = None) -> Dict[str, Any]:
    """{"values": [heights], "xlabels": [labels]} of a sequence of numbers (a numpy array or
    a list); labels default to 0, 1, ..."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    heights = [_number(v) for v in values]
    labels = [jsonable(x) for x in xlabels] if xlabels is not None else list(range(len(heights)))
    if len(labels) != len(heights):
        raise ValueError(
            f"report_histogram(): {len(heights)} values but {len(labels)} xlabels; give one "
            "label per value"
        )
    return {"values": heights, "xlabels": labels}


def plotly_of(figure: Any) -> Dict[str, Any]:
    """A Plotly figure's JSON: a plotly Figure (to_plotly_json) or a dict with data/layout."""
    if hasattr(figure, "to_json"):
        figure = json.loads(figure.to_json())
    if not isinstance(figure, dict) or not isinstance(figure.get("data", []), list):
        raise TypeError(
            "report_plotly() takes a plotly Figure or a dict {'data': [...], 'layout': {...}}"
        )
    return json.loads(json.dumps(figure, default=jsonable))


def png_of(image: Any) -> bytes:
    """PNG bytes of a PIL image or a numpy array (Pillow encodes them)."""
    try:
        from PIL import Image  # only for arrays and PIL images: an optional package
    except ImportError:
        raise ValueError(
            "report_image(image=...) needs Pillow to encode the array as PNG; fix: pip "
            "install Pillow, or save it as a PNG file and pass local_path="
        ) from None
    if not hasattr(image, "save"):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_type(content: bytes) -> Optional[str]:
    """image/png or image/jpeg, by the file's first bytes; None for anything else."""
    for magic, media_type in IMAGE_MAGIC:
        if content.startswith(magic):
            return media_type
    return None


def jsonable(value: Any) -> Any:
    """A cell's value as JSON: numbers (NaN and infinities as null), strings, booleans, null;
    numpy's scalars as Python's; anything else as its text."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


def _mpl_to_plotly(figure: Any) -> Optional[Dict[str, Any]]:
    """Plotly's JSON of a matplotlib figure, or None where plotly's converter is missing or
    cannot convert it (the figure then goes as an image)."""
    try:
        from plotly.tools import mpl_to_plotly  # optional: only where plotly is installed
    except ImportError:
        return None
    try:
        return plotly_of(mpl_to_plotly(figure))
    except Exception:  # noqa: BLE001 (the converter fails on many figures; the PNG does not)
        return None


def _number(value: Any) -> Optional[float]:
    number = float(value.item() if hasattr(value, "item") else value)
    return number if math.isfinite(number) else None


def _read_local(local_path: str, delete: bool) -> Tuple[bytes, str]:
    """A reported file's bytes and name; the file removed after when `delete`."""
    with open(local_path, "rb") as f:
        content = f.read()
    if delete:
        os.remove(local_path)
    return content, os.path.basename(local_path)


def _web_url(url: str) -> str:
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise ValueError(f"a report's url must start with https:// or http://, not {url!r}")
    return url


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError(f"a report's {what} must be a string of 1 to 200 characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"a report's {what} must be one line without control characters")
