"""A FETCH or COUNT at an offset inside a compressed wrapper (an inner
message's record offset, docs/design.md §2), over the file and the memory
log: InvalidOffsetError naming the wrapper, which the client reads whole
with ``inside_wrapper=True``; inside a plain message it stays an error."""

from __future__ import annotations

import pytest

from raylog.errors import InvalidOffsetError
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set

from tests.transfer.test_server import TOPIC, produced


def test_a_fetch_inside_a_wrapper_reads_the_wrapper_and_a_plain_message_stays_an_error(conn, plog):
    plain = encode_message_set([b"p0", b"p1"], timestamp_ms=1)
    wrapped = encode_message_set([b"w%02d" % i for i in range(40)], timestamp_ms=2, compression="zstd")
    _, w, after = produced(conn, plog, [plain, wrapped, encode_message_set([b"after"], timestamp_ms=3)])
    with pytest.raises(InvalidOffsetError) as info:
        conn.fetch(TOPIC, 0, w + 10, 4096)  # without the option: the typed error, naming the wrapper
    assert (info.value.details["wrapper_offset"], info.value.details["next_offset"]) == (w, after)
    result = conn.fetch(TOPIC, 0, w + 10, 4096, inside_wrapper=True)
    assert result.offset == w
    records, _ = decode_messages(bytes(result.data), result.offset)
    inner = [r for r in records if r[0] >= w + 10]
    assert [r[3] for r in inner][:30] == [b"w%02d" % i for i in range(10, 40)]
    assert [r[0] for r in inner][:30] == list(range(w + 10, w + 40))
    with pytest.raises(InvalidOffsetError) as plain_err:
        conn.fetch(TOPIC, 0, 5, 4096, inside_wrapper=True)  # inside a plain message
    assert "wrapper_offset" not in plain_err.value.details
    # nothing lost: the whole log reads back
    records, _ = decode_messages(bytes(conn.fetch(TOPIC, 0, 0, 1 << 20).data), 0)
    assert [r[3] for r in records] == [b"p0", b"p1"] + [b"w%02d" % i for i in range(40)] + [b"after"]


def test_a_count_that_starts_or_ends_inside_a_wrapper_names_it(conn, plog):
    wrapped = encode_message_set([b"w%02d" % i for i in range(40)], timestamp_ms=2, compression="lz4")
    w, after = produced(conn, plog, [wrapped, encode_message_set([b"after"], timestamp_ms=3)])
    end = after + 27
    for start, stop in ((w + 3, end), (w, w + 3)):
        with pytest.raises(InvalidOffsetError) as info:
            conn.count(TOPIC, 0, start, stop, 1 << 20)
        assert info.value.details["wrapper_offset"] == w
    assert conn.count(TOPIC, 0, w, end, 1 << 20) == (41, end)
