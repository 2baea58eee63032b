"""The units an estate file writes: sizes ('16G'), durations ('4h', '01:30:00') and names,
as pydantic types that every section of the file (and every pool kind's settings) shares."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from broker.names import NAME

_SIZE_UNITS = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size_mb(value: object) -> int:
    """'16G', '512M', '1.5T' or a number of MiB -> MiB."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ValueError(f"{value!r} is not a size; fix: write it like 512M, 16G or 1T")
    return int(float(match[1]) * _SIZE_UNITS[match[2].lower()])


def parse_duration_s(value: object) -> int:
    """'90s', '30m', '4h', '2d', 'HH:MM:SS', 'MM:SS' or a number of seconds -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}", text):
        seconds = 0
        for part in text.split(":"):
            seconds = seconds * 60 + int(part)
        return seconds  # HH:MM:SS or MM:SS, as Slurm reads --time
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text, re.IGNORECASE)
    if not match:
        raise ValueError(
            f"{value!r} is not a duration; fix: write it like 90s, 30m, 4h, 2d or 04:00:00"
        )
    return int(float(match[1]) * _TIME_UNITS[match[2].lower()])


SizeMB = Annotated[int, BeforeValidator(parse_size_mb), Field(ge=0)]
Seconds = Annotated[int, BeforeValidator(parse_duration_s), Field(gt=0)]
SecondsOrZero = Annotated[int, BeforeValidator(parse_duration_s), Field(ge=0)]
Name = Annotated[str, Field(pattern=NAME)]


class Strict(BaseModel):
    """A section of the estate file: unknown keys are errors (a typo never passes silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
