from pathlib import Path

import pytest

from broker.errors import EstateError
from broker.estate import builtin_estate, load_estate, parse_estate
from broker.units import parse_duration_s, parse_size_mb

ROOT = Path(__file__).resolve().parents[2]


def problems(text: str) -> list[str]:
    with pytest.raises(EstateError) as err:
        parse_estate(text, "estate.yaml")
    return err.value.problems


def test_the_shipped_example_is_valid_and_means_what_it_says():
    estate = load_estate(ROOT / "examples" / "estate.yaml")
    gpu = estate.resources["1-gpu"].profile
    assert gpu.gpus == 1 and gpu.memory_mb == 16 * 1024 and gpu.walltime_s == 4 * 3600
    assert gpu.pools == ("slurm-a", "local")
    assert estate.resources["half-gpu"].profile.gpu_share == 0.5
    assert estate.resources["gpu-24g"].profile.gpu_memory_mb == 24 * 1024
    slurm = estate.pools["slurm-a"]
    assert slurm.kind == "slurm" and slurm.queueing and slurm.max_wait_s == 1800
    assert slurm.user_map.account_for("alice") == "alice"
    assert slurm.user_map.account_for("mallory") is None
    assert estate.team_of("bob") == "nlp"
    assert estate.permitted("vision", "half-gpu") and not estate.permitted("nlp", "half-gpu")


def test_errors_name_file_line_field_and_fix():
    found = problems(
        "resources:\n"
        "  1-gpu:\n"
        "    profile:\n"
        "      gpus: two\n"
        "      memory: lots\n"
        "      pools: [local]\n"
        "      colour: red\n"
        "pools:\n"
        "  local:\n"
        "    kind: hots\n"
    )
    assert any(
        p.startswith("estate.yaml:4: resources.1-gpu.profile.gpus:") and "fix:" in p for p in found
    ), found
    assert any(p.startswith("estate.yaml:5: resources.1-gpu.profile.memory:") for p in found)
    assert any(
        p.startswith("estate.yaml:7: resources.1-gpu.profile.colour:") and "remove" in p
        for p in found
    )
    assert any(
        p.startswith("estate.yaml:10: pools.local.kind: unknown pool kind 'hots'")
        and "host, kubernetes, lsf, pbs, slurm" in p
        for p in found
    ), found


def test_a_setting_of_another_pool_kind_is_an_error_at_its_line():
    found = problems(
        "resources:\n"
        "  cpu:\n"
        "    profile: {pools: [pbs, lsf, lsf2]}\n"
        "pools:\n"
        "  pbs:\n"
        "    kind: pbs\n"
        "    job_root: /scratch\n"
        "    partition: gpu\n"
        "  lsf: {kind: lsf, job_root: /scratch, dialect: torque}\n"
        "  lsf2: {kind: lsf, job_root: /scratch, container_runtime: pyxis}\n"
    )
    assert any(p.startswith("estate.yaml:8: pools.pbs.partition:") for p in found), found
    assert any(p.startswith("estate.yaml:9: pools.lsf.dialect:") for p in found), found
    assert any("pools.lsf2: pyxis is a Slurm plugin" in p for p in found), found


def test_unknown_pool_and_resource_references_point_at_their_line():
    found = problems(
        "resources:\n"
        "  cpu:\n"
        "    profile: {pools: [local, nowhere]}\n"
        "pools:\n"
        "  local: {kind: host}\n"
        "policies:\n"
        "  vision:\n"
        "    resources: [cpu, gpu]\n"
    )
    assert any(
        p.startswith("estate.yaml:3: resources.cpu.profile.pools.1:")
        and "'nowhere'" in p
        and "local" in p
        for p in found
    ), found
    assert any(p.startswith("estate.yaml:8: policies.vision.resources.1:") for p in found), found


def test_invalid_yaml_names_the_line():
    found = problems("resources:\n  cpu: [\n pools: {")
    assert found[0].startswith("estate.yaml:") and "not valid YAML" in found[0]


def test_batch_pools_need_a_job_root_and_ssh_needs_known_hosts():
    found = problems(
        "resources:\n  cpu:\n    profile: {pools: [s]}\n"
        "pools:\n  s:\n    kind: slurm\n    transport: {kind: ssh, host: login1}\n"
    )
    assert any("pools.s:" in p and "job_root" in p for p in found), found
    assert any("pools.s.transport:" in p and "known_hosts" in p for p in found), found


def test_a_reservation_above_its_limit_is_an_estate_error():
    found = problems(
        "resources:\n  cpu:\n    profile: {pools: [local]}\n"
        "pools:\n  local: {kind: host, slots: 8}\n"
        "policies:\n  vision:\n    resources: [cpu]\n"
        "    reservation: {cpu: 4}\n    limit: {cpu: 2}\n"
    )
    assert any(p.startswith("estate.yaml:9: policies.vision.reservation.cpu:") for p in found), (
        found
    )


def test_one_way_of_sizing_gpus():
    found = problems(
        "resources:\n  g:\n    profile: {gpus: 1, gpu_fraction: 0.5, pools: [local]}\n"
        "pools:\n  local: {kind: host}\n"
    )
    assert any("resources.g.profile:" in p and "more than one" in p for p in found), found


def test_sizes_and_durations():
    assert (
        parse_size_mb("16G") == 16384 and parse_size_mb("512M") == 512 and parse_size_mb(64) == 64
    )
    assert parse_duration_s("4h") == 14400 and parse_duration_s("01:30:00") == 5400
    assert parse_duration_s("10:00") == 600  # MM:SS, as Slurm reads --time
    with pytest.raises(ValueError):
        parse_size_mb("lots")


def test_the_builtin_estate_is_one_host_pool():
    estate = builtin_estate(slots=3)
    assert list(estate.pools) == ["local"] and estate.pools["local"].slots == 3
    assert estate.default_resource == "cpu"
