"""Exception classes raised by accord.

Every error of the Rust core arrives as one of these, with the variant's fields as attributes
(``op``, ``seq``, ``waiting_for``, ``peer``, ``mine``, ``theirs``, ``rank`` ...). Classes that
match a builtin meaning also inherit it, so ``except TimeoutError`` and ``except ValueError``
work as expected.
"""

import builtins


class AccordError(Exception):
    """Base class of every accord error."""


class TimeoutError(AccordError, builtins.TimeoutError):
    """A call passed its deadline. ``op``, ``seq``, ``comm``, ``waiting_for`` (ranks still
    missing), ``after`` (seconds waited), ``hint``."""


class DesyncError(AccordError):
    """Ranks called different operations, or the same one with incompatible arguments.
    ``rank`` (this one), ``mine``, ``peer``, ``theirs``, ``comm``, ``seq``."""


class PeerLostError(AccordError):
    """A peer's connection broke or its process died. ``rank`` / ``peer``, ``cause``."""


class AbortedError(AccordError):
    """The communicator was aborted, locally or by a failing peer. ``reason``."""


class UnauthorizedError(AccordError):
    """A peer or store client did not know the job's token. ``detail``."""


class ProtocolError(AccordError):
    """Malformed bytes arrived on a connection. ``detail``."""


class StoreError(AccordError):
    """The rendezvous store refused or failed a request. ``detail``."""


class InvalidArgumentError(AccordError, ValueError):
    """The call cannot work with these arguments (sizes, ranks, dtype/op pairs). ``detail``."""


class UnsupportedError(AccordError, TypeError):
    """The operation exists but not for these arguments or this build (e.g. GPU arrays
    without the GPU backend). ``detail``."""


class ConnectionError(AccordError, builtins.ConnectionError):
    """An operating-system I/O error, with what accord was doing. ``context``, ``detail``."""


__all__ = [
    "AccordError",
    "TimeoutError",
    "DesyncError",
    "PeerLostError",
    "AbortedError",
    "UnauthorizedError",
    "ProtocolError",
    "StoreError",
    "InvalidArgumentError",
    "UnsupportedError",
    "ConnectionError",
]
