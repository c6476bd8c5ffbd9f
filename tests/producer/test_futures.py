"""Futures: offsets within a set, scoped errors, a call's order and failures."""

from __future__ import annotations

import threading

import pytest

from raylog.errors import DeliveryError, MessageTooLargeError, RequestTimeoutError
from raylog.producer.futures import BatchFuture, CallFuture, SendFuture, scoped_error
from raylog.storage.decoding import decode_messages
from raylog.storage.record_batch import encode_batch, stamp


def test_offsets_of_a_batch_are_where_decoding_finds_the_records():
    values = [b"a", b"bb" * 10, b"", b"ccc"]
    keys = [None, b"key", None, b"k"]
    batch = BatchFuture("t", 2, values, compressed=False)
    batch.set_keys(keys)
    batch.resolve(1000)
    decoded, _ = decode_messages(stamp(encode_batch(values, keys, None, 0), 1000), 1000)
    assert [SendFuture(batch, i).result() for i in range(4)] == [(2, o) for o, *_ in decoded]


def test_a_compressed_set_reports_the_wrapper_offset_plus_the_index_and_acks_0_minus_one():
    batch = BatchFuture("t", 0, [b"a", b"b", b"c"], compressed=True)
    batch.resolve(500)
    assert [SendFuture(batch, i).result().offset for i in range(3)] == [500, 501, 502]
    blind = BatchFuture("t", 0, [b"a", b"b"], compressed=False)
    blind.resolve(-1)
    assert SendFuture(blind, 1).result().offset == -1


def test_a_failed_batch_raises_the_typed_error_naming_the_topic_partition():
    batch = BatchFuture("clicks", 3, [b"x"], compressed=False)
    future = SendFuture(batch, 0)
    with pytest.raises(RequestTimeoutError):
        future.result(timeout_s=0.01)
    seen = []
    future.add_done_callback(lambda f: seen.append(f.done()))
    batch.fail(MessageTooLargeError("too big", size=9, limit=4))
    with pytest.raises(MessageTooLargeError) as caught:
        future.result()
    assert str(caught.value).startswith("clicks-3: too big")
    assert (caught.value.topic, caught.value.partition, caught.value.limit) == ("clicks", 3, 4)
    assert seen == [True]
    assert scoped_error(caught.value, "clicks", 3) is caught.value  # named once


def test_a_call_lists_results_in_its_order_and_fails_only_for_its_own_messages():
    a = BatchFuture("t", 0, [b"x0", b"x1"], compressed=False)
    b = BatchFuture("t", 1, [b"y0"], compressed=False)
    call = CallFuture()
    call._add(b, 0, 1, [1])  # a keyed call: message 1 went to partition 1
    call._add(a, 0, 2, [0, 2])
    done = threading.Event()
    call.add_done_callback(lambda c: done.set())
    a.resolve(0)
    assert not done.is_set()
    b.resolve(7)
    assert done.is_set()
    assert call.result() == [(0, 0), (1, 7), (0, 1)]

    c = BatchFuture("t", 2, [b"z"], compressed=False)
    failing = CallFuture()
    failing._add(a, 0, 2, 0)
    failing._add(c, 0, 1, 2)
    c.fail(MessageTooLargeError("too big"))
    with pytest.raises(DeliveryError) as caught:
        failing.result()
    assert list(caught.value.failures) == [("t", 2)] and caught.value.failures[("t", 2)][0] == 1
