"""Property: any run of appends, flushes, rolls, reopenings and crashes reads
back exactly what was appended, in order, up to what is flushed."""

import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raylog.config import TopicConfig
from raylog.storage.log import PartitionLog
from raylog.storage.message import encode_message_set

from conftest import COMPRESSIONS, crash, read_all

CONFIG = TopicConfig(segment_bytes=300, max_message_bytes=300, flush_messages=1_000_000, flush_ms=60_000)

appends = st.tuples(
    st.just("append"),
    st.lists(st.binary(max_size=40), min_size=1, max_size=4),
    st.sampled_from(COMPRESSIONS),
)
operations = st.lists(
    st.one_of(
        appends,
        appends,
        appends,
        st.just(("flush",)),
        st.just(("reopen",)),
        st.just(("crash",)),
        st.tuples(st.just("torn"), st.integers(1, 21)),
    ),
    max_size=25,
)


def offsets_of(base, values, compression):
    """The offsets a consumer sees for the messages of one appended set."""
    if compression is not None:
        return [base + i for i in range(len(values))]  # inner message i reports the wrapper's offset + i
    offsets = []
    for value in values:
        offsets.append(base)
        base += 22 + len(value)
    return offsets


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.integers(1, 4))
def test_reads_back_what_was_appended_and_flushed(ops, flush_every):
    config = CONFIG.replace(flush_messages=flush_every * 3)
    with tempfile.TemporaryDirectory() as directory:
        log = PartitionLog(directory, config)
        appended = []  # (base offset, values, compression) in order
        try:
            for op in ops:
                if op[0] == "append":
                    _, values, compression = op
                    end = log.log_end_offset
                    base = log.append(encode_message_set(values, timestamp_ms=5, compression=compression))
                    assert base == end
                    appended.append((base, values, compression))
                elif op[0] == "flush":
                    log.flush()
                    assert log.high_watermark == log.log_end_offset
                elif op[0] == "reopen":
                    log.close()
                    log = PartitionLog(directory, config)
                    assert log.recovery_reports == []
                else:  # a crash: no flush, maybe a write cut short
                    crash(log)
                    end = log.log_end_offset
                    active = log.segment_bases[-1]
                    if op[0] == "torn":
                        with open(os.path.join(directory, f"{active:020d}.log"), "ab") as f:
                            f.write(encode_message_set([b"lost" * 10], timestamp_ms=1)[: op[1]])
                    log = PartitionLog(directory, config)
                    assert log.log_end_offset == end
                    assert len(log.recovery_reports) == (op[0] == "torn")
                hw = log.high_watermark
                assert log.segment_bases == sorted(log.segment_bases)
                visible = [a for a in appended if a[0] < hw]
                records = read_all(log)
                assert [r[3] for r in records] == [v for _, values, _ in visible for v in values]
                assert [r[0] for r in records] == [o for a in visible for o in offsets_of(*a)]
        finally:
            log.close()
