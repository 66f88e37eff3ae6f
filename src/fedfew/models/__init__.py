"""The model zoo: every model is an encoder plus a head, built by name from :data:`MODELS`."""

import importlib
import pkgutil

from fedfew.models.base import MODELS, FewShotModel, build_model, count_parameters, use_channels_last
from fedfew.models.heads import PrototypeHead, class_prototypes, prototype_logits

# Each module of this package registers its models when imported.
for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("base", "heads"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "MODELS",
    "FewShotModel",
    "PrototypeHead",
    "build_model",
    "class_prototypes",
    "count_parameters",
    "prototype_logits",
    "use_channels_last",
]
