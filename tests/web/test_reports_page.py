"""A task's reports beyond scalars in a real browser: a chart per title with a line per
series, smoothing and a log axis; a histogram; images with a step slider; a markdown text whose
script stays text. The page's screenshot goes to docs/screenshots/task-reports.png."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from .conftest import screenshot
from .test_browser import sign_in, submit_cli, until

pytestmark = pytest.mark.slurm

PNG = (  # 2x2 red, then blue
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==",
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGNkYPjPwMDAxMDAwMDAAAALHwEDmIWXfgAAAABJRU5ErkJggg==",
)
REPORTS = f"""
import base64, klique
log = klique.Task.init().get_logger()
for i in range(5):
    log.report_scalar("loss", "train", 1.0 / (i + 1), iteration=i)
    log.report_scalar("loss", "validation", 1.2 / (i + 1), iteration=i)
for i, data in enumerate({list(PNG)!r}):
    open("s%d.png" % i, "wb").write(base64.b64decode(data))
    log.report_image("samples", "val", iteration=i * 10, local_path="s%d.png" % i)
log.report_histogram("weights", "layer1", [3, 5, 2], xlabels=["-1", "0", "1"])
log.report_text("**bold** <script>document.title = 'owned'</script>", markdown=True)
"""


def test_the_task_page_draws_every_report_and_its_controls(site, browser) -> None:
    task_id = submit_cli(site, site.alice, "cpu", REPORTS, "reports")
    task = site.server.wait_state(task_id, token=site.alice)
    assert task["state"] == "completed", task
    sign_in(browser, site, site.alice, f"/tasks/{task_id}")
    chart = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-scalar=loss]"), "loss")
    legend = chart[0].find_element(By.CSS_SELECTOR, ".u-legend").text
    assert "train" in legend and "validation" in legend  # a line per series
    browser.find_element(By.CSS_SELECTOR, "[data-log-axis]").click()
    browser.execute_script(
        "var s = document.querySelector('[data-smoothing]'); s.value = '0.6';"
        "s.dispatchEvent(new Event('input'));"
    )
    until(
        browser,
        lambda d: d.find_element(By.CSS_SELECTOR, "[data-smoothing-value]").text == "0.6",
        "the smoothing shown",
    )
    assert browser.find_elements(By.CSS_SELECTOR, "[data-scalar=loss] canvas")
    assert browser.find_elements(By.CSS_SELECTOR, "[data-histogram=weights] canvas")

    image = browser.find_element(By.CSS_SELECTOR, "[data-image-series] img")
    newest = image.get_attribute("src")
    assert image.get_attribute("naturalWidth") == "2"  # the PNG, served as an image
    browser.execute_script(
        "var s = document.querySelector('[data-image-slider]'); s.value = '0';"
        "s.dispatchEvent(new Event('input'));"
    )
    step = browser.find_element(By.CSS_SELECTOR, "[data-image-step]").text
    assert step == "iteration 0" and image.get_attribute("src") != newest

    text = browser.find_element(By.CSS_SELECTOR, ".report-text").text
    assert "<script>" in text and browser.title != "owned"
    assert browser.find_elements(By.CSS_SELECTOR, ".report-text strong")
    logged = browser.get_log("browser")
    errors = [e for e in logged if e["level"] == "SEVERE" and e["source"] != "network"]
    assert errors == [], errors
    screenshot(browser, "task-reports")
