"""Errors decoded off the wire keep their class's behaviour (issue 22, item 7).

A server (or anything in between) chooses the ``fields_json`` of an error; the
client used to set every field as an attribute, so a field named ``retriable``
turned a fatal error into a retried one and ``again`` replaced a method.
"""

from __future__ import annotations

import json

from robustmq._proto import robustmq_pb2 as pb
from robustmq._wire import error_from_info
from robustmq.errors import MAX_FIELDS, InvalidRequest, Unavailable


def _decoded(code: str, fields: dict[str, object]) -> object:
    return error_from_info(pb.ErrorInfo(code=code, message="m", fields_json=json.dumps(fields)))


def test_a_wire_error_cannot_override_what_its_class_says() -> None:
    hostile = {"retriable": True, "code": "UNAVAILABLE", "again": 1, "message": "x", "fields": 2, "args": 3}
    error = _decoded("INVALID_REQUEST", {**hostile, "__class__": "y", "not an identifier": 4, "topic": "t"})
    assert isinstance(error, InvalidRequest)
    assert error.retriable is False and error.code == "INVALID_REQUEST" and error.message == "m"
    assert callable(error.again) and isinstance(error.fields, dict) and error.args == ("m",)
    assert error.topic == "t"  # an ordinary field is still an attribute
    assert error.fields["retriable"] is True  # and every kept field is still in .fields
    retriable = _decoded("UNAVAILABLE", {"retriable": False})
    assert isinstance(retriable, Unavailable) and retriable.retriable is True


def test_a_wire_error_keeps_a_bounded_number_of_fields() -> None:
    error = _decoded("INVALID_REQUEST", {f"field{number}": number for number in range(10_000)})
    assert len(error.fields) == MAX_FIELDS
