"""-l resource requests of PBS Professional (select/place) and Torque (nodes=...:ppn=...).

PBS Professional Reference Guide, pbs_resources(7B) and qsub(1B) "-l resource_list";
TORQUE Administrator Guide 6.1, "Requesting resources" (nodes, ppn, gpus, walltime, mem).
"""

from __future__ import annotations

import re

from .common import CommandError, format_duration, mb_ceil, parse_duration, parse_size

KNOWN = {
    "pbspro": {
        "select",
        "place",
        "walltime",
        "ncpus",
        "ngpus",
        "mem",
        "vmem",
        "cput",
        "pcput",
        "software",
        "host",
        "vnode",
        "arch",
        "mpiprocs",
        "ompthreads",
        "nodes",
        "file",
        "pmem",
        "pvmem",
        "soft_walltime",
        "naccelerators",
        "accelerator_model",
        "preempt_targets",
        "max_walltime",
        "min_walltime",
        "nodect",
    },
    "torque": {
        "nodes",
        "ppn",
        "procs",
        "walltime",
        "mem",
        "vmem",
        "pmem",
        "pvmem",
        "cput",
        "pcput",
        "ncpus",
        "gpus",
        "file",
        "host",
        "feature",
        "naccesspolicy",
        "epilogue",
        "prologue",
        "qos",
        "tpn",
        "trl",
        "other",
        "software",
        "nice",
        "opsys",
        "arch",
        "gres",
    },
}


def split_list(text: str) -> list[tuple[str, str]]:
    """'a=1,b=2' into pairs; a select statement keeps its ':' and '+' inside one value."""
    pairs = []
    for item in _commas(text):
        name, _, value = item.partition("=")
        pairs.append((name.strip(), value.strip()))
    return pairs


def _commas(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    if current:
        items.append(current)
    return [i for i in items if i.strip()]


def _bad_value(flavor: str, name: str) -> CommandError:
    if flavor == "torque":
        return CommandError(
            f"qsub: submit error (Illegal attribute or resource value for  "
            f"MSG=Invalid value for {name})",
            168,
        )
    return CommandError(f"qsub: Illegal attribute or resource value Resource_List.{name}", 166)


def merge(flavor: str, requests: list[str]) -> dict:
    """All -l lists in order (directives first, command line last); later names win."""
    merged: dict[str, str] = {}
    for text in requests:
        for name, value in split_list(text):
            if name not in KNOWN[flavor]:
                if flavor == "torque":
                    raise CommandError(
                        f"qsub: submit error (Unknown resource type  MSG=Unknown resource "
                        f"type {name})",
                        189,
                    )
                raise CommandError(f"qsub: Unknown resource Resource_List.{name}", 187)
            merged[name] = value
    return merged


def _chunk_totals(flavor: str, select: str) -> dict:
    totals = {"ncpus": 0, "ngpus": 0, "mem_mb": 0, "mpiprocs": 0, "nodect": 0, "mem": False}
    for chunk in select.split("+"):
        parts = chunk.split(":")
        count = 1
        if parts and re.fullmatch(r"\d+", parts[0]):
            count = int(parts.pop(0))
        fields = dict(p.partition("=")[::2] for p in parts if p)
        try:
            ncpus = int(fields.get("ncpus", 1))
            ngpus = int(fields.get("ngpus", 0))
            mem = mb_ceil(parse_size(fields["mem"])) if "mem" in fields else 0
            mpiprocs = int(fields.get("mpiprocs", 1))
        except ValueError as exc:
            raise _bad_value(flavor, "select") from exc
        totals["ncpus"] += count * ncpus
        totals["ngpus"] += count * ngpus
        totals["mem_mb"] += count * mem
        totals["mem"] = totals["mem"] or "mem" in fields
        totals["mpiprocs"] += count * mpiprocs
        totals["nodect"] += count
    return totals


def _size_text(mb: int) -> str:
    return f"{mb // 1024}gb" if mb % 1024 == 0 else f"{mb}mb"


def pbspro_request(resources: dict) -> dict:
    """Totals and the Resource_List PBS Pro shows for a job."""
    if "select" not in resources:
        chunk = [f"ncpus={resources.get('ncpus', '1')}"]
        if "ngpus" in resources:
            chunk.append(f"ngpus={resources['ngpus']}")
        if "mem" in resources:
            chunk.append(f"mem={resources['mem']}")
        resources = {**resources, "select": "1:" + ":".join(chunk)}
    totals = _chunk_totals("pbspro", resources["select"])
    listing: dict = {
        "ncpus": totals["ncpus"],
        "nodect": totals["nodect"],
        "place": resources.get("place", "pack" if totals["nodect"] == 1 else "free"),
        "select": resources["select"],
    }
    if totals["ngpus"]:
        listing["ngpus"] = totals["ngpus"]
    if totals["mem"]:
        listing["mem"] = _size_text(totals["mem_mb"])
    walltime = _walltime("pbspro", resources)
    if walltime is not None:
        listing["walltime"] = format_duration(walltime)
    for name, value in resources.items():
        if name not in {"select", "place", "walltime", "ncpus", "ngpus", "mem", "nodes"}:
            listing[name] = int(value) if value.isdigit() else value
    return {
        "ncpus": totals["ncpus"],
        "ngpus": totals["ngpus"],
        "mem_mb": totals["mem_mb"] or None,
        "walltime": walltime,
        "mpiprocs": max(1, totals["mpiprocs"]),
        "resource_list": dict(sorted(listing.items())),
    }


def _walltime(flavor: str, resources: dict) -> int | None:
    if "walltime" not in resources:
        return None
    try:
        return parse_duration(resources["walltime"])
    except ValueError as exc:
        raise _bad_value(flavor, "walltime") from exc


def torque_request(resources: dict) -> dict:
    """Totals and Resource_List for Torque's nodes=N[:ppn=C][:gpus=G] style requests."""
    nodes_spec = resources.get("nodes", "1")
    parts = nodes_spec.split(":")
    try:
        nodes = int(parts[0]) if parts[0].isdigit() else 1
        fields = dict(p.partition("=")[::2] for p in parts[1:] if "=" in p)
        ppn = int(fields.get("ppn", resources.get("ppn", 1)))
        gpus = int(fields.get("gpus", resources.get("gpus", 0)))
        if "procs" in resources and "nodes" not in resources:
            nodes, ppn = 1, int(resources["procs"])
        mem_mb = mb_ceil(parse_size(resources["mem"])) if "mem" in resources else None
    except ValueError as exc:
        raise _bad_value("torque", "nodes") from exc
    listing: dict = {"nodect": nodes, "nodes": nodes_spec, "neednodes": nodes_spec}
    walltime = _walltime("torque", resources)
    if walltime is not None:
        listing["walltime"] = format_duration(walltime)
    for name, value in resources.items():
        if name not in {"nodes", "walltime"}:
            listing[name] = value
    return {
        "ncpus": nodes * ppn,
        "ngpus": nodes * gpus,
        "mem_mb": mem_mb,
        "walltime": walltime,
        "nodes": nodes,
        "ppn": ppn,
        "resource_list": dict(sorted(listing.items())),
    }


def hosts_wanted(flavor: str, resources: dict, request: dict) -> int:
    """How many execution hosts a job takes. PBS Professional, pbs_resources(7B) "place":
    scatter (and vscatter) put each chunk on a host of its own; pack and free (the defaults)
    may put every chunk on one host, which the simulator does. Torque: nodes=N is N hosts."""
    if flavor == "torque":
        return int(request.get("nodes", 1))
    arrangement = str(resources.get("place", "")).split(":")[0]
    if arrangement in ("scatter", "vscatter"):
        return int(request["resource_list"]["nodect"])
    return 1
