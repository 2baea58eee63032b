"""Sizes ('16G', '512M') and durations ('4h', '01:30:00') as people write them, read into
numbers with the standard library alone: the CLI reads them without the server's pydantic
types (broker/units.py), which build on these."""

from __future__ import annotations

import re

_SIZE_UNITS = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size_mb(value: object) -> int:
    """'16G', '512M', '1.5T' or a number of MiB -> MiB."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(value), re.IGNORECASE)
    if not match:
        raise ValueError(f"{value!r} is not a size; fix: write it like 512M, 16G or 1T")
    return int(float(match[1]) * _SIZE_UNITS[match[2].lower()])


def parse_duration_s(value: object) -> int:
    """'90s', '30m', '4h', '2d', 'HH:MM:SS', 'MM:SS' or a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
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
