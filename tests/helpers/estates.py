"""Estates for tests, written as small Python values: the text of an estate file (for a server
or the CLI to load) and the `Estate` it loads to (for the pure code), or an `Estate` put
together from domain values (for placement alone). A test states only the sections it is
about; one builder, so that every test's estate goes through the same parser."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from broker.domain import ComputeResource, Estate, Policy, Pool
from broker.estate import parse_estate

# The order an estate file is usually written in (examples/, README); sections not named here
# follow, in the order given.
SECTIONS = (
    "defaults",
    "server",
    "identity",
    "teams",
    "resources",
    "pools",
    "policies",
    "apps",
    "routes",
)


def profile(*pools: str, **allocation: Any) -> dict[str, Any]:
    """A compute resource's entry: a profile of this allocation on `pools`, in order."""
    return {"profile": {**allocation, "pools": list(pools)}}


def estate_yaml(**sections: Any) -> str:
    """The text of an estate file with these sections, each as the file writes it (a mapping,
    or a single value); a section given as None is left out."""
    given = {name: value for name, value in sections.items() if value is not None}
    ordered = sorted(given, key=lambda name: SECTIONS.index(name) if name in SECTIONS else 99)
    document = {name: _plain(given[name]) for name in ordered}
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1000)


def estate(source: str = "estate.yaml", **sections: Any) -> Estate:
    """The estate that an estate file with these sections loads to (errors name `source`)."""
    return parse_estate(estate_yaml(**sections), source)


def batch_estate(kind: str, **settings: Any) -> Estate:
    """One batch pool `p` of `kind` (job root /jobs, looked at every second, lost after one)
    for alice and bob, with more `settings`; one compute resource `r` of a CPU for 5 s on it:
    the estate of the tests that script a scheduler's answers."""
    pool = {
        "kind": kind,
        "job_root": "/jobs",
        "poll_interval": "1s",
        "lost_after": "1s",
        "user_map": {"alice": "alice", "bob": "bob"},
        **settings,
    }
    return estate(
        "<estate>", resources={"r": profile("p", cpus=1, walltime="5s")}, pools={"p": pool}
    )


def estate_of(
    pools: Iterable[Pool], resources: Iterable[ComputeResource], policies: Iterable[Policy] = ()
) -> Estate:
    """An estate put together from domain values, as placement reads it: no file, no teams."""
    return Estate(
        resources={r.name: r for r in resources},
        pools={p.name: p for p in pools},
        policies={p.team: p for p in policies},
        teams={},
    )


def _plain(value: Any) -> Any:
    """Mappings and sequences as the dicts and lists that yaml.safe_dump writes (a test may
    give a tuple, or a read-only mapping of a module's constants)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
