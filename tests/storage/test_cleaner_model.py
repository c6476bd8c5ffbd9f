"""The cleaner against a model (hypothesis): random writes and deletes
(tombstones) over a few keys, in batches, with cleaning passes (small or
large maps) between them; after each, a reader from the log start gets
offsets that only grow, every record it gets was written at that offset,
and, for each key, the model's latest record (a deleted key: its tombstone,
or nothing once delete_retention_ms has passed)."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raylog.config import TopicConfig
from raylog.storage.log import PartitionLog
from raylog.storage.offsetmap import ENTRY_BYTES
from raylog.storage.record_batch import encode_batch

from test_cleaner import read_all

CONFIG = TopicConfig(cleanup_policy="compact", flush_messages=1, flush_ms=10**9, segment_bytes=400,
                     max_message_bytes=400, delete_retention_ms=1000)

record = st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e"]), st.one_of(st.none(), st.binary(max_size=8)))
step = st.one_of(
    st.lists(record, min_size=1, max_size=5).map(lambda batch: ("write", batch)),
    st.tuples(st.just("clean"), st.sampled_from([1, 3, 100]), st.booleans()),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=30))
def test_a_reader_from_the_start_sees_the_latest_record_of_each_key(steps):
    with tempfile.TemporaryDirectory() as directory, PartitionLog(directory, CONFIG) as log:
        written = {}
        latest = {}
        may_be_gone = set()  # tombstones a pass after delete_retention_ms may have removed
        for item in steps:
            if item[0] == "write":
                batch = item[1]
                base = log.append(encode_batch([v for _k, v in batch], keys=[k for k, _v in batch],
                                               timestamp_ms=1000))
                for i, (key, value) in enumerate(batch):
                    written[base + i] = (key, value)
                    latest[key] = base + i
                log.flush()
                continue
            _, keys, late = item
            if late:
                may_be_gone |= {o for o in latest.values() if written[o][1] is None}
            log.clean(now_ms=10**13 if late else 1500, buffer_bytes=ENTRY_BYTES * (keys + 1), force=True)
            got = read_all(log)
            offsets = [o for o, _k, _v in got]
            assert offsets == sorted(set(offsets))
            assert all(written[o] == (k, v) for o, k, v in got)
            present = set(offsets)
            for key, offset in latest.items():
                if offset not in may_be_gone:
                    assert offset in present, (key, offset)
            # no removed record comes back: a later read sees a subset
            assert present <= {o for o, _k, _v in read_all(log)}
