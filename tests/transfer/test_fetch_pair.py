"""BrokerConnection.fetch_pair: two FETCHes in one write, the first a long
poll; the server answers them in order, so the second is read after the
first was answered; an error of either keeps the connection in step."""

from __future__ import annotations

import threading
import time

import pytest

from raylog.errors import NotOwnerError, OffsetOutOfRangeError, UnknownTopicError
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set

TOPIC = "clicks"  # the topic the fixtures serve (conftest.TOPIC)
OTHER = "views"


def _values(data) -> list[bytes]:
    return [value for _, _, _, value in decode_messages(bytes(data), 0)[0]]


def test_the_second_fetch_is_answered_after_the_first_long_poll(make_server, make_conn, make_log):
    first, second = make_log(f"{TOPIC}-0"), make_log(f"{OTHER}-0")
    server = make_server({(TOPIC, 0): first, (OTHER, 0): second})
    conn = make_conn(server)

    def append_later() -> None:
        time.sleep(0.3)
        second.append(encode_message_set([b"appended before the first was answered"]))
        second.flush()
        first.append(encode_message_set([b"wakes the long poll"]))
        first.flush()

    writer = threading.Thread(target=append_later)
    writer.start()
    try:
        a, b = conn.fetch_pair(TOPIC, OTHER, 0, 0, 1 << 20, 5000)
    finally:
        writer.join()
    assert _values(a.data) == [b"wakes the long poll"]
    # read after the first's reply: it holds what was appended while the first waited
    assert _values(b.data) == [b"appended before the first was answered"]


def test_an_error_of_the_second_is_returned_and_the_connection_stays_in_step(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog})
    conn = make_conn(server)
    plog.append(encode_message_set([b"one"]))
    plog.flush()
    a, b = conn.fetch_pair(TOPIC, "no-such-topic", 0, 0, 1 << 20, 0)
    assert _values(a.data) == [b"one"]
    assert isinstance(b, (UnknownTopicError, NotOwnerError))
    assert _values(conn.fetch(TOPIC, 0, 0, 1 << 20).data) == [b"one"]


def test_an_error_of_the_first_raises_after_the_second_reply_is_read(make_server, make_conn, plog):
    server = make_server({(TOPIC, 0): plog})
    conn = make_conn(server)
    plog.append(encode_message_set([b"one"]))
    plog.flush()
    with pytest.raises(OffsetOutOfRangeError):
        conn.fetch_pair(TOPIC, TOPIC, 0, 10**6, 1 << 20, 0)
    # the second's reply was read: the next request gets its own answer
    assert conn.offsets(TOPIC, 0)[1] == plog.high_watermark
    assert _values(conn.fetch(TOPIC, 0, 0, 1 << 20).data) == [b"one"]
