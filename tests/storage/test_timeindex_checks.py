"""The time index is checked (a CRC per entry, and against the log) and
rebuilt when wrong: a damaged index never gives a wrong offset for a time."""

import os

from raylog.config import TopicConfig
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set
from raylog.storage.timeindex import ENTRY, index_name

CONFIG = TopicConfig(segment_bytes=1 << 20, max_message_bytes=4096, flush_messages=1_000_000, flush_ms=60_000)


def build(path, n=100):
    """A log of ``n`` sets of one message, times 1000, 1010, ...; their offsets."""
    with PartitionLog(path, CONFIG) as log:
        offsets = [log.append(encode_message_set([b"x" * 500], timestamp_ms=1000 + 10 * i)) for i in range(n)]
    return offsets


def check_every_time(log, offsets):
    for i, offset in enumerate(offsets):
        assert log.offset_for_time(1000 + 10 * i) == offset
        assert log.offset_for_time(1000 + 10 * i - 5) == offset
    assert log.offset_for_time(0) == 0
    assert log.offset_for_time(10**12) == log.high_watermark


def test_a_flipped_byte_in_the_index_file_is_found_and_the_index_rebuilt(tmp_path, caplog):
    offsets = build(tmp_path)
    path = tmp_path / index_name(0)
    assert os.path.getsize(path) >= 3 * ENTRY.size
    with open(path, "r+b") as f:  # the lowest byte of the first entry's offset: no boundary any more
        f.seek(15)
        byte = f.read(1)
        f.seek(15)
        f.write(bytes([byte[0] ^ 0x01]))
    with PartitionLog(tmp_path, CONFIG) as log:
        check_every_time(log, offsets)
    assert "time index" in caplog.text and "damaged" in caplog.text
    # a file of the older 16-byte entries, or none, is rebuilt the same way
    with open(path, "wb") as f:
        f.write(b"".join((1000 + 10 * i).to_bytes(8, "big") + offsets[i].to_bytes(8, "big") for i in range(0, 100, 8)))
    with PartitionLog(tmp_path, CONFIG) as log:
        check_every_time(log, offsets)
    os.unlink(path)
    with PartitionLog(tmp_path, CONFIG) as log:
        check_every_time(log, offsets)


def test_entries_with_good_crcs_but_no_message_boundary_are_rebuilt_from_the_log(tmp_path, caplog):
    from raylog.storage.timeindex import encode_entry

    offsets = build(tmp_path)
    path = tmp_path / index_name(0)
    # An index that is well formed but wrong for this log (say, left from another one).
    wrong = b"".join(encode_entry(1000 + 10 * i, offsets[i] + 7) for i in range(10, 90, 10))
    with open(path, "wb") as f:
        f.write(wrong)
    with PartitionLog(tmp_path, CONFIG) as log:
        check_every_time(log, offsets)
    assert "rebuilding the index from the log" in caplog.text
    assert os.path.getsize(path) % ENTRY.size == 0 and open(path, "rb").read() != wrong
