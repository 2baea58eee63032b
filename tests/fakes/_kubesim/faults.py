"""Faults injected into creates (not Kubernetes; main.py documents the endpoint): an error
answered in place of the create, or a create committed whose answer never comes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The reason and message the API server (or a proxy in front of it) answers with.
ANSWERS = {
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: etcdserver: request timed out"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
}


@dataclass
class Faults:
    """What the next creates meet: `errors` in order (each [plural, status, times left]), then
    `drops` creates of pods that are committed and answered by a closed connection."""

    errors: list[list[Any]] = field(default_factory=list)
    drops: int = 0

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Faults:
        """{"create": [{"status": 429, "times": 2, "kind": "pods"}], "drop_after_create": 1};
        ValueError names what is wrong."""
        errors = []
        for entry in body.get("create") or []:
            status = int(entry.get("status", 0))
            if status not in ANSWERS:
                raise ValueError(f"create: status {status} is not one of {sorted(ANSWERS)}")
            errors.append([entry.get("kind", "pods"), status, int(entry.get("times", 1))])
        return cls(errors, int(body.get("drop_after_create", 0)))

    def error_for(self, plural: str) -> int | None:
        """The status the next create of `plural` answers with, if a fault is due."""
        for entry in self.errors:
            if entry[0] == plural and entry[2] > 0:
                entry[2] -= 1
                return int(entry[1])
        return None

    def drop_for(self, plural: str) -> bool:
        if plural == "pods" and self.drops > 0:
            self.drops -= 1
            return True
        return False

    def left(self) -> dict[str, Any]:
        create = [{"kind": k, "status": s, "times": n} for k, s, n in self.errors if n > 0]
        return {"create": create, "drop_after_create": self.drops}
