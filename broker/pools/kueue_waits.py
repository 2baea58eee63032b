"""Why a Kueue pool's Jobs wait: Kueue's words from its Workloads, for the Jobs that have no
pod yet, read with one list of Workloads at most every LOOK_S (the rules are kueue.py's).
"""

from __future__ import annotations

import logging
import time

from broker.errors import KliqueError
from broker.pools import kueue
from broker.pools.kube_api import KubeApi

log = logging.getLogger("klique.pools")

LOOK_S = 5.0  # Kueue's Workloads are listed at most this often


class KueueWaits:
    """Kueue's last words, by Job name, for the Jobs that wait for admission."""

    def __init__(self, api: KubeApi, pool: str) -> None:
        self.api = api
        self.pool = pool
        self.words: dict[str, str] = {}
        self._looked = -LOOK_S

    async def look(self, waiting: set[str]) -> None:
        """Kueue's words for these Jobs (when due); an answer that cannot be had leaves the
        last words."""
        now = time.monotonic()
        if not waiting or now - self._looked < LOOK_S:
            return
        self._looked = now
        try:
            workloads = await self.api.list_workloads()
        except KliqueError as exc:
            log.info("pool %s: Kueue's workloads: %s", self.pool, exc)
            return
        words: dict[str, str] = {}
        for workload in workloads:
            job = kueue.owner_job(workload)
            if job in waiting:
                words[job] = kueue.waiting(workload) or "Kueue: waiting for admission"
        self.words = words
