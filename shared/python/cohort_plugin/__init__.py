"""cohort's plugin SDK for trainers written in Python.

A trainer plugin is a go-plugin subprocess that a cohort rank starts and
drives through the cohort.v1.Trainer gRPC service; this package speaks
that service and go-plugin's handshake as Go's SDK (shared/plugin) does,
with the same protocol versions, settings schema, errors and mutual TLS.

The usual plugin is plain PyTorch code served in one call:

    import cohort_plugin, my_parts
    cohort_plugin.serve_torch(my_parts, name="trainer-mine", version="1.0.0")

where my_parts (a module or any object) defines model(cfg),
optimizer(params, cfg), data(cfg), loss(output, target) and optionally
batch_size, epoch_end(model, epoch), state() and load_state(state); see
TorchTrainer. plan.permutation and plan.Picker give the plan's picks, bit
for bit those of Go's plugin.Permutation; arena maps the rank's arena.
shared/python/README.md in cohort's repository is the guide.
"""

import os

__version__ = "0.1.0"

from .plan import Picker, permutation  # noqa: E402
from .serve import serve  # noqa: E402


def serve_torch(parts, name, version, capabilities=("pytorch",)):
    """Serves parts (model, optimizer, data, loss...) as a trainer plugin."""
    from .torch_trainer import Parts, TorchTrainer  # noqa: PLC0415 - torch loads here, after the handshake is safe

    origin = os.path.abspath(getattr(parts, "__file__", "") or "") or None
    trainer = TorchTrainer(name, version, lambda _settings: Parts(parts, origin), capabilities=capabilities)
    serve(lambda _log: trainer, name=name)


__all__ = ["Picker", "permutation", "serve", "serve_torch", "__version__"]
