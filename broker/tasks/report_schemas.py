"""What a task reports beyond scalars (klique/logger.py writes them, the runner sends them):
one item of the runner's report each, and the API's view of one."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from broker.names import LINE

# The kinds, as the SDK names them: a single value, a table (columns and rows), an image
# (PNG or JPEG), a plot (Plotly's JSON), a histogram (bins and counts), a text (plain or
# markdown), a media file.
ReportKind = Literal["single", "table", "image", "plot", "histogram", "text", "media"]
KINDS: tuple[str, ...] = ReportKind.__args__  # type: ignore[attr-defined]
MEDIA_TYPE = r"^[a-z]+/[a-z0-9.+-]{1,80}$"
# base64 of the largest item (broker/bounds.py ITEM_BYTES), with room for its padding
MAX_CONTENT_CHARS = 4 * (32 * 1024 * 1024) // 3 + 4


class ReportIn(BaseModel):
    """One report: what it is, where it goes (title, series, iteration), its JSON `data`, and
    an image's or media file's bytes (`content`, base64)."""

    kind: ReportKind
    title: str = Field(min_length=1, max_length=200, pattern=LINE)
    series: str = Field("", max_length=200, pattern=LINE)
    iteration: int | None = Field(None, ge=-(2**62), lt=2**62)
    time: Annotated[float, Field(allow_inf_nan=False)] | None = None
    data: Any = None
    content: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    content_type: str | None = Field(None, pattern=MEDIA_TYPE)


class ReportOut(BaseModel):
    """One report as the API shows it; an image's or media file's bytes are at `file`."""

    id: int
    kind: str
    title: str
    series: str
    iteration: int | None
    time: float
    data: Any
    content_type: str
    size: int
    file: str | None  # the API path of its bytes, if it has any
