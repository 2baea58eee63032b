"""PBS Professional's `qstat -f -F json` as known versions print it: some print invalid JSON
(numeric-looking values bare, PBS's own escapes copied into strings), and one job's bad record
must not hide the others. Pure functions over the command's text."""

from __future__ import annotations

import json
import re
from typing import Any

# JSON's own escapes (RFC 8259, section 7); `\u` needs four hex digits after it.
_JSON_ESCAPES = frozenset('"\\/bfnrt')
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
# Escapes PBS adds for its own attribute storage (a comma separates Variable_List entries);
# OpenPBS #2049 (in 22.05) drops their backslash, as this does.
_PBS_ESCAPES = frozenset("',")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = frozenset({"true", "false", "null"})
_JOBS = re.compile(r'"Jobs"\s*:\s*\{')


def job_records(text: str) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """(job id, attributes) of every job that reads, and (job id, problem) of every job that
    does not. Raises ValueError when the text has no readable shape at all."""
    repaired = repair(text)
    if not repaired.strip():
        return [], []
    try:
        doc = json.loads(repaired, strict=False)
    except ValueError:
        return _one_by_one(repaired)
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    jobs = doc.get("Jobs") or {}
    if not isinstance(jobs, dict):
        raise ValueError('"Jobs" is not an object')
    return list(jobs.items()), []


def repair(text: str) -> str:
    """Valid JSON from qstat's text where it can be had: a bare value that is not a JSON
    number is quoted (`005`, `.5`, `1.`, `0x1f`, `inf`: OpenPBS #1255, fixed by #2603 in
    23.06), and an escape JSON does not know is made literal (`\\'` and `\\,` become `'` and
    `,`, as OpenPBS #2049 does; any other, from a `qsub -V` value, keeps its backslash)."""
    out: list[str] = []
    i, size = 0, len(text)
    while i < size:
        char = text[i]
        if char == '"':
            end = _string_end(text, i, lenient=True)
            out.append(_fix_escapes(text[i:end]))
            i = end
            continue
        out.append(char)
        i += 1
        if char == ":":
            i = _value_start(text, i, out)
    return "".join(out)


def _value_start(text: str, i: int, out: list[str]) -> int:
    """After a colon: a bare token that is not JSON is written quoted."""
    start = i
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text) or text[i] in '"{[':
        out.append(text[start:i])
        return i
    end = i
    while end < len(text) and text[end] not in ",}]\n":
        end += 1
    token = text[i:end].strip()
    if _NUMBER.fullmatch(token) or token in _LITERALS:
        out.append(text[start:end])
    else:
        out.append(text[start:i] + json.dumps(token))
    return end


def _fix_escapes(quoted: str) -> str:
    out: list[str] = [quoted[:1]]
    i, last = 1, len(quoted) - 1
    while i < len(quoted):
        char = quoted[i]
        if char == '"' and i < last:  # a quote inside the value (see _string_end)
            out.append('\\"')
            i += 1
            continue
        if char != "\\" or i + 1 >= last:
            out.append(char)
            i += 1
            continue
        follower = quoted[i + 1]
        if follower in _JSON_ESCAPES or (
            follower == "u" and _HEX4.fullmatch(quoted[i + 2 : i + 6])
        ):
            out.append(char + follower)
        elif follower in _PBS_ESCAPES:
            out.append(follower)
        else:
            out.append("\\\\" + follower)
        i += 2
    return "".join(out)


def _string_end(text: str, i: int, lenient: bool = False) -> int:
    """The index after the string that opens at i (the end of the text if it never closes).
    Lenient: a quote that is not followed by what may follow a string (`,` `:` `}` `]` or the
    line's end) is taken as part of the value, as PBS printed quotes unescaped before 2018
    (OpenPBS #830)."""
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"' and (not lenient or _closes(text, i + 1)):
            return i + 1
        i += 1
    return len(text)


def _closes(text: str, i: int) -> bool:
    while i < len(text) and text[i] in " \t\r":
        i += 1
    return i >= len(text) or text[i] in ",:}]\n"


def _value_end(text: str, i: int) -> int:
    """The index after the JSON value that starts at i: strings and nesting respected."""
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] not in "{[":
        while i < len(text) and text[i] not in ",}]\n":
            i += 1
        return i
    depth = 0
    while i < len(text):
        char = text[i]
        if char == '"':
            i = _string_end(text, i)
            continue
        depth += char in "{["
        depth -= char in "}]"
        i += 1
        if depth == 0:
            return i
    raise ValueError("a job's record never closes")


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _one_by_one(text: str) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """Each job of "Jobs" read on its own: a record that does not read is a problem."""
    found = _JOBS.search(text)
    if found is None:
        raise ValueError('no "Jobs" object to read')
    jobs: list[tuple[str, Any]] = []
    problems: list[tuple[str, str]] = []
    i = _skip_space(text, found.end())
    while i < len(text) and text[i] != "}":
        if text[i] != '"':
            raise ValueError(f"a job id was expected at character {i}")
        key_end = _string_end(text, i)
        job_id = json.loads(text[i:key_end])
        i = _skip_space(text, key_end)
        if text[i : i + 1] != ":":
            raise ValueError(f"':' was expected after job {job_id}")
        start = _skip_space(text, i + 1)
        end = _value_end(text, start)
        try:
            jobs.append((job_id, json.loads(text[start:end], strict=False)))
        except ValueError as exc:
            problems.append((job_id, f"its qstat JSON is invalid: {exc}"))
        i = _skip_space(text, end)
        if text[i : i + 1] == ",":
            i = _skip_space(text, i + 1)
    return jobs, problems
