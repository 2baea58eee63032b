"""The web UI in a real browser, as alice would use it, against a live server with a host pool
and the real Slurm pool: sign in, watch a task submitted from the CLI appear and complete,
read its console and its plotted scalar, see why a task waits, cancel from the UI, and never
see bob's task. Each page's screenshot goes to docs/screenshots/."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from conftest import TASK_PY, submitted_id
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from .conftest import Site, screenshot

pytestmark = pytest.mark.slurm

TRAIN = (
    "import time\n"
    "from inside_job import report\n"
    "for step in range(5):\n"
    "    print(f'epoch {step}: loss {1.0 / (step + 1):.3f}', flush=True)\n"
    "    report.scalar('loss', 1.0 / (step + 1), step=step)\n"
    "    time.sleep(0.3)\n"
    "print('<b>done</b> & dusted', flush=True)\n"
)


def until(driver: Any, condition: Any, what: str, timeout: float = 90) -> Any:
    """Wait for `condition(driver)` to be truthy, retrying over redraws; fail naming `what`."""

    def check(d: Any) -> Any:
        try:
            return condition(d)
        except StaleElementReferenceException:
            return False  # the live update replaced the element meanwhile

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(check, f"waiting for {what}")


def sign_in(driver: Any, site: Site, token: str, path: str = "/tasks") -> None:
    driver.get(f"{site.server.url}/login?next={path}")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    # The address changes when the next page starts to load: wait for the whole of it. The
    # sign-in page's own address ends with `path` too (`/login?next=<path>`), so compare the
    # whole address, lest the test read the sign-in page before the click has left it.
    until(
        driver,
        lambda d: (
            d.current_url == f"{site.server.url}{path}"
            and d.execute_script("return document.readyState") == "complete"
        ),
        f"{path} after signing in",
        30,
    )


def row_state(driver: Any, task_id: int) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, f"#task-{task_id} .state")
    return found[0].text if found else ""


def live(driver: Any) -> None:
    """The page's one live connection is open."""
    until(
        driver,
        lambda d: d.find_elements(By.CSS_SELECTOR, "[data-live-status][data-state=open]"),
        "the live connection",
        30,
    )


def submit_cli(site: Site, token: str, resource: str, script: str, name: str) -> int:
    result = site.server.cli(
        "submit",
        "--no-code",
        "--json",
        "-r",
        resource,
        "-n",
        name,
        "--",
        TASK_PY,
        "-c",
        script,
        token=token,
    )
    return submitted_id(result)


def test_signing_in_takes_a_token_and_signing_out_ends_the_session(site, browser) -> None:
    browser.get(site.server.url + "/tasks")
    until(browser, lambda d: "/login" in d.current_url, "the sign-in page")
    screenshot(browser, "login")
    browser.find_element(By.ID, "token").send_keys("not-a-token")
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    alert = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "[role=alert]"), "an error")
    assert "not valid" in alert[0].text
    sign_in(browser, site, site.alice)
    assert "alice" in browser.find_element(By.CSS_SELECTOR, "header .who").text
    cookie = browser.get_cookie("klique_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    browser.find_element(By.CSS_SELECTOR, "header .who button").click()
    until(browser, lambda d: "/login" in d.current_url, "the sign-in page after signing out")
    browser.get(site.server.url + "/tasks")
    until(browser, lambda d: "/login" in d.current_url, "signed out for good")


@pytest.mark.parametrize("resource", ["cpu", "slurm"])
def test_a_task_from_the_cli_appears_and_completes_live_with_its_console_and_chart(
    site, browser, resource
) -> None:
    sign_in(browser, site, site.alice)
    live(browser)
    task_id = submit_cli(site, site.alice, resource, TRAIN, f"train on {resource}")
    # No reload: the row arrives over the page's live connection and follows the task.
    until(browser, lambda d: row_state(d, task_id), f"task {task_id} to appear")
    until(browser, lambda d: row_state(d, task_id) == "completed", f"task {task_id} completed")
    row = browser.find_element(By.ID, f"task-{task_id}")
    assert f"train on {resource}" in row.text and resource in row.text
    screenshot(browser, f"tasks-{resource}")

    row.find_element(By.LINK_TEXT, str(task_id)).click()
    console = until(
        browser,
        lambda d: (
            "dusted" in d.find_element(By.ID, "console").text and d.find_element(By.ID, "console")
        ),
        "the console",
    )
    assert "epoch 4: loss 0.200" in console.text
    assert "<b>done</b> & dusted" in console.text  # shown as text, never as markup
    assert not browser.find_elements(By.CSS_SELECTOR, "#console b")
    chart = until(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "[data-scalar=loss] canvas"),
        "the chart",
    )
    assert chart[0].size["width"] > 200
    assert "loss" in browser.find_element(By.CSS_SELECTOR, "[data-scalar=loss]").text
    timeline = browser.find_element(By.CSS_SELECTOR, "ol.timeline").text
    assert "queued" in timeline and "completed" in timeline
    assert resource == "cpu" or browser.find_element(By.CSS_SELECTOR, "dl.facts").text.count(
        "batch"
    )
    screenshot(browser, f"task-{resource}")


def test_the_console_and_chart_stream_while_the_task_runs(site, browser) -> None:
    slow = TRAIN.replace("time.sleep(0.3)", "time.sleep(1.5)")
    task_id = submit_cli(site, site.alice, "cpu", slow, "slow train")
    sign_in(browser, site, site.alice, f"/tasks/{task_id}")
    until(
        browser,
        lambda d: d.find_element(By.CSS_SELECTOR, "[data-state]").text == "running",
        "the open page to say running",
    )
    until(browser, lambda d: "epoch 1" in d.find_element(By.ID, "console").text, "epoch 1 live")
    until(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-scalar=loss] canvas"), "a chart"
    )
    until(
        browser,
        lambda d: d.find_element(By.CSS_SELECTOR, "[data-state]").text == "completed",
        "the state to turn completed on the open page",
    )
    assert "dusted" in browser.find_element(By.ID, "console").text


def test_a_waiting_task_shows_the_one_reason_and_each_pool(site, browser) -> None:
    task_id = submit_cli(site, site.alice, "held", "print('never')", "waits")
    sign_in(browser, site, site.alice, f"/tasks/{task_id}")
    why = until(browser, lambda d: d.find_element(By.CSS_SELECTOR, "section.why").text, "why")
    assert "the team is at its limit for this compute resource" in why
    assert "[over-limit]" in why
    screenshot(browser, "task-waiting")
    browser.get(site.server.url + "/tasks?state=queued")
    until(
        browser,
        lambda d: "at its limit" in d.find_element(By.ID, f"task-{task_id}").text,
        "the reason in the list",
    )


def test_cancelling_from_the_ui_one_task_and_a_selection(site, browser) -> None:
    ids = [submit_cli(site, site.alice, "held", "print(1)", f"to cancel {i}") for i in range(3)]
    sign_in(browser, site, site.alice, f"/tasks/{ids[0]}")
    browser.find_element(By.CSS_SELECTOR, "form[action$='/cancel'] button").click()
    until(
        browser,
        lambda d: d.find_element(By.CSS_SELECTOR, "[data-state]").text == "cancelled",
        "the task page to say cancelled",
    )
    assert site.server.task(ids[0], site.alice)["state"] == "cancelled"

    browser.get(site.server.url + "/tasks?state=queued")

    def select(d: Any) -> bool:
        """Tick both rows; a live update may redraw a row between finding and clicking it (the
        page keeps what is ticked across redraws), so this is retried until both are."""
        boxes = [d.find_element(By.CSS_SELECTOR, f"#task-{i} input[name=id]") for i in ids[1:]]
        for box in boxes:
            if not box.is_selected():
                box.click()
        return all(box.is_selected() for box in boxes)

    until(browser, select, "both queued tasks ticked")
    browser.find_element(By.CSS_SELECTOR, "button[form=cancel-many]").click()
    for task_id in ids[1:]:
        site.server.wait_state(task_id, {"cancelled"}, token=site.alice)
    until(browser, lambda d: not d.find_elements(By.ID, f"task-{ids[1]}"), "the queued list")


def test_another_users_task_is_nowhere(site, browser) -> None:
    secret = "bobs-private-run"
    with site.server.api(site.bob) as api:
        bobs = api.post(
            "/tasks", json={"command": ["sleep", "1"], "resource": "cpu", "name": secret}
        )
    assert bobs.status_code == 201, bobs.text
    bob_id = bobs.json()["id"]
    sign_in(browser, site, site.alice)
    assert secret not in browser.page_source
    browser.get(f"{site.server.url}/tasks?q={secret}")
    assert not browser.find_elements(By.ID, f"task-{bob_id}")
    assert secret not in browser.find_element(By.CSS_SELECTOR, "table.tasks").text
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-empty]"), "the empty list")
    assert "No tasks match these filters" in browser.page_source
    browser.get(f"{site.server.url}/tasks/{bob_id}")
    assert f"no task {bob_id} of yours" in browser.page_source and secret not in browser.page_source
    browser.get(f"{site.server.url}/compare?ids={bob_id}")
    assert secret not in browser.page_source
    cookies = {"klique_session": browser.get_cookie("klique_session")["value"]}
    with httpx.Client(base_url=site.server.url, cookies=cookies, timeout=30) as client:
        stream = client.get(f"/events/tasks/{bob_id}")
        assert secret not in stream.text and "bob" not in stream.text
        assert client.get(f"/api/v1/tasks/{bob_id}").status_code == 404
        listed = client.get("/api/v1/tasks").json()
        assert bob_id not in [t["id"] for t in listed]


def test_the_estate_pages_render_live_and_export(site, browser) -> None:
    ran = submit_cli(site, site.alice, "cpu", "print('metered')", "metered")
    site.server.wait_state(ran, {"completed"}, token=site.alice)
    sign_in(browser, site, site.server.token, "/pools")
    live(browser)
    until(
        browser,
        lambda d: (
            "yes" in d.find_element(By.ID, "pool-batch").text
            and "yes" in d.find_element(By.ID, "pool-host").text
        ),
        "both pools reachable",
    )
    assert "batch" in browser.find_element(By.CSS_SELECTOR, "table.resources").text
    screenshot(browser, "pools")

    browser.get(site.server.url + "/usage?by=user&since=")
    until(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, "table.usage tbody th"), "a usage row"
    )
    assert "alice" in browser.find_element(By.CSS_SELECTOR, "table.usage").text
    assert browser.find_elements(By.CSS_SELECTOR, "figure.bars svg rect")
    screenshot(browser, "usage")
    cookies = {"klique_session": browser.get_cookie("klique_session")["value"]}
    exported = httpx.get(site.server.url + "/usage.csv?by=user&since=", cookies=cookies, timeout=30)
    assert exported.headers["content-type"].startswith("text/csv")
    assert exported.text.splitlines()[0].startswith("user,runs,ongoing,gpu_hours")

    browser.get(site.server.url + "/policies")
    text = browser.find_element(By.CSS_SELECTOR, "table.policies").text
    assert "vision" in text and "audio" in text
    browser.find_element(By.ID, "estate_text").send_keys(
        (site.server.home.parent / "estate.yaml").read_text().replace("held: 0", "held: 5")
    )
    browser.find_element(By.CSS_SELECTOR, "form[action='/policies/simulate'] button").click()
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "table.simulation"), "the simulation")
    screenshot(browser, "policies")

    browser.get(site.server.url + "/platform?resource=slurm&check=1")
    script = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "pre.script"), "the script")
    assert "#SBATCH" in script[0].text
    assert "The check passed." in browser.page_source
    screenshot(browser, "platform")


def test_compare_highlights_what_differs_and_overlays_the_scalars(site, browser) -> None:
    first = submit_cli(site, site.alice, "cpu", TRAIN, "lr 0.1")
    second = submit_cli(site, site.alice, "cpu", TRAIN.replace("1.0 /", "2.0 /"), "lr 0.2")
    for task_id in (first, second):
        site.server.wait_state(task_id, {"completed"}, token=site.alice)
    sign_in(browser, site, site.alice, f"/compare?ids={first},{second}")
    differs = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "tr.differs th")]
    assert any(r.startswith("name") for r in differs) and any(
        r.startswith("command") for r in differs
    )
    assert not any(r.startswith("resource") for r in differs)
    legend = until(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, "[data-scalar=loss] .u-legend"),
        "legend",
    )
    assert f"task {first}" in legend[0].text and f"task {second}" in legend[0].text
    screenshot(browser, "compare")


def test_an_artifact_downloads_from_the_task_page(site, browser) -> None:
    """A task keeps a file with the SDK; its page links it, and the link downloads it."""
    script = (
        "open('result.txt', 'w').write('forty-two')\n"
        "import klique\n"
        "klique.Task.init().upload_artifact('result.txt', 'result.txt')\n"
    )
    task_id = submit_cli(site, site.alice, "cpu", script, "artifact")
    site.server.wait_state(task_id, {"completed"}, token=site.alice)
    sign_in(browser, site, site.alice, f"/tasks/{task_id}")
    link = browser.find_element(By.LINK_TEXT, "result.txt")
    cookies = {"klique_session": browser.get_cookie("klique_session")["value"]}
    body = httpx.get(link.get_attribute("href"), cookies=cookies, timeout=30)
    assert body.status_code == 200 and body.text == "forty-two", json.dumps(dict(body.headers))


UNLABELLED = """
return Array.from(document.querySelectorAll('input, select, textarea, button'))
  .filter(el => el.type !== 'hidden')
  .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                && !(el.tagName === 'BUTTON' && el.textContent.trim()))
  .map(el => el.outerHTML);
"""


def test_every_page_is_labelled_and_works_from_the_keyboard(site, browser) -> None:
    from selenium.webdriver.common.keys import Keys

    task_id = submit_cli(site, site.alice, "held", "print(1)", "keyboard")
    sign_in(browser, site, site.server.token)
    for path in (
        "/tasks",
        f"/tasks/{task_id}",
        "/compare",
        "/pools",
        "/usage",
        "/policies",
        "/platform",
    ):
        browser.get(site.server.url + path)
        assert browser.execute_script(UNLABELLED) == [], path
        assert browser.find_element(By.TAG_NAME, "h1").text, path
    browser.get(site.server.url + "/tasks")
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    skip = browser.switch_to.active_element
    assert skip.text == "Skip to the content"
    skip.send_keys(Keys.ENTER)
    assert browser.switch_to.active_element.get_attribute("id") == "main"
    # From the content, Tab reaches the filters, then the task's checkbox and its link.
    seen = []
    for _ in range(40):
        browser.switch_to.active_element.send_keys(Keys.TAB)
        active = browser.switch_to.active_element
        seen.append(
            active.get_attribute("aria-label") or active.text or active.get_attribute("name")
        )
        if active.text == str(task_id):
            break
    assert f"Select task {task_id}" in seen and seen[-1] == str(task_id), seen
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    until(
        browser, lambda d: d.current_url.endswith(f"/tasks/{task_id}"), "the task page by keyboard"
    )
