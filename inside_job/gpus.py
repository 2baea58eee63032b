"""Which GPUs the task was granted: one variable map per scheduler, read in order of trust."""

from __future__ import annotations

# Variables each scheduler sets in the job, most trustworthy first.
# - Slurm (sbatch(1)/srun(1) "OUTPUT ENVIRONMENT VARIABLES"): CUDA_VISIBLE_DEVICES is set by the
#   gres/gpu plugin and is already relative to the job's device cgroup; SLURM_STEP_GPUS (in a
#   step) and SLURM_JOB_GPUS (batch script) are the global ids, used when it is absent.
# - PBS Professional / OpenPBS: the cgroups hook (Administrator's Guide, "Configuring and Using
#   PBS with Cgroups", devices subsystem) sets CUDA_VISIBLE_DEVICES for jobs that ask for ngpus.
#   Torque instead writes PBS_GPUFILE, one "<host>-gpu<N>" line per granted GPU
#   (Torque Administrator Guide, "Exported batch environment variables").
# - LSF (IBM Spectrum LSF 10.1, "NVIDIA GPU access enforcement"): "When LSF allocates GPUs for a
#   job, it sets the CUDA_VISIBLE_DEVICES environment variable".
SCHEDULER_GPU_VARIABLES: dict[str, tuple[str, ...]] = {
    "slurm": ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"),
    "pbs": ("CUDA_VISIBLE_DEVICES", "PBS_GPUFILE"),
    "lsf": ("CUDA_VISIBLE_DEVICES",),
}

# Values Slurm writes when a GRES has no device files: not a list of devices.
_NOT_DEVICES = {"NoDevFiles", "none", "void"}


def granted(
    scheduler: str, task_gpus: list[str] | None, environ: dict[str, str]
) -> list[str] | None:
    """The granted device ids; None when the scheduler says nothing (leave the variables alone)."""
    if task_gpus is not None:
        return list(task_gpus)
    for name in SCHEDULER_GPU_VARIABLES.get(scheduler, ()):
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


def task_env(ids: list[str] | None, runtime: str | None) -> dict[str, str]:
    """The variables that make the task see exactly its granted GPUs (none set when ids is None).

    enroot injects only the devices named in NVIDIA_VISIBLE_DEVICES, so inside it the granted
    GPUs are renumbered from 0; the other runtimes show the host's devices under their host ids.
    """
    if ids is None:
        return {}
    joined = ",".join(ids)
    env = {"CUDA_VISIBLE_DEVICES": joined}
    if runtime is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = joined or "none"
    if runtime == "enroot":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(ids)))
    return env
