"""The YAML reader of configs, ``--set`` values and study files: ``yaml.safe_load`` with the surprises of
YAML 1.1 (PyYAML's dialect) refused rather than read as numbers nobody meant, and with limits that
answer a hostile file at once.

* A plain value that YAML 1.1 reads as a number but YAML 1.2 does not (base 60 ``1:0`` = 60, an
  underscore ``1_0`` = 10, a leading-zero octal ``010`` = 8) is a :class:`YamlNumberError` naming its
  key: write the number plainly, or quote it for a string. Every other number reads as before (so every
  stored config keeps its meaning and its hash).
* A key given twice in one mapping is a :class:`DuplicateKeyError` (plain YAML keeps the last one).
* Aliases (``*name``) may repeat what an anchor holds, but the document expanded may hold at most
  :data:`MAX_NODES` nodes (a "billion laughs" file is refused before it is built), and a file above
  :data:`MAX_BYTES` is refused before it is parsed.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

#: A config or study file larger than this is refused unread (the largest committed study is ~31 KiB).
MAX_BYTES = 1024 * 1024
#: The most nodes a document may hold with its aliases expanded.
MAX_NODES = 100_000

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_UNCLEAR = "tag:fedfew,2026:unclear-number"
_NUMBER_START = list("-+0123456789.")

#: YAML 1.1's int and float forms less base 60, underscores and leading-zero octals (PyYAML's own
#: patterns otherwise, so a number reads exactly as it did).
_INT_12 = re.compile(r"^(?:[-+]?0b[0-1]+|[-+]?(?:0|[1-9][0-9]*)|[-+]?0x[0-9a-fA-F]+)$")
_FLOAT_12 = re.compile(r"^(?:[-+]?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?|\.[0-9]+(?:[eE][-+][0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
#: What YAML 1.1 reads as a number and the patterns above do not: refused.
_UNCLEAR_11 = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+"
                         r"|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+"
                         r"|[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
                         r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*)$")


class DuplicateKeyError(yaml.YAMLError):
    """A mapping in YAML text names the same key twice (plain YAML keeps the last one silently)."""

    def __init__(self, key: object, line: int) -> None:
        super().__init__(f"key {key!r} appears twice in one mapping (line {line})")
        self.key, self.line = key, line


class YamlNumberError(yaml.YAMLError):
    """A plain value YAML 1.1 would read as a number nobody meant (``1:0`` = 60, ``1_0`` = 10)."""

    def __init__(self, value: str, line: int, key: object = None) -> None:
        where = f"key {key!r} (line {line})" if key is not None else f"line {line}"
        meant = _as_yaml11(value)
        super().__init__(f"{where}: {value} is read as {meant!r} by YAML 1.1 and otherwise by YAML 1.2: write the "
                         f"number plainly (e.g. {meant!r}), or quote it for a string")
        self.value, self.line, self.key = value, line, key


class TooLargeError(yaml.YAMLError):
    """A document too large to build (its aliases expanded, or its bytes)."""


def _as_yaml11(value: str) -> object:
    return yaml.safe_load(value)


class Yaml12Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with the number forms above refused and duplicate keys refused."""

    yaml_implicit_resolvers = {first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
                               for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may repeat what it merges
                continue
            key = self.construct_object(key_node, deep=True)
            _refuse_unclear(value_node, key)
            try:
                if key in seen:
                    raise DuplicateKeyError(key, key_node.start_mark.line + 1)
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader reports it
                pass
        return super().construct_mapping(node, deep=deep)


for _tag, _pattern in ((_INT, _INT_12), (_FLOAT, _FLOAT_12), (_UNCLEAR, _UNCLEAR_11)):
    Yaml12Loader.add_implicit_resolver(_tag, _pattern, _NUMBER_START)


def _construct_unclear(loader: yaml.SafeLoader, node: yaml.Node) -> None:
    raise YamlNumberError(str(node.value), node.start_mark.line + 1)


Yaml12Loader.add_constructor(_UNCLEAR, _construct_unclear)


def _refuse_unclear(node: yaml.Node, key: object) -> None:
    if isinstance(node, yaml.ScalarNode) and node.tag == _UNCLEAR:
        raise YamlNumberError(str(node.value), node.start_mark.line + 1, key)
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_unclear(item, key)


def expanded_size(node: yaml.Node, limit: int = MAX_NODES) -> int:
    """The nodes of ``node`` with every alias expanded (each shared node counted as often as it is
    used), computed once per node; a :class:`TooLargeError` above ``limit`` or for a recursive alias."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(n: yaml.Node) -> int:
        ident = id(n)
        if ident in sizes:
            return sizes[ident]
        if ident in busy:
            raise TooLargeError(f"line {n.start_mark.line + 1}: an alias refers to a node that contains it")
        busy.add(ident)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            total += sum(size(item) for item in n.value)
        elif isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        busy.discard(ident)
        if total > limit:
            raise TooLargeError(f"its aliases expand to more than {limit:,} values (line {n.start_mark.line + 1}): "
                                "write what they repeat out, or use fewer")
        sizes[ident] = total
        return total

    return size(node)


def load_yaml(text: str) -> object:
    """``yaml.safe_load`` with the refusals of this module."""
    if len(text) > MAX_BYTES:
        raise TooLargeError(f"{len(text):,} characters, above the {MAX_BYTES:,} a config or study file may hold")
    loader = Yaml12Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()
