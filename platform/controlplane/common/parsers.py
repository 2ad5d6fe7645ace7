"""Request body parsers of the REST API (settings: REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]).

Kept apart from common/api.py: DRF reads the parser setting while importing rest_framework.views, which
common/api.py imports, so the parser's module must not import it back."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.parsers import JSONParser


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, with a body nested deeper than Python's recursion limit (`[[[[...` in a few KB) a 400
    instead of a RecursionError and a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply") from None
