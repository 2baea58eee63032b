"""The app catalogue and launches, on plain data: the shipped apps' command lines (vLLM, SGLang,
JupyterLab, any HTTP server), forms checked against their JSON Schema, catalogue errors with
file:line, and the refusals users read (locks, quotas, static routes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.apps import launch
from broker.apps.catalogue import BUILT_IN, load_catalogue, parse_app
from broker.apps.launch import AppRefused, LaunchForm, app_spec
from broker.domain import StaticRoute
from broker.errors import EstateError, KliqueError, NotPermitted
from broker.estate import load_estate, parse_estate

ESTATE = """
teams: {vision: [alice], nlp: [bob]}
resources:
  cpu: {profile: {cpus: 1, pools: [local]}}
  node-4gpu: {profile: {gpus: 4, cpus: 32, memory: 256G, walltime: 8h, pools: [local]}}
  half-gpu: {profile: {gpu_fraction: 0.5, walltime: 2h, pools: [local]}}
pools:
  local: {kind: host, slots: 4, gpus: 4}
apps: {max_running: 3, max_running_per_team: {vision: 1}}
routes:
  llama: {teams: [vision], apps: [vllm]}
"""


@pytest.fixture(scope="module")
def estate():
    return parse_estate(ESTATE, "estate.yaml")


@pytest.fixture(scope="module")
def apps(estate):
    return load_catalogue(estate)


def spec_of(apps, estate, name, resource, route="r-1", static=False, **params):
    form = LaunchForm(app=name, resource=resource, params=params)
    return app_spec(apps[name], form, estate, resource, route, static)


def test_the_built_in_catalogue_has_the_shipped_apps(apps):
    assert {n: a.kind for n, a in apps.items()} == {
        "jupyter": "session",
        "shell": "session",
        "vllm": "endpoint",
        "sglang": "endpoint",
        "http": "endpoint",
    }


def test_vllm_serves_the_model_with_tensor_parallelism_from_the_gpu_count(apps, estate):
    spec = spec_of(apps, estate, "vllm", "node-4gpu", model="meta-llama/Llama-3.1-8B-Instruct")
    assert list(spec.command) == [
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--host=127.0.0.1",
        "--port={port}",  # the runner's free port on the node
        "--tensor-parallel-size=4",
        "--dtype=auto",
        "--gpu-memory-utilization=0.9",
    ]
    assert spec.kind == "application" and spec.requirements == ("vllm",)
    assert spec.app["env"] == {"VLLM_API_KEY": "{secret}"}  # the runner's secret, in env only
    assert spec.app["upstream_headers"] == {"Authorization": "Bearer {secret}"}
    assert spec.app["ready_path"] == "/health" and spec.app["path"] == "strip"


def test_vllm_takes_a_registry_folder_and_its_options(apps, estate):
    spec = spec_of(
        apps,
        estate,
        "vllm",
        "half-gpu",
        model="/models/registry/llama/3",
        served_model_name="llama",
        max_model_len=8192,
        dtype="bfloat16",
    )
    assert list(spec.command) == [
        "vllm",
        "serve",
        "/models/registry/llama/3",
        "--host=127.0.0.1",
        "--port={port}",
        "--tensor-parallel-size=1",  # a fraction of a GPU is one GPU's worth
        "--served-model-name=llama",
        "--max-model-len=8192",
        "--dtype=bfloat16",
        "--gpu-memory-utilization=0.9",
    ]


def test_sglang_serves_the_model_with_tp_size_from_the_gpu_count(apps, estate):
    spec = spec_of(apps, estate, "sglang", "node-4gpu", model="Qwen/Qwen2.5-7B-Instruct")
    assert list(spec.command) == [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path=Qwen/Qwen2.5-7B-Instruct",
        "--host=127.0.0.1",
        "--port={port}",
        "--tp-size=4",
    ]
    assert spec.app["upstream_headers"] == {} and spec.app["ready_path"] == "/health"


@pytest.mark.parametrize("model", ["--trust-remote-code", "a/b/c", "x\ny", "", "../etc"])
def test_a_model_that_is_neither_a_name_nor_a_folder_is_refused(apps, estate, model):
    with pytest.raises(KliqueError, match="parameter model"):
        spec_of(apps, estate, "vllm", "node-4gpu", model=model)


def test_jupyter_serves_under_its_route_with_the_secret_in_env(apps, estate):
    spec = spec_of(apps, estate, "jupyter", "cpu", route="jupyter-0a1b2c3d", packages=["numpy"])
    assert "--ServerApp.base_url=/routes/jupyter-0a1b2c3d/" in spec.command
    assert "--ServerApp.port={port}" in spec.command
    assert not any("root_dir" in a for a in spec.command)  # unset: the job's folder
    assert not any("{secret}" in a for a in spec.command)
    assert spec.requirements == ("jupyterlab>=4,<5", "ipykernel", "numpy")
    assert spec.app["ready_path"] == "/routes/jupyter-0a1b2c3d/api"
    assert spec.app["path"] == "keep" and spec.app["kind"] == "session"


def test_the_http_app_runs_the_users_argv_as_it_is(apps, estate):
    argv = ["python3", "-m", "http.server", "--bind", "127.0.0.1", "{port}", "; rm -rf /"]
    spec = spec_of(apps, estate, "http", "cpu", command=argv, ready_path="/up")
    assert list(spec.command) == argv
    assert spec.app["ready_path"] == "/up"


def test_an_unknown_parameter_is_refused(apps, estate):
    with pytest.raises(KliqueError, match="Additional properties are not allowed"):
        spec_of(apps, estate, "jupyter", "cpu", surprise=1)


def test_the_walltime_is_the_resources_at_most(apps, estate):
    form = LaunchForm(app="http", params={"command": ["true"]}, walltime_s=10**9)
    spec = app_spec(apps["http"], form, estate, "half-gpu", "r", False)
    assert spec.app["walltime_s"] == 2 * 3600


def test_locks_and_quotas_refuse_with_the_rule_and_the_fix(apps, estate):
    lock = type("Lock", (), {"reason": "GPU maintenance until Monday"})()
    with pytest.raises(AppRefused) as locked:
        launch.check_lock(apps["vllm"], {"vllm": lock})
    assert str(locked.value) == (
        "app vllm is locked by the platform team (GPU maintenance until Monday); launch another "
        "app, or ask them to unlock it (`klique app unlock vllm`)"
    )
    with pytest.raises(AppRefused, match=r"company's quota of 3 running apps .*max_running"):
        launch.check_quota(estate, "nlp", ["nlp", "vision", None])
    with pytest.raises(AppRefused, match=r"team vision's quota of 1 .*max_running_per_team"):
        launch.check_quota(estate, "vision", ["vision"])
    launch.check_quota(estate, "nlp", ["vision"])  # room for nlp


def test_static_routes_admit_their_apps_launched_by_their_teams(apps, estate):
    route = estate.routes["llama"]
    assert route == StaticRoute("llama", ("vision",), ("vllm",))
    launch.check_route(apps["vllm"], route, "llama", "alice", "vision", admin=False)
    with pytest.raises(NotPermitted, match="served only by vllm"):
        launch.check_route(apps["sglang"], route, "llama", "alice", "vision", admin=False)
    with pytest.raises(NotPermitted, match="belongs to the teams vision"):
        launch.check_route(apps["vllm"], route, "llama", "bob", "nlp", admin=False)
    with pytest.raises(NotPermitted, match="only endpoints serve behind a static route"):
        launch.check_route(apps["jupyter"], route, "llama", "alice", "vision", admin=False)


def test_catalogue_errors_name_the_file_line_field_and_fix(tmp_path: Path):
    text = (
        "kind: session\n"
        "form:\n"
        "  type: object\n"
        "  properties: {n: {type: integer}}\n"
        "command:\n"
        "  - serve\n"
        "  - --port={prot}\n"
        "  - --key={secret}\n"
        "resources: [gpu-99]\n"
        "colour: blue\n"
    )
    with pytest.raises(EstateError) as err:
        parse_app(text, "apps/mine.yaml", {"cpu"})
    found = "\n".join(err.value.problems)
    assert "apps/mine.yaml:10: colour: Extra inputs are not permitted; fix: remove it" in found
    with pytest.raises(EstateError) as err:
        parse_app(text.replace("colour: blue\n", ""), "apps/mine.yaml", {"cpu"})
    found = "\n".join(err.value.problems)
    assert "apps/mine.yaml:7: command.1: {prot} is neither a form parameter" in found
    assert "apps/mine.yaml:8: command.2: {secret} may not be on the command line" in found
    assert "apps/mine.yaml:9: resources.0: compute resource 'gpu-99' is not in the estate" in found


def test_a_form_that_is_not_json_schema_is_refused_at_its_line():
    text = "kind: endpoint\nform:\n  type: object\n  properties:\n    n: {type: 7}\ncommand: [x]\n"
    with pytest.raises(EstateError) as err:
        parse_app(text, "apps/bad.yaml")
    assert err.value.problems[0].startswith("apps/bad.yaml:5: form.properties.n.type: not a valid")


def test_the_estate_names_its_own_catalogue_beside_it(tmp_path: Path):
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "notebook.yaml").write_text((BUILT_IN / "jupyter.yaml").read_text())
    estate_file = tmp_path / "estate.yaml"
    estate_file.write_text(ESTATE.replace("apps: {", "apps: {catalogue: apps, "))
    estate = load_estate(estate_file)
    assert list(load_catalogue(estate)) == ["notebook"]
    estate_file.write_text(ESTATE.replace("apps: {", "apps: {catalogue: nowhere, "))
    with pytest.raises(EstateError, match="catalogue folder does not exist"):
        load_estate(estate_file)


def test_the_estate_checks_the_teams_of_quotas_and_routes():
    bad = ESTATE.replace("{vision: 1}", "{vison: 1}").replace("teams: [vision]", "teams: [nlpp]")
    with pytest.raises(EstateError) as err:
        parse_estate(bad, "estate.yaml")
    assert err.value.problems == [
        "estate.yaml:9: apps.max_running_per_team.vison: team 'vison' is not declared; "
        "fix: add it under teams:",
        "estate.yaml:11: routes.llama.teams: team 'nlpp' is not declared; fix: add it under teams:",
    ]
