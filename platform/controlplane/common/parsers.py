"""Request body parsers of the REST API (settings: REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]).

Kept apart from common/api.py: DRF reads the parser setting while importing rest_framework.views, which
common/api.py imports, so the parser's module must not import it back."""

from __future__ import annotations

import re

from django.http.multipartparser import MAX_TOTAL_HEADER_SIZE
from django.http.multipartparser import MultiPartParser as DjangoMultiPartParser
from django.utils.http import parse_header_parameters
from rest_framework import exceptions
from rest_framework.parsers import JSONParser, MultiPartParser


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, with a body nested deeper than Python's recursion limit (`[[[[...` in a few KB) a 400
    instead of a RecursionError and a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply") from None


UNREADABLE_NAME = ("the file's name could not be decoded: send it in UTF-8 (or as filename*=UTF-8''<percent-encoded "
                   "name>)")


class _PartHeaderWatch:
    """A read-through view of a multipart body that notes each part Django's parser will drop unread: one whose
    Content-Disposition it cannot decode or parse (a filename in bytes that are not UTF-8, an RFC 2231 filename in an
    unknown charset) or whose filename is nothing once cleaned (`..`, control characters). Django skips such a part
    without a word, so an upload whose file was dropped was refused for a missing `uri` (QA). Only a part's headers
    are kept (at most Django's own header limit), never its content."""

    def __init__(self, stream, boundary: bytes):
        self._stream = stream
        self._delimiter = b"\r\n--" + boundary
        self._pending = b"\r\n"  # the first delimiter opens the body, without a line break before it
        self.dropped: dict[str, str] = {}

    def read(self, *args):
        chunk = self._stream.read(*args)
        self._scan(chunk)
        return chunk

    def _scan(self, chunk: bytes) -> None:
        data, start, limit = self._pending + chunk, 0, MAX_TOTAL_HEADER_SIZE + 4
        while (at := data.find(self._delimiter, start)) != -1:
            head = at + len(self._delimiter)
            if data.startswith(b"--", head):  # the closing delimiter
                start = head
                continue
            end = data.find(b"\r\n\r\n", head, head + limit)
            if end == -1:
                if chunk and len(data) - head < limit:  # the headers end in a later read
                    self._pending = data[at:]
                    return
                start = head  # longer than Django takes: its parser refuses the body
                continue
            self._check(data[head:end])
            start = end
        self._pending = data[max(start, len(data) - len(self._delimiter)):]

    def _check(self, header: bytes) -> None:
        for line in header.split(b"\r\n"):
            if not line.lower().startswith(b"content-disposition:"):
                continue
            try:
                _, params = parse_header_parameters(line.decode())
            except ValueError:  # not UTF-8, or an RFC 2231 value in an unknown charset
                if b"filename" in line.lower():
                    self.dropped[_lenient_name(line)] = UNREADABLE_NAME
                return
            filename = params.get("filename")
            if filename and "\ufffd" in filename:  # an RFC 2231 value not in its charset: Django replaces the bytes
                self.dropped[params.get("name", "").strip() or "file"] = UNREADABLE_NAME
                return
            if filename and not DjangoMultiPartParser.sanitize_file_name(None, filename):
                self.dropped[params.get("name", "").strip() or "file"] = (
                    f"the file's name {filename!r} is empty once path separators and control characters are "
                    "removed; give the file a name")
            return


def _lenient_name(line: bytes) -> str:
    """The `name` of a Content-Disposition line that could not be parsed, as far as it can be read ("file" if not)."""
    found = re.search(rb'\bname=("?)([^";\r\n]*)\1', line)
    return (found.group(2).decode("utf-8", errors="replace").strip() if found else "") or "file"


class StrictMultiPartParser(MultiPartParser):
    """DRF's multipart parser, with a part Django's parser would drop unread (see _PartHeaderWatch) a 400 naming its
    field and why, instead of a request that arrives without it."""

    def parse(self, stream, media_type=None, parser_context=None):
        boundary = parse_header_parameters(media_type or "")[1].get("boundary", "")
        if not boundary or stream is None:
            return super().parse(stream, media_type, parser_context)
        watch = _PartHeaderWatch(stream, boundary.encode("ascii", errors="replace"))
        parsed = super().parse(watch, media_type, parser_context)
        if watch.dropped:
            raise exceptions.ValidationError({name: [reason] for name, reason in watch.dropped.items()})
        return parsed
