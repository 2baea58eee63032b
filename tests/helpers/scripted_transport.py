"""A transport whose commands get scripted answers, for a driver's flow without a scheduler."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.transport import Completed, Transport

Answer = Callable[[list[str], str], Completed]


class ScriptedTransport(Transport):
    """Answers each command with `answer(argv, account)`; files come from a dict."""

    host = "login"

    def __init__(self, answer: Answer, files: Mapping[str, bytes] | None = None) -> None:
        self.answer = answer
        self.files = dict(files or {})
        self.calls: list[tuple[list[str], str]] = []

    async def run(self, argv: Sequence[str], *, account: str, **_: Any) -> Completed:
        self.calls.append((list(argv), account))
        return self.answer(list(argv), account)

    async def read_file(
        self, path: str, *, account: str | None = None, offset: int = 0
    ) -> bytes | None:
        return self.files.get(path)

    async def read_files(self, paths: Sequence[str], *, account: str) -> dict[str, bytes]:
        return {p: self.files[p] for p in paths if p in self.files}

    async def _exec(self, *args: Any) -> Any:
        raise AssertionError("no process runs here")
