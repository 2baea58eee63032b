"""A real browser (Debian's headless chromium through chromium-driver) against a live Klique
server with a host pool and the real Slurm pool, signed in as alice; screenshots of each page
go to docs/screenshots/."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import HOST_ACCESS, ROOT, Server, shared_folder, start_server, stop_server
from helpers.batch import open_folder, pool_yaml, remove_tree

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = ROOT / "docs" / "screenshots"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1366,900",
]


def web_estate(host_root: Path, slurm_root: Path) -> str:
    """Alice and the admin in team vision (cpu on the host, slurm on the cluster, and `held`
    with a limit of 0 so that its tasks wait); bob alone in team audio."""
    batch = pool_yaml("slurm", slurm_root, None)
    return f"""
teams:
  vision: [alice, admin]
  audio: [bob]
resources:
  cpu:
    description: one CPU on this host
    profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [host]}}
  slurm:
    description: one CPU on the cluster's debug partition
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [batch]}}
  held:
    profile: {{cpus: 1, memory: 100M, walltime: 10m, pools: [host, batch]}}
pools:
  host:
    kind: host
    slots: 4
    {HOST_ACCESS.replace("$JOB_ROOT", str(host_root))}
{batch}
policies:
  vision:
    {{resources: [cpu, slurm, held], reservation: {{cpu: 1}}, limit: {{held: 0}}, priority: 10}}
  audio: {{resources: [cpu], limit: {{cpu: 2}}}}
"""


@dataclass(frozen=True)
class Site:
    """The live server, and tokens for alice and bob."""

    server: Server
    alice: str
    bob: str


@pytest.fixture(scope="module")
def site(slurm_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    host_root = shared_folder("klique-web-")
    slurm_root = open_folder(slurm_cluster.work / f"web-{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]
    folder = tmp_path_factory.mktemp("web")
    estate = folder / "estate.yaml"
    estate.write_text(web_estate(host_root, slurm_root))
    server = start_server(folder / "home", estate)
    try:
        yield Site(server, server.make_token("alice"), server.make_token("bob"))
    finally:
        stop_server(server)
        shutil.rmtree(host_root, ignore_errors=True)
        remove_tree(slurm_root)


def _chromium() -> None:
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        message = "chromium and chromium-driver are not installed (scripts/apt-deps installs them)"
        if os.environ.get("KLIQUE_REQUIRE_SERVICES") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture
def browser() -> Iterator[object]:
    """A fresh headless chromium with its own profile folder."""
    _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="klique-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: object, name: str) -> Path:
    """The whole page as it is now, into docs/screenshots/NAME.png (shown in docs/web-ui.md)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})  # type: ignore[attr-defined]
    size = metrics["cssContentSize"]
    shot = driver.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {
                "x": 0,
                "y": 0,
                "width": 1366,
                "height": min(size["height"], 3000),
                "scale": 1,
            },
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path
