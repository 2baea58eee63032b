"""The web UI's task list with 100,000 tasks in the store: the first page's time (median of
N requests) against the API's own first page, `GET /api/v1/tasks?limit=100`, in the same run.

Also timed: a state filter, a search for a rare word (bounded by the search window), a page
deep in the list (keyset paging), and a plain user's list (their own tasks only).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import httpx
from _common import klique_server, last_line
from sqlalchemy import insert

from broker.store.identity import IdentityStore
from broker.store.repository import Store
from broker.store.tables import TaskRow

TASKS = 100_000
RUNS = 30
USERS = [f"user{i:02d}" for i in range(20)]
FINAL = ["completed"] * 7 + ["failed", "cancelled", "timeout"]


def fill(home: Path) -> None:
    """100,000 tasks: most finished, 1,000 queued, a rare word in 50 names; tokens for the
    admin and for user00, written beside the database."""
    store = Store.open(f"sqlite:///{home / 'klique.db'}")  # the server's default store in `home`
    now = time.time()
    rows = []
    for i in range(TASKS):
        state = "queued" if i % 100 == 0 else FINAL[i % len(FINAL)]
        name = f"sweep-{i}" + (" needle" if i % 2000 == 7 else "")
        rows.append(
            {
                "name": name,
                "owner": USERS[i % len(USERS)],
                "team": None,
                "project": f"project-{i % 37}",
                "resource": "cpu",
                "state": state,
                "reason": "",
                "spec": json.dumps(
                    {"command": ["python", "train.py"], "resource": "cpu", "name": name}
                ),
                "diff": "",
                "diff_bytes": 0,
                "gpus": 0.0,
                "report_digest": "",
                "created_at": now - TASKS + i,
                "updated_at": now - TASKS + i,
                "queued_at": now - TASKS + i,
                "started_at": None if state == "queued" else now - TASKS + i + 1,
                "finished_at": None if state == "queued" else now - TASKS + i + 30,
            }
        )
    with store.engine.begin() as connection:  # a benchmark's fixture: one bulk insert
        connection.execute(insert(TaskRow), rows)
    identities = IdentityStore(store)
    (home / "admin.token").write_text(identities.add_token("admin", kind="admin")[0])
    (home / "user.token").write_text(identities.add_token(USERS[0])[0])
    store.close()


def browser_session(base: str, token: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=60)
    form = client.get("/login").text
    login_token = re.search(r'name="login_token" value="([^"]+)"', form)[1]  # type: ignore[index]
    answer = client.post("/login", data={"token": token, "login_token": login_token})
    assert answer.status_code == 303, answer.text
    return client


def median_ms(client: httpx.Client, path: str, expect: str, **headers: str) -> float:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        answer = client.get(path, headers=headers)
        times.append(time.perf_counter() - t0)
        assert answer.status_code == 200 and expect in answer.text, (path, answer.status_code)
    return round(statistics.median(times) * 1000, 1)


def main() -> None:
    with klique_server(prepare=fill) as (api, home):
        base = str(api.base_url).removesuffix("/api/v1").removesuffix("/api/v1/")
        admin = browser_session(base, (home / "admin.token").read_text())
        user = browser_session(base, (home / "user.token").read_text())
        figures = {
            "api_first_page_ms": median_ms(api, "/tasks?limit=100&all_users=true", '"id"'),
            "ui_first_page_ms": median_ms(admin, "/tasks", 'id="task-'),
            "ui_state_filter_ms": median_ms(admin, "/tasks?state=queued", 'id="task-'),
            "ui_search_rare_ms": median_ms(admin, "/tasks?q=needle", 'id="task-'),
            "ui_deep_page_ms": median_ms(admin, "/tasks?before=50000", 'id="task-'),
            "ui_user_first_page_ms": median_ms(user, "/tasks", 'id="task-'),
        }
        for key, value in figures.items():
            print(f"{key:24} {value:8.1f} ms (median of {RUNS})", flush=True)
    result = {
        "tasks": TASKS,
        "runs": RUNS,
        **figures,
        "ratio_ui_to_api": round(figures["ui_first_page_ms"] / figures["api_first_page_ms"], 2),
    }
    last_line(result)


if __name__ == "__main__":
    main()
