"""Which GPUs the task was granted: one variable map per scheduler, read in order of trust."""

from __future__ import annotations

# Variables each scheduler sets in the job that number the GPUs as CUDA sees them, most
# trustworthy first.
# - Slurm (sbatch(1)/srun(1) "OUTPUT ENVIRONMENT VARIABLES", gres.conf(5)): CUDA_VISIBLE_DEVICES
#   is set by the gres/gpu plugin, relative to the job's device cgroup (ConstrainDevices=yes in
#   cgroup.conf(5) renumbers the granted GPUs from 0). SLURM_STEP_GPUS (in a step) and
#   SLURM_JOB_GPUS (batch script) are the node's global ids: never CUDA's numbers, since inside
#   a device cgroup they name other GPUs or none. Without CUDA_VISIBLE_DEVICES (gres.conf
#   Flags=no_gpu_env) the runner leaves CUDA's numbering alone: the cgroup shows the grant.
# - PBS Professional / OpenPBS: the cgroups hook (Administrator's Guide, "Configuring and Using
#   PBS with Cgroups", devices subsystem) sets CUDA_VISIBLE_DEVICES for jobs that ask for ngpus.
#   Torque instead writes PBS_GPUFILE, one "<host>-gpu<N>" line per granted GPU
#   (Torque Administrator Guide, "Exported batch environment variables").
# - LSF (IBM Spectrum LSF 10.1, "NVIDIA GPU access enforcement"): "When LSF allocates GPUs for a
#   job, it sets the CUDA_VISIBLE_DEVICES environment variable".
SCHEDULER_GPU_VARIABLES: dict[str, tuple[str, ...]] = {
    "slurm": ("CUDA_VISIBLE_DEVICES",),
    "pbs": ("CUDA_VISIBLE_DEVICES", "PBS_GPUFILE"),
    "lsf": ("CUDA_VISIBLE_DEVICES",),
}
# The host's own device numbers, where a scheduler names them apart from CUDA_VISIBLE_DEVICES
# (which a device cgroup renumbers): what a runtime that picks devices by number must be given.
SCHEDULER_HOST_GPU_VARIABLES: dict[str, tuple[str, ...]] = {
    "slurm": ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"),
    "pbs": ("PBS_GPUFILE",),
}
# nvidia-container-toolkit's driver capabilities (NVIDIA_DRIVER_CAPABILITIES): "compute" brings
# libcuda, "utility" nvidia-smi and NVML. Unset, enroot's 98-nvidia.sh hook injects "utility" only.
DRIVER_CAPABILITIES = "compute,utility"

# Values Slurm writes when a GRES has no device files: not a list of devices.
_NOT_DEVICES = {"NoDevFiles", "none", "void"}


class Grant:
    """The granted GPUs: as the host numbers them, and as CUDA numbers them inside the job
    (the same unless a device cgroup renumbered them; None where the scheduler names only the
    host's numbers)."""

    def __init__(self, host: list[str], cuda: list[str] | None) -> None:
        self.host = host
        self.cuda = cuda

    def __repr__(self) -> str:
        return f"Grant(host={self.host!r}, cuda={self.cuda!r})"


def granted(
    scheduler: str, task_gpus: list[str] | None, environ: dict[str, str]
) -> list[str] | None:
    """The granted device ids as CUDA numbers them in the job; None when the scheduler does
    not say (leave the variables alone)."""
    found = grant(scheduler, task_gpus, environ)
    return None if found is None else found.cuda


def grant(scheduler: str, task_gpus: list[str] | None, environ: dict[str, str]) -> Grant | None:
    """The granted GPUs in both numberings; None when the scheduler says nothing."""
    if task_gpus is not None:
        return Grant(list(task_gpus), list(task_gpus))
    cuda = _first(SCHEDULER_GPU_VARIABLES.get(scheduler, ()), environ)
    host = _first(SCHEDULER_HOST_GPU_VARIABLES.get(scheduler, ()), environ)
    if cuda is None:
        return None if host is None else Grant(host, None)
    if host is None or len(host) != len(cuda):
        host = cuda
    return Grant(host, cuda)


def _first(names: tuple[str, ...], environ: dict[str, str]) -> list[str] | None:
    for name in names:
        value = environ.get(name)
        if value is None or value.strip() in _NOT_DEVICES:
            continue
        if name == "PBS_GPUFILE":
            return _read_gpufile(value)
        return parse_id_list(value)
    return None


def parse_id_list(value: str) -> list[str]:
    """'0,1' or '0-2,5' or 'GPU-uuid,MIG-uuid' -> ids; ranges only between plain integers."""
    ids: list[str] = []
    for part in value.split(","):
        part = part.strip()
        first, dash, last = part.partition("-")
        if dash and first.isdigit() and last.isdigit():
            ids.extend(str(i) for i in range(int(first), int(last) + 1))
        elif part:
            ids.append(part)
    return ids


def _read_gpufile(path: str) -> list[str]:
    ids: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split()
    except OSError:
        return ids
    for line in lines:
        _, sep, number = line.rpartition("-gpu")
        if sep and number.isdigit() and number not in ids:
            ids.append(number)
    return ids


def task_env(found: Grant | list[str] | None, runtime: str | None) -> dict[str, str]:
    """The variables that make the task see exactly its granted GPUs.

    - No container, or Pyxis (the runner already runs inside it, with the job's /dev and
      device cgroup): CUDA_VISIBLE_DEVICES as the scheduler numbers them; nothing when the
      scheduler gave no CUDA numbers (Slurm's global ids are never used as CUDA's).
    - Charliecloud, Apptainer, Singularity: the container shares the host's /dev (and the job's
      device cgroup), so CUDA numbers GPUs as in the job; NVIDIA_VISIBLE_DEVICES names the host's.
    - enroot: the runner sets ENROOT_RESTRICT_DEV, so /dev inside holds only the devices that
      NVIDIA_VISIBLE_DEVICES (host numbers) names, and CUDA numbers them from 0.
    A container task with no grant sees no GPU.
    """
    if isinstance(found, list):
        found = Grant(found, found)
    if runtime in (None, "pyxis"):
        if found is None or found.cuda is None:
            return {}
        return {"CUDA_VISIBLE_DEVICES": ",".join(found.cuda)}
    found = found or Grant([], [])
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(found.host) or "void",
        "NVIDIA_DRIVER_CAPABILITIES": DRIVER_CAPABILITIES,
    }
    if found.cuda is not None:  # else the container sees the job's cgroup, numbered by CUDA
        env["CUDA_VISIBLE_DEVICES"] = ",".join(found.cuda)
    if runtime == "enroot":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(found.host)))
    return env
