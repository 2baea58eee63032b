"""Free text never enters a batch script: name-like fields have patterns at the API, and a
template refuses any value with a control character, whatever field carries it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HOST_ESTATE

from broker.errors import TemplateError
from broker.templates import TemplateFile, render, safe_directive

INJECTION = "x\n#SBATCH --array=0-999\n#"


@pytest.fixture(scope="module")
def host_server(module_server_factory):
    """One server for this module: every submission here is refused, so none records a task."""
    return module_server_factory(HOST_ESTATE)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("project", INJECTION),
        ("project", "x\rtouch /tmp/pwned"),
        ("resource", "cpu\n#SBATCH --array=0-9"),
        ("name", "a\nb"),
        ("image", "img\n#SBATCH --uid=0"),
        ("requirements", ["six\n#SBATCH --x"]),
    ],
)
def test_a_control_character_in_a_name_like_field_is_refused(host_server, field, value) -> None:
    with host_server.api() as api:
        answer = api.post("/tasks", json={"command": ["true"], field: value})
        assert answer.status_code == 422, answer.text
        assert field in answer.text
        assert api.get("/tasks").json() == []  # nothing was recorded


def test_the_cli_refuses_a_project_with_a_newline(host_server) -> None:
    done = host_server.cli("submit", "--no-code", "-p", INJECTION, "--", "true")
    assert done.exit_code == 1 and "project" in done.output


def test_a_new_template_field_cannot_bring_a_newline_into_a_script(tmp_path: Path) -> None:
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "default.sh.j2").write_text("#!/bin/bash\n# {{ anything }}\ntrue\n")
    template = TemplateFile("slurm/default.sh.j2", tmp_path / "slurm" / "default.sh.j2")
    with pytest.raises(TemplateError, match="control character"):
        render(template, {"anything": INJECTION}, (tmp_path,))
    assert "# 'a b'" in render(template, {"anything": "a b"}, (tmp_path,))


@pytest.mark.parametrize(
    "directive", ["--account=a\n", "--account=a\n#SBATCH --array=1-9", "--x\r"]
)
def test_a_directive_with_a_line_break_is_refused(directive: str) -> None:
    with pytest.raises(TemplateError, match="not allowed in a batch script"):
        safe_directive(directive, "the test")
