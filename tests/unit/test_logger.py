"""The SDK's reports beyond scalars, shaped where the task runs (klique/logger.py), read by the
runner (inside_job/reporter.py), bounded and served by the server, shown by the task page."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest

from broker.bounds import ITEM_BYTES, reports_problem
from broker.domain import Limits
from broker.tasks.report_schemas import ReportOut
from broker.tasks.reports import served
from broker.web.reports_view import reports_view
from inside_job.reporter import read_reports
from klique import logger as sdk_logger
from klique.logger import Logger, histogram_of, table_of

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "reports.jsonl").read_text().splitlines()]


def test_a_table_is_columns_and_rows_from_dicts_lists_or_a_data_frame() -> None:
    dicts = [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "acc": float("nan")}]
    assert table_of(dicts) == {
        "columns": ["epoch", "loss", "acc"],
        "rows": [[1, 0.5, None], [2, None, None]],
    }
    assert table_of([["a", "b"], [1, "x"]]) == {"columns": ["a", "b"], "rows": [[1, "x"]]}
    with pytest.raises(TypeError, match="list of lists"):
        table_of([1, 2])
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"loss": [0.5, 0.25]}, index=pandas.Index(["a", "b"], name="run"))
    assert table_of(frame) == {"columns": ["run", "loss"], "rows": [["a", 0.5], ["b", 0.25]]}
    plain = pandas.DataFrame({"x": [1, 2]})
    assert table_of(plain) == {"columns": ["x"], "rows": [[1], [2]]}


def test_a_histogram_is_a_bar_per_value_with_a_label_each() -> None:
    assert histogram_of([3, 1]) == {"values": [3.0, 1.0], "xlabels": [0, 1]}
    assert histogram_of([3, 1], ["cat", "dog"])["xlabels"] == ["cat", "dog"]
    with pytest.raises(ValueError, match="2 values but 1 xlabels"):
        histogram_of([3, 1], ["cat"])


def test_each_kind_is_one_line_of_reports_jsonl_and_a_series_scalar_goes_with_the_scalars(
    tmp_path: Path,
) -> None:
    log = Logger(str(tmp_path))
    log.report_scalar("loss", "train", 0.5, iteration=3)
    log.scalar("lr", 0.1, step=3)
    log.report_single_value("accuracy", 0.9)
    log.report_text("**bold**", markdown=True)
    (tmp_path / "a.png").write_bytes(PNG)
    log.report_image("samples", "val", iteration=2, local_path=str(tmp_path / "a.png"))
    log.report_plotly("curve", "s", {"data": [{"x": [1], "y": [2]}], "layout": {}})
    scalars = [json.loads(s) for s in (tmp_path / "scalars.jsonl").read_text().splitlines()]
    assert [(s["name"], s.get("series"), s["step"]) for s in scalars] == [
        ("loss", "train", 3),
        ("lr", None, 3),
    ]
    kinds = [(r["kind"], r["title"]) for r in lines(tmp_path)]
    assert kinds == [("single", "accuracy"), ("text", "text"), ("image", "samples"),
                     ("plot", "curve")]  # fmt: skip
    image = lines(tmp_path)[2]
    assert base64.b64decode(image["content"]) == PNG and image["content_type"] == "image/png"
    assert image["iteration"] == 2 and image["data"] == {"name": "a.png"}


def test_what_is_not_png_or_jpeg_or_too_large_or_a_script_url_is_refused_in_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Logger(str(tmp_path))
    (tmp_path / "page.png").write_text("<html><script>alert(1)</script>")
    with pytest.raises(ValueError, match="neither PNG nor JPEG"):
        log.report_image("x", "y", local_path=str(tmp_path / "page.png"))
    with pytest.raises(ValueError, match="must start with https://"):
        log.report_media("x", "y", url="javascript:alert(1)")
    monkeypatch.setitem(sdk_logger.ITEM_BYTES, "text", 10)
    with pytest.raises(ValueError, match="the most one text report may take"):
        log.report_text("x" * 100)
    assert not (tmp_path / "reports.jsonl").exists()


def test_a_matplotlib_figure_goes_as_a_plot_or_a_png_and_says_which(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots()
    axes.plot([1, 2, 3], [3, 1, 2])
    kind = Logger(str(tmp_path)).report_matplotlib_figure("fig", "s", figure, iteration=1)
    item = lines(tmp_path)[0]
    assert kind == item["kind"] and kind in ("plot", "image")
    if kind == "image":
        assert base64.b64decode(item["content"]).startswith(b"\x89PNG")


def test_an_array_becomes_a_png(tmp_path: Path) -> None:
    numpy = pytest.importorskip("numpy")
    pytest.importorskip("PIL")
    Logger(str(tmp_path)).report_image("a", "b", image=numpy.zeros((4, 4, 3), dtype="uint8"))
    assert base64.b64decode(lines(tmp_path)[0]["content"]).startswith(b"\x89PNG")


def test_the_runner_reads_whole_lines_and_one_larger_than_its_chunk(tmp_path: Path) -> None:
    path = tmp_path / "reports.jsonl"
    big = {"kind": "text", "data": "x" * (5 * 1024 * 1024)}
    path.write_text(json.dumps({"kind": "single"}) + "\n" + json.dumps(big) + '\n{"half')
    first, end = read_reports(str(path), 0)
    assert [r["kind"] for r in first] == ["single"]
    second, end = read_reports(str(path), end)
    assert [r["kind"] for r in second] == ["text"]
    assert read_reports(str(path), end) == ([], end)  # the half line waits


def test_the_bounds_count_each_kind_and_the_bytes_of_all() -> None:
    limits = Limits(max_reports=2, max_report_bytes=100)
    assert reports_problem(limits, 7, {"text": 1}, 10, [("text", 10)]) is None
    problem = reports_problem(limits, 7, {"text": 2}, 10, [("text", 10)])
    assert problem and "3 text reports, over 2" in problem and "limits.max_reports" in problem
    assert reports_problem(limits, 7, {"text": 2}, 10, [("image", 10)]) is None
    problem = reports_problem(limits, 7, {}, 95, [("image", 10)])
    assert problem and "limits.max_report_bytes" in problem
    assert set(ITEM_BYTES) == set(sdk_logger.ITEM_BYTES) and ITEM_BYTES == sdk_logger.ITEM_BYTES


def test_only_png_and_jpeg_by_their_bytes_are_served_as_images() -> None:
    assert served(PNG) == served(PNG + b"more")
    assert (served(PNG).media_type, served(PNG).attachment) == ("image/png", False)
    assert served(b"\xff\xd8\xff\xe0").media_type == "image/jpeg"
    html = served(b"<html><script>alert(1)</script>")
    assert (html.media_type, html.attachment) == ("application/octet-stream", True)
    assert served(b"<svg onload=alert(1)>").attachment


def report(kind: str, data: object, **fields: object) -> ReportOut:
    base = {"id": 1, "kind": kind, "title": "t", "series": "", "iteration": None, "time": 0.0}
    return ReportOut(
        **{**base, "data": data, "content_type": "", "size": 1, "file": None, **fields}
    )


def test_the_page_renders_markdown_without_its_html_and_links_only_to_web_pages() -> None:
    evil = "<script>alert(1)</script> **bold** [x](javascript:alert(1)) [ok](https://example.org)"
    view = reports_view([report("text", {"text": evil, "markdown": True})])
    html = str(view.texts[0]["html"])
    assert "<script>" not in html and "&lt;script&gt;" in html and "<strong>bold</strong>" in html
    assert 'href="javascript' not in html
    assert 'href="https://example.org"' in html
    media = reports_view([report("media", {"url": "javascript:alert(1)"})]).media[0]
    assert media["href"] is None


def test_images_are_a_series_per_title_with_each_iteration() -> None:
    shown = reports_view(
        [report("image", {}, id=i, iteration=i, file=f"/f/{i}", series="val") for i in range(1, 4)]
    ).images
    assert [(s["title"], s["series"], [x["iteration"] for x in s["steps"]]) for s in shown] == [
        ("t", "val", [1, 2, 3])
    ]


def test_a_media_stream_is_named_and_typed_by_its_extension(tmp_path: Path) -> None:
    stream = io.BytesIO(b"RIFF")
    Logger(str(tmp_path)).report_media("clip", "s", stream=stream, file_extension=".wav")
    item = lines(tmp_path)[0]
    assert item["content_type"].startswith("audio/") and item["data"]["name"] == "clip.wav"
    assert base64.b64decode(item["content"]) == b"RIFF"
