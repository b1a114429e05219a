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

``destroy`` is meant for ``finally`` blocks: it is prompt and best effort even after a worker
died (see :meth:`Comms.destroy`).
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import Communicator, StoreServer, advertised_host, init_from_store

_sessions: Dict[str, Communicator] = {}
log = logging.getLogger(__name__)

#: Seconds :meth:`Comms.destroy` gives the scheduler and the workers to drop the communicator.
LEAVE_TIMEOUT = 5.0


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


async def _leave_all(client: Any, session_id: str, workers: List[str]) -> Tuple[List[str], Dict[str, BaseException]]:
    """Drop the session on those of ``workers`` the scheduler still knows. Returns the workers
    skipped as gone and the errors of the others, by address. A dead worker is skipped rather
    than contacted: connecting to it would only fail after the connect timeout (30 s)."""
    known = (await client.scheduler.identity()).get("workers", {})
    gone = [w for w in workers if w not in known]
    alive = [w for w in workers if w in known]
    results = await client._run(_leave, session_id, workers=alive, on_error="return") if alive else {}
    return gone, {w: r for w, r in results.items() if isinstance(r, BaseException)}


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
        """Drop the communicator on every worker and stop the store.

        Prompt and best effort, so that it can run in a ``finally`` block after a failure
        without hiding it: workers the scheduler no longer knows are skipped, the others get
        :data:`LEAVE_TIMEOUT` seconds, and what fails is logged (logger ``accord.dask``) instead
        of raised. The store is always stopped."""
        try:
            if self.initialized:
                gone, failed = self.client.sync(
                    _leave_all, self.client, self.session_id, self.worker_addresses,
                    callback_timeout=LEAVE_TIMEOUT,
                )
                if gone:
                    log.warning("accord session %s: workers %s are gone; nothing to drop there", self.session_id, gone)
                for w, e in failed.items():
                    log.warning("accord session %s: worker %s could not drop its communicator: %r", self.session_id, w, e)
        except Exception as e:
            log.warning(
                "accord session %s: could not drop the communicator on the workers within %g s (%r); "
                "a worker keeps its communicator until it exits",
                self.session_id, LEAVE_TIMEOUT, e,
            )
        finally:
            self.initialized = False
            server, self._server = self._server, None
            if server is not None:
                server.close()
