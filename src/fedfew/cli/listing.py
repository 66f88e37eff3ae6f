"""``fedfew list``: what a config may name (algorithms, datasets, engines, models, partitions), one
algorithm's options with their types, defaults, bounds and meaning, and which algorithms privacy and
secure aggregation cover."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, Protocol, cast

from fedfew.core.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from fedfew.interface.algorithm import Algorithm


def _type_name(annotation: object) -> str:
    """An option's type as a config writer reads it: ``adam | sgd``, ``int | None``, ``list[str]``."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _options_lines(model: type[BaseModel], indent: str, prefix: str = "") -> list[str]:
    """One entry per option of the pydantic ``model``: ``name: type = default, bounds`` and its
    ``Field(description=...)`` wrapped beneath; nested sections (FRL's ``deployment``) follow as
    ``section.option``."""
    import shutil
    import textwrap
    import typing

    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 110))
    lines = []
    for name, field in model.model_fields.items():
        if field.default_factory is not None:
            default: object = field.default_factory()  # type: ignore[call-arg]
        else:
            default = field.default
        value = ("required" if default is PydanticUndefined
                 else f"= {default if isinstance(default, str) else json.dumps(default, default=str)}")
        bounds = [f"{symbol} {getattr(m, attr)}" for m in field.metadata
                  for attr, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "min length"))
                  if getattr(m, attr, None) is not None]
        nested = [a for a in (field.annotation, *typing.get_args(field.annotation))
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        head = f"{prefix}{name}: {_type_name(field.annotation)} {value}"
        lines.append(f"{indent}{head}{', ' + ', '.join(bounds) if bounds else ''}"
                     if not nested else f"{indent}{prefix}{name}: {_type_name(field.annotation)} (a section)")
        if field.description:
            lines += textwrap.wrap(field.description, width, initial_indent=indent + "    ",
                                   subsequent_indent=indent + "    ", break_on_hyphens=False,
                                   break_long_words=False)

        for section in nested:
            lines += _options_lines(section, indent, f"{prefix}{name}.")
    return lines


def cmd_list(args: argparse.Namespace) -> int:
    from fedfew.algorithms import register_all
    register_all()  # the built-in algorithms, registered
    from fedfew.config.engines import ENGINES
    from fedfew.core.registry import Registry
    from fedfew.data import DATASETS
    from fedfew.fewshot.partition import PARTITIONS
    from fedfew.interface.registration import ALGORITHMS
    from fedfew.models import MODELS

    if args.name is not None:  # one algorithm and its options (what a config's algorithm.options may set)
        if args.what != "algorithms":
            raise ConfigError(f"fedfew list {args.what} {args.name}: only algorithms have their options listed "
                              "(fedfew list algorithms NAME)")

        cls = ALGORITHMS.get(args.name)  # an unknown name: one line with the close matches, exit 2
        print(f"{args.name}: {ALGORITHMS.describe(args.name)}")
        options = _options_lines(cls.Options, "  ")
        print("algorithm.options:" if options else "algorithm.options: none")
        print("\n".join(options))
        return 0
    registries: dict[str, Registry[Any]] = {"algorithms": ALGORITHMS, "datasets": DATASETS, "engines": ENGINES, "models": MODELS,
                  "partitions": PARTITIONS}
    if args.what == "privacy":
        _list_privacy(ALGORITHMS)
        return 0
    if args.what == "secure-aggregation":
        _list_secure_aggregation(ALGORITHMS, ENGINES)
        return 0
    for kind, registry in registries.items():
        if args.what and args.what != kind:
            continue
        print(f"{kind}:")
        names = registry.names()
        width = max((len(n) for n in names), default=0)  # long names (plugins) keep the columns aligned
        for name in names:
            print(f"  {name:{width}s}  {registry.describe(name)}")
            if args.show_options and kind == "algorithms":
                for line in _options_lines(registry.get(name).Options, "      "):
                    print(line)
    return 0


class _Names(Protocol):
    """What the listings read of a registry (:class:`fedfew.core.registry.Registry`)."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> object: ...


def _list_privacy(algorithms: _Names) -> None:
    """The privacy mechanisms (config ``privacy.mechanism``) and, per algorithm, whether differential
    privacy covers its upload (docs/privacy.md)."""
    from typing import get_args

    from fedfew.config.validation import PrivacyConfig
    from fedfew.privacy.coverage import COVERED_UPLOADS, refused_because

    meaning = {"none": "off (the default)",
               "central-dp": "DP-FedAvg: clients clip their update, the server adds Gaussian noise",
               "local-dp": "each client clips and noises its own update: the server need not be trusted"}
    print("privacy mechanisms (privacy.mechanism; docs/privacy.md):")
    for name in get_args(PrivacyConfig.model_fields["mechanism"].annotation):  # the schema's, never a copy
        print(f"  {name:10s}  {meaning.get(name, 'docs/privacy.md')}")
    from fedfew.privacy.accounting import ACCOUNTING

    print("what epsilon assumes about who took part (privacy.accounting; default poisson, none in research mode "
          "and under local-dp):")
    for name, what in ACCOUNTING.items():
        print(f"  {name:19s}  {what}")
    print("noise (privacy.noise): secure (the default: OS randomness, nobody can regenerate it); seeded (research "
          "mode: reproducible, not private against anyone who holds the seed)")
    print("algorithms under privacy:")
    names = algorithms.names()
    width = max((len(n) for n in names), default=0)
    for name in names:
        kind = cast("type[Algorithm]", algorithms.get(name))
        upload = getattr(kind, "dp_upload", None)
        if isinstance(upload, str) and upload in COVERED_UPLOADS:
            shown = f"covered: {COVERED_UPLOADS[upload]}"
        elif isinstance(upload, property):  # depends on the options: covered with some, refused with others
            shown = f"depends on its options: {vars(kind).get('dp_refused') or 'docs/privacy.md says which are covered'}"
        else:
            shown = f"refused: {refused_because(kind)}"
        print(f"  {name:{width}s}  {shown}")


def _list_secure_aggregation(algorithms: _Names, engines: _Names) -> None:
    """The engines that can run ``flower.secure_aggregation`` and, per algorithm, whether it covers its
    rounds (docs/privacy.md, "Secure aggregation")."""
    able = [n for n in engines.names() if getattr(engines.get(n), "honours_secure_aggregation", False)]
    print(f"secure aggregation (flower.secure_aggregation, Flower's SecAgg+; docs/privacy.md) on: {', '.join(able)}")
    print("algorithms under secure aggregation (the server sees only the sum of a round's updates):")
    names = algorithms.names()
    width = max((len(n) for n in names), default=0)
    for name in names:
        kind = cast("type[Algorithm]", algorithms.get(name))
        covers = vars(kind).get("secure_sum")  # each class declares its own (Algorithm.secure_sum)
        if covers is None:
            shown = f"refused: {kind.secure_sum_refusal(None)}"
        else:
            shown = "covered: its aggregate is a weighted mean of the uploaded models" + (
                f"; {covers} (refused otherwise: {kind.secure_sum_refused})" if covers else "")
        print(f"  {name:{width}s}  {shown}")
