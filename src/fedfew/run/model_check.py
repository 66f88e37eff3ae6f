"""Before any work: the configured model is built and run once on two samples of the data, so a
model that cannot be built (``model.options.hidden: 0``) or whose forward pass raises (a plugin's
bug) is a one-line config error naming the model, not a traceback after the run folder exists."""

from __future__ import annotations

from typing import Any

import torch

from fedfew.config.validation import ConfigError


def check_model_runs(experiment: Any) -> None:
    """Build ``experiment``'s model (head-less, as encoders are used) and pass two samples
    through it in eval mode; torch's global generator is left as it was, so nothing downstream
    draws different numbers."""
    config = experiment.config
    where = f"model {config.model.name!r} (model.options {config.model.options})"
    data = experiment.dataset
    take = slice(0, min(2, len(data)))
    with torch.random.fork_rng(devices=[]):
        model = experiment.context.make_model(None)  # a model that cannot be built: ModelBuildError
        args = (data.inputs[take],) if data.lengths is None else (data.inputs[take], data.lengths[take])
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                getattr(model, "features", model)(*args)
        except Exception as err:
            raise ConfigError(f"{where} fails on the data ({config.dataset.name}, inputs "
                              f"{tuple(data.inputs.shape[1:])}): {_describe(err)}") from None
        finally:
            model.train(was_training)


def _describe(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
