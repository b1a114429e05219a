"""Dask integration, shaped like raft-dask's ``Comms``::

    from accord.dask import Comms, local_comm
    comms = Comms(client)
    comms.init()                        # every worker joins one accord communicator

    def task(session_id, x):
        comm = local_comm(session_id)   # inside a task, on a worker
        comm.allreduce(x)
        return x

    futures = [client.submit(task, comms.session_id, x, workers=[w]) for w in comms.worker_addresses]
    comms.destroy()

``init`` starts a store in the client process and runs the join on every worker at once
(``client.run``); since no worker hosts the store, their concurrent joins cannot wait on each
other. Ranks follow the sorted worker addresses. The store's address given to the workers is the
client's host as seen from the scheduler address (``ACCORD_STORE_HOST`` overrides it).
Collectives run inside tasks, one task per worker, all submitted together so that they run at
the same time.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Dict, List, Optional, Sequence

from . import Communicator, StoreServer, advertised_host, init_from_store

_sessions: Dict[str, Communicator] = {}


def _store_host(client: Any) -> str:
    if os.environ.get("ACCORD_STORE_HOST"):
        return os.environ["ACCORD_STORE_HOST"]
    addr = client.scheduler.address if client.scheduler is not None else ""
    host = addr.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    if host in ("127.0.0.1", "localhost", "::1", ""):
        return "127.0.0.1"
    return advertised_host()


def _join(session_id: str, address: str, token: str, ranks: Dict[str, int], timeout: Optional[float], dask_worker: Any = None) -> int:
    rank = ranks[dask_worker.address]
    _sessions[session_id] = init_from_store(rank, len(ranks), address, token, timeout)
    return rank


def _leave(session_id: str) -> None:
    _sessions.pop(session_id, None)


def local_comm(session_id: str) -> Communicator:
    """This worker's communicator of session ``session_id`` (call it inside a task)."""
    try:
        return _sessions[session_id]
    except KeyError:
        raise RuntimeError(
            f"no accord session {session_id!r} on this worker: was Comms.init() run with this worker?"
        ) from None


local_handle = local_comm


class Comms:
    """One accord communicator over the workers of a Dask cluster."""

    def __init__(self, client: Any = None, timeout: Optional[float] = None):
        if client is None:
            from distributed import default_client

            client = default_client()
        self.client = client
        self.timeout = timeout
        self.session_id = uuid.uuid4().hex
        self.worker_addresses: List[str] = []
        self.initialized = False
        self._server: Optional[StoreServer] = None

    @property
    def sessionId(self) -> str:  # raft-dask spelling
        return self.session_id

    def init(self, workers: Optional[Sequence[str]] = None) -> None:
        """Create the communicator on ``workers`` (default: every worker); blocks until all
        have joined."""
        if self.initialized:
            raise RuntimeError("Comms.init() was already called")
        if workers is None:
            workers = list(self.client.scheduler_info()["workers"])
        self.worker_addresses = sorted(workers)
        ranks = {w: r for r, w in enumerate(self.worker_addresses)}
        self._server = StoreServer("0.0.0.0", 0)
        address = f"{_store_host(self.client)}:{self._server.port}"
        self.client.run(
            _join, self.session_id, address, self._server.token, ranks, self.timeout,
            workers=self.worker_addresses,
        )
        self.initialized = True

    def worker_rank(self, address: str) -> int:
        """The rank of the worker at ``address``."""
        return self.worker_addresses.index(address)

    def destroy(self) -> None:
        """Drop the communicator on every worker and stop the store."""
        if self.initialized:
            self.client.run(_leave, self.session_id, workers=self.worker_addresses)
        if self._server is not None:
            self._server.close()
            self._server = None
        self.initialized = False
