"""The types of JSON values: what run records, summaries, study records and config data hold.

``JSONValue`` is any value ``json.loads`` returns; ``JSONObject`` a JSON object. A record that is
only read (``Mapping[str, object]``) or built for ``json.dumps`` takes these instead of ``Any``."""

from __future__ import annotations

from typing import TypeAlias

#: Any value ``json.loads`` returns.
JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
#: A JSON object.
JSONObject: TypeAlias = dict[str, JSONValue]
