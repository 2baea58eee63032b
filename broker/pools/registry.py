"""The pool kinds: each is one module of this package that declares `POOL_KIND`, a
PoolKindSpec naming its settings model and its driver. Adding a kind is that module, its
templates and its tests; the estate, the server and `klique agent` find it here."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

import broker.pools
from broker.domain import Pool
from broker.pools.base import Context, PoolDriver
from broker.pools.settings import PoolSettings


@dataclass(frozen=True)
class PoolKindSpec:
    name: str  # the estate's `kind:`
    settings: type[PoolSettings]  # its model, with `kind: Literal[name]`
    # "module:name" of the driver's class, or of a function that chooses one by the pool's
    # settings; imported when a pool of this kind starts.
    driver: str
    queueing: bool  # a scheduler queue of its own (batch), rather than fixed slots
    summary: str  # one line for errors and docs
    spans_nodes: bool = False  # one task may hold several nodes (batch schedulers)

    def driver_factory(self) -> Callable[[Pool, Context], PoolDriver]:
        module, _, name = self.driver.partition(":")
        factory: Callable[[Pool, Context], PoolDriver] = getattr(
            importlib.import_module(module), name
        )
        return factory


@functools.cache
def kinds() -> dict[str, PoolKindSpec]:
    """Every pool kind, by name: the modules of broker.pools that declare POOL_KIND."""
    package = broker.pools
    found: dict[str, PoolKindSpec] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        spec = getattr(module, "POOL_KIND", None)
        if isinstance(spec, PoolKindSpec):
            found[spec.name] = spec
    return found


def kind(name: str) -> PoolKindSpec:
    try:
        return kinds()[name]
    except KeyError:
        known = ", ".join(sorted(kinds()))
        raise KeyError(f"unknown pool kind {name!r}; known kinds: {known}") from None


def settings_for(kind_name: str, **fields: object) -> PoolSettings:
    """A pool's settings model of this kind, validated as the estate would (tests build pools
    by hand with it): `settings_for("slurm", partition="gpu")`."""
    return kind(kind_name).settings.model_validate({"kind": kind_name, **fields})


def make_driver(pool: Pool, context: Context) -> PoolDriver:
    """The driver of the pool's kind, for this pool."""
    return kind(pool.kind).driver_factory()(pool, context)
