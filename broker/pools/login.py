"""How a batch pool reaches its scheduler's commands: the transport its settings name (this
host, the sudo helper, or SSH to a login node)."""

from __future__ import annotations

import os

from broker.domain import Pool
from broker.errors import TransportError
from broker.pools.settings import BatchSettings, settings_as
from broker.transport import LocalTransport, SudoTransport, Transport
from broker.transport_ssh import SSHTransport


def make_transport(pool: Pool) -> Transport:
    """The transport a batch pool's estate entry names: `transport: {kind: local|ssh|sudo}`."""
    settings = settings_as(pool, BatchSettings)
    conf = settings.transport
    if conf.kind == "local":
        return LocalTransport()
    if conf.kind == "sudo":
        return SudoTransport(conf.helper)
    mapped = [*pool.user_map.accounts.values(), pool.user_map.default]
    query = settings.query_account or next((a for a in mapped if a), None)
    if not conf.known_hosts:
        raise TransportError(
            f"pool {pool.name}: an ssh transport needs known_hosts; fix: give the path of a "
            "known_hosts file that holds the login node's host key"
        )
    return SSHTransport(
        conf.host,
        conf.port,
        known_hosts=os.path.expanduser(conf.known_hosts),
        client_keys=[os.path.expanduser(key) for key in conf.client_keys],
        default_account=query,
    )
