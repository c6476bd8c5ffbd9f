"""BrokerConnection.write_sets: several sets, to several partitions, in one
write; answers read after, in order; a set refused before it is sent (over
the frame bound) is reported in its place and the others are stored."""

from __future__ import annotations

from raylog.errors import FrameTooLargeError, OutOfOrderSequenceError
from raylog.storage.decoding import decode_messages
from raylog.storage.message import encode_message_set
from raylog.transfer.protocol import NO_PRODUCER_ID, NO_SEQUENCE

TOPIC = "clicks"  # the topic the fixtures serve (conftest.TOPIC)


def _values(plog) -> list[bytes]:
    plog.flush()
    data = plog.read(0, 1 << 20).tobytes()
    return [value for _, _, _, value in decode_messages(data, 0)[0]]


def test_sets_written_together_are_answered_in_order_and_a_refused_one_in_its_place(make_server, make_conn,
                                                                                   make_log):
    logs = {(TOPIC, 0): make_log(f"{TOPIC}-0"), (TOPIC, 1): make_log(f"{TOPIC}-1")}
    server = make_server(logs)
    conn = make_conn(server, max_frame_bytes=4096)
    sets = [encode_message_set([f"v{i}".encode()]) for i in range(6)]
    sets[3] = encode_message_set([b"x" * 8192])  # over the frame bound: refused before it is sent
    ids = conn.write_sets([(TOPIC, i % 2, s, 1, NO_PRODUCER_ID, NO_SEQUENCE) for i, s in enumerate(sets)])
    assert isinstance(ids[3], FrameTooLargeError)
    answers = [conn.read_set_reply(c) for c in ids if isinstance(c, int)]
    assert all(isinstance(a, int) for a in answers)
    assert answers[0] == 0 and answers[1] == 0 and answers[2] > 0  # each partition's own offsets
    assert _values(logs[(TOPIC, 0)]) == [b"v0", b"v2", b"v4"]
    assert _values(logs[(TOPIC, 1)]) == [b"v1", b"v5"]


def test_an_idempotent_gap_in_a_written_run_is_answered_for_that_set_alone(make_server, make_conn, make_log):
    plog = make_log()
    server = make_server({(TOPIC, 0): plog})
    conn = make_conn(server)
    sets = [encode_message_set([f"s{i}".encode()]) for i in range(3)]
    ids = conn.write_sets([(TOPIC, 0, sets[0], 1, 99, 0), (TOPIC, 0, sets[1], 1, 99, 5),
                           (TOPIC, 0, sets[2], 1, 99, 1)])
    answers = [conn.read_set_reply(c) for c in ids]
    assert isinstance(answers[1], OutOfOrderSequenceError)
    assert isinstance(answers[0], int) and isinstance(answers[2], int)
    assert _values(plog) == [b"s0", b"s2"]
