"""`klique app launch --wait` means "ready to open": it returns when the app runs and answers its
ready path, or when it ended; meanwhile it says each step once on stderr, with the console's new
lines (an environment being built), and keeps stdout for the answer."""

from __future__ import annotations

from typing import Any

import pytest

from broker.cli import apps
from broker.client import ApiError


class Launch:
    """A scripted server: the instance as each poll sees it, and the console as it grows."""

    def __init__(self, steps: list[dict[str, Any]], console: list[str]) -> None:
        self.steps = steps
        self.console = console
        self.polls = 0

    def get(self, path: str, **params: Any) -> Any:
        if path.endswith("/logs"):
            text = "".join(self.console[: self.polls]).encode()[params["offset"] :].decode()
            return {"text": text, "offset": params["offset"] + len(text.encode()), "final": False}
        step = self.steps[min(self.polls, len(self.steps) - 1)]
        self.polls += 1
        return {"app": "jupyter", "id": 7, "reason": "", **step}


def test_wait_returns_only_when_the_app_answers_and_says_each_step_once(capsys) -> None:
    queued = {
        "state": "queued",
        "ready": False,
        "reason": "no pool in the profile can start it now",
    }
    building = {"state": "running", "ready": False}
    ready = {"state": "running", "ready": True}
    launch = Launch(
        [queued, queued, building, building, building, ready],
        ["", "", "making the environment: 3 packages\n", "installed numpy\nstarting ", "", ""],
    )
    instance = apps.wait_ready(launch, 7, poll_s=0)  # type: ignore[arg-type]
    assert instance["ready"] and instance["state"] == "running" and launch.polls == 6
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "app jupyter (task 7) is queued: no pool in the profile can start it now",
        "app jupyter (task 7) runs: its environment is made, then the app starts; its route "
        "opens when it answers",
        "  | making the environment: 3 packages",
        "  | installed numpy",
    ]


def test_ready_while_not_running_is_not_ready_to_open() -> None:
    assert not apps.ready_to_open({"state": "placed", "ready": True})
    assert not apps.ready_to_open({"state": "running", "ready": False})
    assert apps.ready_to_open({"state": "running", "ready": True})


def test_an_app_that_ends_while_waited_for_ends_the_wait(capsys) -> None:
    ended = {"state": "failed", "ready": False, "reason": "the image does not exist"}
    launch = Launch([{"state": "queued", "ready": False}, ended], [])
    assert apps.wait_ready(launch, 7, poll_s=0)["state"] == "failed"  # type: ignore[arg-type]


def test_a_console_that_cannot_be_read_does_not_end_the_wait() -> None:
    class NoConsole(Launch):
        def get(self, path: str, **params: Any) -> Any:
            if path.endswith("/logs"):
                raise ApiError("no console yet")
            return super().get(path, **params)

    steps = [{"state": "running", "ready": False}, {"state": "running", "ready": True}]
    assert apps.wait_ready(NoConsole(steps, []), 7, poll_s=0)["ready"]  # type: ignore[arg-type]


@pytest.mark.parametrize("state", ["completed", "failed", "cancelled", "timeout", "lost"])
def test_every_final_state_ends_the_wait(state: str) -> None:
    launch = Launch([{"state": state, "ready": False}], [])
    assert apps.wait_ready(launch, 7, poll_s=0)["state"] == state  # type: ignore[arg-type]
