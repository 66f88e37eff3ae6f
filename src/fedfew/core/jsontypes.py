"""The types of JSON values: what run records, summaries, study records and config data hold.

``JSONValue`` is any value ``json.loads`` returns; ``JSONObject`` a JSON object: the types of a
skeleton, a record or a summary that is built for ``json.dumps`` or read without a schema."""

from __future__ import annotations

from typing import TypeAlias

#: Every value ``json.loads`` can return.
JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
#: A JSON object.
JSONObject: TypeAlias = dict[str, JSONValue]
