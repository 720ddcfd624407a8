"""The Meta Service address list: parsing, and which address a client asks next (pure logic)."""

from __future__ import annotations

import pytest

from robustmq._meta_addresses import (
    MAX_META_ADDRESSES,
    UNREACHABLE_HOLD_S,
    MetaAddresses,
    parse_meta_addresses,
)
from robustmq.errors import InvalidConfig


def test_a_comma_list_a_python_list_and_one_address_parse_alike() -> None:
    assert parse_meta_addresses("h1:7070") == ("h1:7070",)
    assert parse_meta_addresses("h1:7070, h2:7071 ,[::1]:7072") == ("h1:7070", "h2:7071", "[::1]:7072")
    assert parse_meta_addresses(["h1:7070", "h2:7071"]) == ("h1:7070", "h2:7071")
    assert parse_meta_addresses("h1:7070,h1:7070") == ("h1:7070",)  # a repeat is kept once


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("", "no Meta Service address"),
        ("h1:7070,,h2:7070", "an empty Meta Service address"),
        ("h1:7070,", "an empty Meta Service address"),
        ("h1:7070,h2", "invalid Meta Service address 'h2'"),
        ("h1:7070;h2:7070", "invalid Meta Service address"),
        ([], "no Meta Service address"),
        (7070, "must be HOST:PORT"),
        (",".join(f"h{i}:7070" for i in range(MAX_META_ADDRESSES + 1)), f"at most {MAX_META_ADDRESSES}"),
    ],
)
def test_bad_input_is_one_clear_line(value: object, said: str) -> None:
    with pytest.raises(InvalidConfig) as raised:
        parse_meta_addresses(value)  # type: ignore[arg-type]
    assert said in raised.value.message
    assert "\n" not in raised.value.message


def test_not_leader_moves_to_the_named_leader_and_learns_an_address_it_was_not_given() -> None:
    book = MetaAddresses(["a:1", "b:1"])
    assert book.current == "a:1"
    assert book.not_leader("a:1", "b:1", now=0.0) == "b:1"
    assert book.not_leader("b:1", "c:1", now=0.0) == "c:1"  # advertised under another name
    assert book.known() == ("a:1", "b:1", "c:1")


def test_not_leader_without_a_leader_or_naming_itself_or_garbage_moves_to_the_next() -> None:
    book = MetaAddresses(["a:1", "b:1", "c:1"])
    assert book.not_leader("a:1", "", now=0.0) == "b:1"
    assert book.not_leader("b:1", "b:1", now=0.0) == "c:1"
    assert book.not_leader("c:1", "not an address", now=0.0) == "a:1"
    assert book.not_leader("a:1", "x:1,y:1", now=0.0) == "b:1"
    assert book.known() == ("a:1", "b:1", "c:1")


def test_a_leader_whose_transport_just_failed_is_not_followed_until_the_hold_passes() -> None:
    book = MetaAddresses(["a:1", "b:1", "c:1"])
    assert book.unreachable("a:1", now=10.0) == "b:1"  # the leader died
    assert book.not_leader("b:1", "a:1", now=10.1) == "c:1"  # its lease has not expired yet
    assert book.not_leader("c:1", "a:1", now=10.0 + UNREACHABLE_HOLD_S) == "a:1"  # it may be back


def test_the_next_address_skips_recently_failed_ones_while_another_is_left() -> None:
    book = MetaAddresses(["a:1", "b:1", "c:1"])
    book.unreachable("b:1", now=0.0)  # a stale failure: b is not current, nothing moves
    assert book.current == "a:1"
    assert book.unreachable("a:1", now=0.1) == "c:1"
    assert book.unreachable("c:1", now=0.2) == "a:1"  # all failed just now: plainly the next one
    book.answered("b:1")
    assert book.unreachable("a:1", now=0.3) == "b:1"


def test_only_a_failure_of_the_current_address_moves_it() -> None:
    book = MetaAddresses(["a:1", "b:1"])
    assert book.unreachable("a:1", now=0.0) == "b:1"
    assert book.unreachable("a:1", now=0.0) == "b:1"  # a second thread's failure at a: no ping-pong
    assert book.not_leader("a:1", "", now=0.0) == "b:1"


def test_learned_addresses_are_bounded() -> None:
    book = MetaAddresses(["a:1"])
    for i in range(3 * MAX_META_ADDRESSES):
        book.not_leader(book.current, f"l{i}:1", now=0.0)
    assert len(book.known()) == MAX_META_ADDRESSES
    assert book.known()[0] == "a:1"
