"""Tasks on several nodes, on plain data: the scripts each scheduler is given, where the
runners find their rank, how the ranks' endings make the task's, and how placement counts
nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import estates
from helpers.estates import estate_of, profile
from test_placement import cycle, host, queued, resource, slurm

from broker.domain import Pool
from broker.errors import EstateError
from broker.estate import load_estate
from broker.execution import PoolState
from broker.pools.base import Context
from broker.pools.lsf import LsfDriver
from broker.pools.pbs import PbsDriver
from broker.pools.slurm import SlurmDriver, parse_sinfo
from broker.preview import sample_task
from inside_job import gather, jobfiles, ranks
from inside_job.errors import SetupFailed

KINDS = {"slurm": SlurmDriver, "pbs": PbsDriver, "lsf": LsfDriver}


def driver(
    kind: str,
    allocation: Mapping[str, Any],
    settings: Mapping[str, Any] | None = None,
    **sections: Any,
):
    """A pool `p` of `kind` with more `settings`, and a compute resource `r` of `allocation`
    on it; other sections of the estate as `sections`."""
    pool = {"kind": kind, "job_root": "/scratch/klique", "user_map": {"alice": "alice"}}
    the_estate = estates.estate(
        "<estate>",
        resources={"r": profile("p", **allocation)},
        pools={"p": {**pool, **(settings or {})}},
        **sections,
    )
    context = Context(the_estate, Path("."), Path("klique-runner.pyz"), None)
    return KINDS[kind](the_estate.pools["p"], context), sample_task(the_estate, "r")


def lines(script: str, prefix: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith(prefix)]


TWO_NODES = {"nodes": 2, "gpus": 4, "cpus": 8, "memory": "1G", "walltime": "1h"}


def test_slurm_asks_for_the_nodes_and_starts_one_runner_on_each_with_srun():
    pool, task = driver("slurm", TWO_NODES)
    script = pool.render(task)
    directives = lines(script, "#SBATCH")
    assert "#SBATCH --nodes=2" in directives and "#SBATCH --ntasks-per-node=1" in directives
    assert "#SBATCH --gres=gpu:4" in directives  # per node
    assert "#SBATCH --cpus-per-task=8" in directives and "#SBATCH --mem=1024M" in directives
    runner = "/scratch/klique/klique-0/klique-runner.pyz"
    assert (
        "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=8 --kill-on-bad-exit=1 "
        f"python3 -I -S {runner} --node /scratch/klique/klique-0" in script
    )
    gather = f"exec python3 -I -S {runner} --gather /scratch/klique/klique-0"
    assert script.rstrip().endswith(gather)


def test_slurm_job_wide_gpus_count_every_node_and_the_checkpoint_signal_reaches_the_runners():
    pool, task = driver("slurm", TWO_NODES, {"gpu_flag": "gpus"})
    assert "#SBATCH --gpus=8" in lines(pool.render(task), "#SBATCH")
    signal = {"checkpoint_signal": {"signal": "USR1", "before": "2m"}}
    signalled = estates.estate(
        "<estate>",
        resources={"r": {**profile("p", nodes=2, walltime="1h"), **signal}},
        pools={"p": {"kind": "slurm", "job_root": "/j", "user_map": {"alice": "alice"}}},
    )
    context = Context(signalled, Path("."), Path("klique-runner.pyz"), None)
    pool = SlurmDriver(signalled.pools["p"], context)
    # Not B: (the batch shell, which waits for srun): every step, where the runners are.
    assert "#SBATCH --signal=USR1@120" in lines(pool.render(sample_task(signalled, "r")), "#SBATCH")


def test_one_node_keeps_the_single_runner_script():
    pool, task = driver("slurm", {"gpus": 1, "cpus": 2, "memory": "1G", "walltime": "1h"})
    script = pool.render(task)
    assert "--node" not in script and "srun" not in script and "--nodes" not in script
    assert script.rstrip().endswith(
        "exec python3 -I -S /scratch/klique/klique-0/klique-runner.pyz /scratch/klique/klique-0"
    )


def test_pbs_professional_scatters_chunks_and_starts_runners_with_pbsdsh():
    pool, task = driver("pbs", TWO_NODES)
    script = pool.render(task)
    assert "#PBS -l select=2:ncpus=8:ngpus=4:mem=1024mb" in lines(script, "#PBS")
    assert "#PBS -l place=scatter" in lines(script, "#PBS")
    assert "pbsdsh -- python3 -I -S /scratch/klique/klique-0/klique-runner.pyz --node" in script


def test_torque_asks_for_nodes_and_starts_one_runner_a_host():
    pool, task = driver("pbs", TWO_NODES, {"dialect": "torque"})
    script = pool.render(task)
    assert "#PBS -l nodes=2:ppn=8:gpus=4" in lines(script, "#PBS")
    assert "pbsdsh -u -- python3" in script


def test_lsf_puts_each_nodes_slots_on_a_host_and_starts_runners_with_blaunch():
    pool, task = driver("lsf", TWO_NODES)
    script = pool.render(task)
    assert "#BSUB -n 16" in lines(script, "#BSUB")
    assert '#BSUB -R "span[ptile=8]"' in lines(script, "#BSUB")
    assert '#BSUB -gpu "num=4"' in lines(script, "#BSUB")
    assert 'blaunch -z "$(printf' in script and "--node" in script


def test_an_estate_refuses_zero_nodes():
    with pytest.raises(EstateError, match="nodes"):
        driver("slurm", {"nodes": 0})


# -- ranks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[08-10,12],login", ["gpu08", "gpu09", "gpu10", "gpu12", "login"]),
        ("a1,b2", ["a1", "b2"]),
    ],
)
def test_slurm_hostlists_expand(text, names):
    assert ranks.expand_hostlist(text) == names


def test_slurm_ranks_come_from_srun():
    place = ranks.find(
        {
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "2",
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_JOB_ID": "4242",
            "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.1",
        }
    )
    assert place.env() == {
        "RANK": "1",
        "NODE_RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": str(20000 + 4242),
        "KLIQUE_NODES": "n1,n2",
    }


def test_pbs_and_lsf_ranks_come_from_their_launchers(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("cn1\ncn2\n")
    pbs = ranks.find({"PBS_NODENUM": "1", "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "17.srv"})
    assert (pbs.rank, pbs.world, pbs.master, pbs.nodes) == (1, 2, "cn1", ["cn1", "cn2"])
    assert ranks.master_port("17.srv") == 20017
    lsf = ranks.find({"LSF_PM_TASKID": "2", "LSB_MCPU_HOSTS": "h1 8 h2 8", "LSB_JOBID": "9"})
    assert (lsf.rank, lsf.world, lsf.master, lsf.nodes) == (1, 2, "h1", ["h1", "h2"])


def test_a_runner_outside_a_launcher_has_no_rank():
    with pytest.raises(SetupFailed, match="srun, pbsdsh or blaunch"):
        ranks.find({})


def test_master_ports_are_unprivileged_and_below_the_ephemeral_range():
    for job_id in ("0", "9999", "123456789", "abc"):
        assert 20000 <= ranks.master_port(job_id) < 30000


# -- the task's ending -----------------------------------------------------------------------


def ended(outcome: str, code: int, reason: str) -> dict:
    return {"outcome": outcome, "exit_code": code, "reason": reason, "signal": None}


def test_all_ranks_completed_is_a_completed_task():
    done = gather.combine([ended("completed", 0, "ok"), ended("completed", 0, "ok")])
    assert (done["outcome"], done["exit_code"]) == ("completed", 0)


def test_the_rank_that_failed_by_itself_names_the_tasks_ending():
    stopped = ended("signalled", 143, "terminated by SIGTERM")
    done = gather.combine([stopped, ended("failed", 3, "exited with code 3")])
    assert (done["outcome"], done["exit_code"]) == ("failed", 3)
    assert done["reason"] == "rank 1: exited with code 3"
    assert [r["outcome"] for r in done["ranks"]] == ["signalled", "failed"]


def test_a_rank_without_an_exit_file_fails_the_task(tmp_path):
    jobfiles.write_exit(str(tmp_path), ended("completed", 0, "ok"), jobfiles.rank_exit_file(0))
    (tmp_path / "task.json").write_text(json.dumps({"id": 5, "command": ["x"], "nodes": 2}))
    assert gather.gather(str(tmp_path)) == 125
    done = json.loads((tmp_path / "exit.json").read_text())
    assert done["outcome"] == "failed" and done["reason"].startswith("rank 1 wrote no exit file")
    assert "the task ended: rank 1" in (tmp_path / "console.log").read_text()


# -- placement -------------------------------------------------------------------------------


def test_a_task_on_several_nodes_waits_for_idle_nodes_and_never_goes_to_a_host_pool():
    pods = Pool("pods", "kubernetes", queueing=True)  # a queue, but a pod is on one node
    the_estate = estate_of(
        [host("box"), pods, slurm("hpc", max_queued=0)],
        [resource("pair", "box", "pods", "hpc", gpus=1, nodes=2)],
    )
    out = cycle(
        the_estate,
        [queued(1, "pair")],
        hpc=PoolState("hpc", free_gpus=8, free_cpus=64, free_nodes=1),
    )
    assert out.pending[1].pools == {
        "box": "runs a task on one node, the task needs 2 (only batch pools span nodes)",
        "pods": "runs a task on one node, the task needs 2 (only batch pools span nodes)",
        "hpc": "needs 2 nodes, 1 idle; at max_queued (0)",
    }
    out = cycle(
        the_estate,
        [queued(1, "pair")],
        hpc=PoolState("hpc", free_gpus=8, free_cpus=64, free_nodes=2),
    )
    assert [(d.task_id, d.pool) for d in out.placements] == [(1, "hpc")]


def test_the_ledger_meters_every_nodes_gpus():
    assert resource("pair", "hpc", gpus=4, nodes=2).profile.gpu_share == 8


def test_sinfo_counts_each_nodes_gpus_and_the_idle_nodes():
    # Two idle nodes share every field, so sinfo prints them on one line.
    capacity = parse_sinfo(
        "0/32/0/32|gpu:4|gpu:0|0/2/0/2|\n16/0/0/16|gpu:4|gpu:4(IDX:0-3)|1/0/0/1|\n"
    )
    assert (capacity.free_gpus, capacity.free_cpus, capacity.free_nodes) == (8.0, 32, 2)


# -- the example site template ----------------------------------------------------------------


@pytest.mark.parametrize("resource_name", ["8-gpu-node", "2-nodes"])
def test_the_example_site_estate_renders_its_own_template(resource_name):
    root = Path(__file__).resolve().parents[2]
    site = load_estate(root / "examples/site/estate.yaml")
    site = replace(site, templates_dir=str(root / "examples/site/templates"))
    context = Context(site, Path("."), Path("klique-runner.pyz"), None)
    pool = SlurmDriver(site.pools["cluster"], context)
    assert pool.template(resource_name).path.is_relative_to(root / "examples/site/templates")
    script = pool.render(sample_task(site, resource_name, "alice"))
    for line in (
        "#SBATCH --account=ml-research",
        "#SBATCH --qos=normal",
        "#SBATCH --constraint=a100",
        "#SBATCH --exclusive",
        "#SBATCH --mail-type=FAIL",
        "#SBATCH --mail-user=alice@example.org",
    ):
        assert line in script.splitlines(), script
    assert "  module purge" in script and "export NCCL_SOCKET_IFNAME" in script
    single = resource_name == "8-gpu-node"
    assert ("#SBATCH --signal=B:USR1@120" in script) is single
    assert ("mktemp -d" in script) is single and ("--gather" in script) is not single
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_a_mail_domain_is_a_domain():
    with pytest.raises(EstateError, match="mail_domain: 'a;b' is not a mail domain; fix"):
        driver("slurm", {"cpus": 1}, mail_domain="a;b")


def test_a_runner_started_alone_for_a_task_on_several_nodes_refuses_it(tmp_path):
    (tmp_path / "task.json").write_text(json.dumps({"id": 5, "command": ["true"], "nodes": 2}))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "inside_job", str(tmp_path)],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        check=False,
    )
    assert done.returncode == 125
    ended = json.loads((tmp_path / "exit.json").read_text())
    assert ended["outcome"] == "setup_failed" and "started alone" in ended["reason"], ended
