"""Ray Direct Transport over Accord: torch tensors that actor methods marked
``@ray.method(tensor_transport="accord")`` return travel from the producing actor straight to
the consuming one through Accord's messages (host or CUDA memory), not through Ray's object
store::

    import accord.rdt
    accord.rdt.register()                     # in the driver, before creating the actors
    # actors get backend "accord" from Ray's setup hook:
    # ray.init(runtime_env={"worker_process_setup_hook": "accord.collective.register_ray_backend"})
    from ray.experimental.collective import create_collective_group
    create_collective_group([producer, consumer], backend="accord")
    ref = producer.make.remote()              # @ray.method(tensor_transport="accord")
    consumer.use.remote(ref)

Ray 2.60's ``register_tensor_transport`` takes a ``TensorTransportManager``; Accord's is Ray's
two-sided collective transport over a group of backend ``"accord"`` (which
:mod:`accord.collective` registers), so each transfer is one Accord send and receive per tensor
between the two actors' ranks, with Accord's deadlines and error messages.
"""

from __future__ import annotations

NAME = "ACCORD"


def _transport_class() -> type:
    from ray.experimental.rdt.collective_tensor_transport import CollectiveTensorTransport

    class AccordTensorTransport(CollectiveTensorTransport):
        """Ray's collective tensor transport on a group of backend ``"accord"``."""

        def tensor_transport_backend(self) -> str:
            return NAME

    return AccordTensorTransport


def register() -> bool:
    """Register transport ``"accord"`` (CPU and CUDA torch tensors) with Ray Direct Transport,
    and backend ``"accord"`` with ``ray.util.collective``, in this process. Returns False where
    the installed Ray has no custom tensor transports."""
    from . import collective

    if not collective.register_ray_backend():
        return False
    try:
        from ray.experimental.rdt import register_tensor_transport
        from ray.experimental.rdt.util import transport_manager_info
    except ImportError:
        return False
    import torch

    if NAME not in transport_manager_info:
        register_tensor_transport(NAME, ["cpu", "cuda"], _transport_class(), torch.Tensor)
    return True
