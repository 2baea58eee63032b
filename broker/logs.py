"""The server's and agent's logs in the form the operator asked for: text (the default), or
JSON (`--log-format json`): one object a line for each event, with its time, level, logger
and message, and the ids the event names (`task_id`, `pool`, `native_id`: logging's `extra`),
ready for a log shipper. python-json-logger does the formatting."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

FORMATS = ("text", "json")
FIELDS = ["levelname", "name", "message"]
NAMES = {"levelname": "level", "name": "logger"}
QUIET = ("httpx", "httpcore", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncssh")


def json_formatter() -> logging.Formatter:
    """Each record as one line of JSON: time (ISO 8601, UTC), level, logger, message, then
    the event's own fields; a traceback travels inside the object, never on lines of its own."""
    return JsonFormatter(FIELDS, rename_fields=NAMES, timestamp="time")


def log_json(level: int = logging.INFO) -> None:
    """Send every log record of this process, uvicorn's and Python's warnings included, to
    standard error as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(json_formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
    for name in QUIET:  # their own chatter (a line per request) is not an event
        logging.getLogger(name).setLevel(logging.WARNING)
