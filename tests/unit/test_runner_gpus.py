"""The per-scheduler GPU variable map and the variables a task is given."""

from __future__ import annotations

from inside_job.gpus import grant, granted, parse_id_list, task_env


def test_the_host_pools_assignment_wins_over_the_environment():
    assert granted("host", ["0", "2"], {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == ["0", "2"]
    assert granted("slurm", [], {"SLURM_JOB_GPUS": "1"}) == []


def test_slurm_numbers_cudas_gpus_by_cuda_visible_devices_alone():
    # SLURM_STEP_GPUS and SLURM_JOB_GPUS are the node's global ids (sbatch(1)): inside a device
    # cgroup CUDA numbers the granted GPUs from 0, so they never become CUDA's numbers.
    env = {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "5", "SLURM_JOB_GPUS": "5,6"}
    assert granted("slurm", None, env) == ["0"]
    del env["CUDA_VISIBLE_DEVICES"]
    assert granted("slurm", None, env) is None  # left alone: the cgroup shows the grant
    found = grant("slurm", None, env)
    assert (found.host, found.cuda) == (["5"], None)  # a step's own GPUs first
    assert task_env(found, None) == {}
    del env["SLURM_STEP_GPUS"]
    assert grant("slurm", None, env).host == ["5", "6"]


def test_slurms_nodevfiles_is_not_a_device_list():
    env = {"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_JOB_GPUS": "3"}
    assert granted("slurm", None, env) is None
    assert grant("slurm", None, env).host == ["3"]


def test_a_container_runtime_gets_slurms_global_ids_but_no_cuda_numbers_from_them():
    found = grant("slurm", None, {"SLURM_JOB_GPUS": "2,3"})
    assert task_env(found, "apptainer") == {
        "NVIDIA_VISIBLE_DEVICES": "2,3",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    assert task_env(found, "enroot")["CUDA_VISIBLE_DEVICES"] == "0,1"  # /dev holds only those


def test_pbs_and_lsf_read_cuda_visible_devices():
    assert granted("pbs", None, {"CUDA_VISIBLE_DEVICES": "1,2"}) == ["1", "2"]
    assert granted("lsf", None, {"CUDA_VISIBLE_DEVICES": "3"}) == ["3"]


def test_torques_gpufile_lists_host_gpu_lines(tmp_path):
    gpufile = tmp_path / "gpus"
    gpufile.write_text("node7-gpu1\nnode7-gpu3\n")
    assert granted("pbs", None, {"PBS_GPUFILE": str(gpufile)}) == ["1", "3"]


def test_a_scheduler_that_says_nothing_leaves_the_variables_alone():
    assert granted("slurm", None, {}) is None
    assert granted("host", None, {"CUDA_VISIBLE_DEVICES": "0"}) is None
    assert task_env(None, None) == {}


def test_id_lists_expand_ranges_and_keep_uuids():
    assert parse_id_list("0-2,5") == ["0", "1", "2", "5"]
    assert parse_id_list("GPU-8f3e-11,MIG-aa") == ["GPU-8f3e-11", "MIG-aa"]
    assert parse_id_list("") == []


def test_task_variables_per_runtime():
    assert task_env(["1", "3"], None) == {"CUDA_VISIBLE_DEVICES": "1,3"}
    caps = {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    assert task_env(["1", "3"], "charliecloud") == {
        "CUDA_VISIBLE_DEVICES": "1,3",
        "NVIDIA_VISIBLE_DEVICES": "1,3",
        **caps,
    }
    # enroot restricts /dev to the grant: CUDA numbers the two it sees from 0
    assert task_env(["1", "3"], "enroot") == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NVIDIA_VISIBLE_DEVICES": "1,3",
        **caps,
    }
    assert task_env([], "apptainer") == {
        "CUDA_VISIBLE_DEVICES": "",
        "NVIDIA_VISIBLE_DEVICES": "void",
        **caps,
    }
    assert task_env(None, "enroot")["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_device_cgroup_renumbers_cuda_but_runtimes_get_the_hosts_numbers():
    # Slurm with ConstrainDevices: CUDA_VISIBLE_DEVICES is relative, SLURM_JOB_GPUS global.
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "2,3"}
    found = grant("slurm", None, env)
    assert (found.host, found.cuda) == (["2", "3"], ["0", "1"])
    assert task_env(found, "apptainer")["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert task_env(found, "enroot")["NVIDIA_VISIBLE_DEVICES"] == "2,3"
    assert task_env(found, "pyxis") == {"CUDA_VISIBLE_DEVICES": "0,1"}
