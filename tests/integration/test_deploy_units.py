"""The systemd units in deploy/systemd: systemd itself finds nothing wrong in them, every
ExecStart runs a `klique` command with options that command has, and the hardening is what
docs/install.md says (the agent, which submits through sudo, keeps the power to)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

UNITS = ROOT / "deploy" / "systemd"
KLIQUE = str(Path(sys.executable).parent / "klique")
INSTALLED = "/opt/klique/bin/klique"  # where the units expect the install (docs/install.md)
# What systemd would put in the agent's ExecStart for `klique-agent@far.service`.
EXPANDED = {
    "%i": "far",
    "${KLIQUE_SERVER}": "https://klique.example.org",
    "${CREDENTIALS_DIRECTORY}": "/run/credentials/klique-agent@far.service",
}


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        message = "needs systemd-analyze (Debian's systemd package: scripts/apt-deps installs it)"
        if os.environ.get("KLIQUE_REQUIRE_SERVICES") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


def settings(unit: Path) -> dict[str, list[str]]:
    """Each key's values, in order (a key may be given more than once)."""
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def verify(folder: Path, *names: str) -> str:
    """systemd-analyze's complaints about the units (empty when it has none): it exits 0 on an
    unknown key or a bad value, only saying so, so the words are what count."""
    done = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", *[f"./{n}" for n in names]],
        capture_output=True,
        text=True,
        cwd=folder,
        check=False,
    )
    return (done.stdout + done.stderr).strip() or ("" if done.returncode == 0 else "failed")


def installable(tmp_path: Path) -> Path:
    """The units as installed here: ExecStart's klique is this environment's, and the agent's
    template has an instance (`verify` reads a template only through one)."""
    for unit in UNITS.glob("*.service"):
        text = unit.read_text().replace(INSTALLED, KLIQUE)
        (tmp_path / unit.name).write_text(text)
        if unit.name.endswith("@.service"):
            (tmp_path / unit.name.replace("@.", "@far.")).write_text(text)
    return tmp_path


def test_systemd_finds_nothing_wrong_in_the_units(tmp_path):
    folder = installable(tmp_path)
    assert verify(folder, "klique-server.service", "klique-agent@far.service") == ""


def test_the_check_sees_a_misspelt_option_and_a_bad_value(tmp_path):
    folder = installable(tmp_path)
    unit = folder / "klique-server.service"
    unit.write_text(
        unit.read_text()
        .replace("Restart=on-failure", "Restart=sometimes")
        .replace("PrivateTmp=", "PrivateTemp=")
    )
    said = verify(folder, "klique-server.service")
    assert "sometimes" in said and "PrivateTemp" in said


@pytest.mark.parametrize("name", ["klique-server.service", "klique-agent@.service"])
def test_each_execstart_runs_a_klique_command_with_options_it_has(name):
    (command,) = settings(UNITS / name)["ExecStart"]
    for raw, value in EXPANDED.items():
        command = command.replace(raw, value)
    argv = shlex.split(command)
    assert argv[0] == INSTALLED
    words = [w for w in argv[1:] if not w.startswith("-")]
    first_option = next(i for i, w in enumerate(argv) if w.startswith("-"))
    subcommand = argv[1:first_option]
    assert subcommand and subcommand == words[: len(subcommand)]
    shown = subprocess.run(
        [KLIQUE, *subcommand, "--help"], capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0, shown.stderr
    for option in [w.split("=")[0] for w in argv if w.startswith("--")]:
        assert f"{option} " in shown.stdout, f"`klique {' '.join(subcommand)}` has no {option}"


def test_the_units_run_as_klique_hardened_and_restart_on_failure():
    server = settings(UNITS / "klique-server.service")
    agent = settings(UNITS / "klique-agent@.service")
    for unit in (server, agent):
        assert unit["User"] == ["klique"] and unit["Restart"] == ["on-failure"]
        assert unit["ProtectSystem"] == ["strict"] and unit["PrivateTmp"] == ["yes"]
        assert unit["ProtectHome"] == ["read-only"] and unit["StateDirectory"]
        assert unit["EnvironmentFile"]
    assert server["EnvironmentFile"] == ["/etc/klique/server.env"]  # KLIQUE_DB, not in the unit
    assert server["NoNewPrivileges"] == ["yes"]
    # sudo is setuid: an agent that could not gain privileges could not submit as anyone.
    assert "NoNewPrivileges" not in agent and "RestrictSUIDSGID" not in agent
