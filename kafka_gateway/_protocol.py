"""Kafka's framing, request headers and the dispatch table ``api_key -> (versions, handler)``.

A Kafka request is ``size int32 | header | body``; the header is v1
(``api_key int16, api_version int16, correlation_id int32, client_id
nullable string``) or, for flexible versions, v2 (v1 and tagged fields). A
response is ``size int32 | correlation_id int32 | [tagged fields] | body``
(ApiVersions always answers with header v0, without tagged fields).

:class:`FrameReader` is pure (``feed(bytes) -> frames``) and refuses a frame
longer than its ``max_frame_bytes`` before buffering it. Bodies are read and
written with ``kio``'s classes generated from Kafka's own schemas.

:class:`Api` entries form the table every part of the gateway registers into
(``_metadata.register(table)``, ``_produce.register(table)``, ...): ApiVersions
answers from it, and a key or version outside it gets ``UNSUPPORTED_VERSION``
(an error response at the asked version built from the schema, never a silent
close). A later part (groups, SASL) adds its entries the same way.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i32Timedelta, i64

__all__ = [
    "Api",
    "ApiTable",
    "FrameReader",
    "FrameTooLarge",
    "RequestHeader",
    "encode_response",
    "error_response",
    "make",
    "parse_header",
    "read_body",
]

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")
API_VERSIONS_KEY = 18


class FrameTooLarge(Exception):
    """A client announced a frame longer than the gateway's limit (its connection is closed)."""


class FrameReader:
    """Splits a byte stream into Kafka frames; at most ``max_frame_bytes`` per frame."""

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= 4:
            (size,) = _SIZE.unpack_from(self._buffer)
            if size < 8 or size > self._max:
                raise FrameTooLarge(f"a request frame of {size} bytes (limit {self._max})")
            if len(self._buffer) < 4 + size:
                break
            frames.append(bytes(self._buffer[4 : 4 + size]))
            del self._buffer[: 4 + size]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buffer)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int


def parse_header(frame: bytes) -> RequestHeader:
    """The header of a request frame; the body's schema is known only from its key and version."""
    if len(frame) < 10:
        raise ValueError("a request shorter than its header")
    api_key, api_version, correlation_id = _HEADER.unpack_from(frame)
    (length,) = struct.unpack_from(">h", frame, 8)
    position = 10
    client_id = None
    if length >= 0:
        if position + length > len(frame):
            raise ValueError("a client_id past the end of the request")
        client_id = frame[position : position + length].decode("utf-8", "replace")
        position += length
    return RequestHeader(api_key, api_version, correlation_id, client_id, position)


def _skip_tagged_fields(frame: bytes, position: int) -> int:
    count, position = _uvarint(frame, position)
    for _ in range(count):
        _tag, position = _uvarint(frame, position)
        size, position = _uvarint(frame, position)
        position += size
    if position > len(frame):
        raise ValueError("tagged fields past the end of the request")
    return position


def _uvarint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 28:
            raise ValueError("a malformed varint in the request header")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def read_body(frame: bytes, header: RequestHeader) -> Any:
    """The request body as its kio class (for a key and version the table serves)."""
    schema = load_request_schema(header.api_key, header.api_version)
    position = header.body_offset
    if schema.__flexible__:
        position = _skip_tagged_fields(frame, position)
    body, _size = entity_reader(schema)(memoryview(frame), position)
    return body


class _Buffer:
    """The ``write`` kio's writers need, over a list of chunks joined once."""

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.chunks.append(bytes(data))
        return len(data)


def encode_response(header: RequestHeader, response: Any) -> bytes:
    """``size | correlation_id | [tagged fields] | body`` of ``response`` (a kio response)."""
    buffer = _Buffer()
    entity_writer(type(response))(buffer, response)  # type: ignore[arg-type]
    flexible_header = type(response).__flexible__ and header.api_key != API_VERSIONS_KEY
    head = struct.pack(">i", header.correlation_id) + (b"\x00" if flexible_header else b"")
    size = len(head) + sum(len(chunk) for chunk in buffer.chunks)
    return b"".join([_SIZE.pack(size), head, *buffer.chunks])


# -- building responses ----------------------------------------------------------------------------


def make(cls: type, **values: Any) -> Any:
    """``cls(**values)`` keeping only the fields this version of the schema has.

    Handlers serve a range of versions with one code path: a field a version
    lacks is dropped, one it adds keeps its schema default (or a neutral value).
    """
    names = {field.name: field for field in dataclasses.fields(cls)}
    kept = {name: value for name, value in values.items() if name in names}
    for name, field in names.items():
        if name in kept or field.default is not dataclasses.MISSING:
            continue
        if field.default_factory is not dataclasses.MISSING:
            continue
        kept[name] = _neutral(cls, field)
    return cls(**kept)


def _neutral(cls: type, field: dataclasses.Field[Any], error: ErrorCode = ErrorCode.none) -> Any:
    """A value for a required field nothing was given for: 0, "", (), -1 for ids, ``error``."""
    kafka_type = field.metadata.get("kafka_type")
    hints = typing.get_type_hints(cls)
    hint = hints[field.name]
    origin = typing.get_origin(hint)
    optional = origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
    if origin is tuple:
        return ()
    if kafka_type == "error_code":
        return error
    if kafka_type in ("string",):
        return None if optional else ""
    if kafka_type in ("bytes", "records"):
        return None if optional else b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return None
    if kafka_type == "timedelta_i32":
        return i32Timedelta.parse(__import__("datetime").timedelta(0))
    if kafka_type == "timedelta_i64":
        from kio.static.primitive import i64Timedelta

        return i64Timedelta.parse(__import__("datetime").timedelta(0))
    if kafka_type in ("datetime_i64",):
        return None
    if kafka_type in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float64"):
        return hint(-1) if field.name.endswith(("_id", "epoch", "offset")) else hint(0)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return error_entity(hint, error)
    if optional:
        return None
    raise TypeError(f"no neutral value for {cls.__name__}.{field.name} ({kafka_type})")


def error_entity(cls: type, error: ErrorCode) -> Any:
    """An instance of ``cls`` with every required field neutral and every error code ``error``."""
    values = {}
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            values[field.name] = _neutral(cls, field, error)
        elif field.metadata.get("kafka_type") == "error_code":
            values[field.name] = error
    return cls(**values)


def error_response(api_key: int, api_version: int, error: ErrorCode) -> Any | None:
    """A response of ``(api_key, api_version)`` whose every error code is ``error`` (None: no schema)."""
    try:
        schema = load_response_schema(api_key, api_version)
    except Exception:
        return None
    return error_entity(schema, error)


# -- the dispatch table ----------------------------------------------------------------------------

Handler = Callable[[Any, RequestHeader, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Api:
    """One API the gateway serves: its key, the versions it answers and the handler.

    ``handler(connection, header, request)`` returns the kio response at the
    request's version, or None for no response (a Produce with ``acks=0``).
    """

    key: int
    min_version: int
    max_version: int
    handler: Handler


class ApiTable(dict[int, Api]):
    """``api_key -> Api``; ApiVersions answers from it."""

    def add(self, api: Api) -> None:
        if api.key in self:
            raise ValueError(f"api key {api.key} registered twice")
        self[api.key] = api

    def serves(self, api_key: int, api_version: int) -> bool:
        api = self.get(api_key)
        return api is not None and api.min_version <= api_version <= api.max_version


__all__ += ["API_VERSIONS_KEY", "ErrorCode", "Handler", "error_entity", "i16", "i32", "i64"]


def response_module(api_key: int, api_version: int) -> Any:
    """The module of a response schema: its nested classes (``TopicProduceResponse``...) by name."""
    import sys

    return sys.modules[load_response_schema(api_key, api_version).__module__]


NO_THROTTLE = i32Timedelta.parse(__import__("datetime").timedelta(0))
__all__ += ["NO_THROTTLE", "response_module"]
