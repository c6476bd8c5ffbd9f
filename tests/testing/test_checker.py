"""The checker on hand-made histories: every anomaly is flagged under its
name, and nothing else is; clean histories (plain and compressed, with
rebalances, seeks, re-deliveries and faults) are valid."""

from __future__ import annotations

import pytest

from raylog.testing.checker import ANOMALIES, check


class H:
    """A small history builder: ``h.send(...)``, ``h.poll(...)`` ..."""

    def __init__(self):
        self.ops = []
        self.seq = {}
        self.t = 1000.0

    def _op(self, process, type, **fields):
        self.t += 0.01
        seq = self.seq.get(process, 0)
        self.seq[process] = seq + 1
        op = {"process": process, "seq": seq, "type": type, "t0": self.t, "t1": self.t, **fields}
        self.ops.append(op)
        return self

    def send(self, value, partition=0, offset=None, *, outcome="ok", acks="all", codec=None, process="producer-0", topic="t"):
        return self._op(process, "send", topic=topic, value=value, key=None, acks=acks, codec=codec,
                        outcome=outcome, partition=partition if outcome == "ok" else None,
                        offset=offset if outcome == "ok" else None, error=None)

    def poll(self, reads, process="consumer-0", topic="t"):
        """``reads``: ``[(partition, offset, value), ...]``"""
        return self._op(process, "poll", reads=[[topic, p, o, v] for p, o, v in reads], error=None)

    def assign(self, partitions, process="consumer-0", topic="t"):
        return self._op(process, "assign", partitions=[[topic, p] for p in partitions])

    def revoke(self, partitions, process="consumer-0", topic="t"):
        return self._op(process, "revoke", partitions=[[topic, p] for p in partitions])

    def seek(self, partition, offset, process="consumer-0", topic="t"):
        return self._op(process, "seek", topic=topic, partition=partition, offset=offset, reason="test")

    def fault(self, kind, **detail):
        return self._op("nemesis", "fault", kind=kind, target="x", detail=detail)

    def check(self, **kw):
        return check(self.ops, **kw)


def only(report, *names):
    """The report flags exactly ``names`` (and nothing else)."""
    flagged = {name for name, n in report["counts"].items() if n}
    assert flagged == set(names), report["anomalies"]


def clean_plain() -> H:
    """Two partitions, plain messages of 30 bytes each, two consumers, a
    rebalance that moves partition 1 and replays it from its commit."""
    h = H()
    for i in range(6):
        h.send(f"a{i}", 0, 30 * i)
        h.send(f"b{i}", 1, 30 * i, acks="1")
    h.assign([0, 1])
    h.poll([(0, 0, "a0"), (0, 30, "a1"), (1, 0, "b0")])
    h.poll([(0, 60, "a2"), (1, 30, "b1"), (1, 60, "b2")])
    h.revoke([1])
    h.assign([1], process="consumer-1")
    # replayed from the committed offset 30: a delivery duplicate, allowed
    h.poll([(1, 30, "b1"), (1, 60, "b2"), (1, 90, "b3")], process="consumer-1")
    h.poll([(0, 90, "a3"), (0, 120, "a4"), (0, 150, "a5")])
    h.poll([(1, 120, "b4"), (1, 150, "b5")], process="consumer-1")
    return h


def clean_compressed() -> H:
    """Wrappers of three values at offsets 0, 100, 200; a consumer that reads
    part of a wrapper, is revoked, and re-reads it from the start."""
    h = H()
    for w, base in enumerate((0, 100, 200)):
        for i in range(3):
            h.send(f"w{w}.{i}", 0, base, codec="zstd")
    h.assign([0])
    h.poll([(0, 0, "w0.0"), (0, 0, "w0.1")])  # max_messages cut the wrapper
    h.poll([(0, 0, "w0.2"), (0, 100, "w1.0")])
    h.revoke([0])
    h.assign([0])
    h.poll([(0, 100, "w1.0"), (0, 100, "w1.1"), (0, 100, "w1.2"), (0, 200, "w2.0")])
    h.poll([(0, 200, "w2.1"), (0, 200, "w2.2")])
    return h


def test_clean_plain_history_is_valid_and_counts_redeliveries():
    report = clean_plain().check()
    assert report["valid"], report
    only(report)
    assert report["delivery_duplicates"] == {"values": 2, "extra_deliveries": 2}
    assert report["operations"]["sends"] == 12 and report["operations"]["reads"] == 14


def test_clean_compressed_history_is_valid():
    report = clean_compressed().check()
    assert report["valid"], report
    only(report)
    assert report["delivery_duplicates"]["values"] == 1


def test_seek_back_starts_a_new_stream():
    h = clean_plain()
    h.seek(0, 0)
    h.poll([(0, 0, "a0"), (0, 30, "a1")])
    only(h.check())


def test_consumer_restart_starts_a_new_stream():
    h = clean_plain()
    h._op("consumer-0.2", "start")
    h.assign([0], process="consumer-0.2")
    h.poll([(0, 60, "a2")], process="consumer-0.2")
    only(h.check())


def test_failed_and_unknown_sends_may_be_read_or_not():
    h = clean_plain()
    h.send("f0", outcome="failed").send("u0", outcome="unknown").send("u1", outcome="unknown")
    h.poll([(0, 180, "u0")])
    report = h.check()
    only(report)
    assert report["unknown_read"] == 1 and report["failed_but_read"] == 0


# -- each anomaly ------------------------------------------------------------


def test_lost_write():
    h = H()
    h.send("x0", 0, 0).send("x1", 0, 30).send("x2", 0, 60)
    h.assign([0])
    h.poll([(0, 0, "x0")]).seek(0, 60).poll([(0, 60, "x2")])  # x1 skipped by a seek: lost
    report = h.check()
    only(report, "lost-write")
    assert report["anomalies"]["lost-write"][0]["value"] == "x1"
    assert not report["valid"]


def test_unseen_is_forbidden_for_acks_all_only():
    h = H()
    h.send("x0", 0, 0).send("x1", 0, 30, acks="1").send("x2", 0, 60, acks="all")
    h.assign([0])
    h.poll([(0, 0, "x0")])
    report = h.check()
    only(report, "unseen")
    assert report["unseen_by_acks"] == {"1": 1, "all": 1}
    assert report["forbidden"] == {"unseen": 1}

    h = H()
    h.send("x0", 0, 0).send("x1", 0, 30, acks="1")
    h.assign([0])
    h.poll([(0, 0, "x0")])
    report = h.check()
    only(report, "unseen")
    assert report["valid"]  # unseen with acks=1 is reported, not forbidden
    assert not h.check(forbid_unseen_acks=("1", "all"))["valid"]


def test_duplicate_value_read_at_two_offsets():
    h = H()
    h.send("x0", 0, 0).send("x1", 0, 30)
    h.assign([0])
    h.poll([(0, 0, "x0"), (0, 30, "x1"), (0, 60, "x1")])  # retried set stored twice
    report = h.check()
    only(report, "duplicate")
    assert report["anomalies"]["duplicate"][0]["value"] == "x1"


def test_duplicate_acknowledged_here_read_there():
    h = H()
    h.send("x0", 0, 0).send("x1", 0, 30)
    h.assign([0])
    h.poll([(0, 0, "x0")])
    h.poll([(1, 0, "x1")])  # acknowledged on partition 0, read on 1
    report = h.check()
    only(report, "duplicate")


def test_duplicate_across_consumers_in_compressed_wrappers():
    h = H()
    for i in range(2):
        h.send(f"w0.{i}", 0, 0, codec="lz4", process="producer-1")
    h.assign([0])
    h.poll([(0, 0, "w0.0"), (0, 0, "w0.1"), (0, 50, "w0.0"), (0, 50, "w0.1")])
    only(h.check(), "duplicate")


def test_inconsistent_offsets_two_reads():
    h = H()
    h.send("x0", 0, 0).send("y0", outcome="unknown")
    h.assign([0])
    h.assign([0], process="consumer-1")
    h.poll([(0, 0, "x0")])
    h.poll([(0, 0, "y0")], process="consumer-1")  # another value at the same position
    report = h.check()
    only(report, "inconsistent-offsets")


def test_inconsistent_offsets_two_acknowledgements():
    h = H()
    h.send("x0", 0, 0, process="producer-0").send("y0", 0, 0, process="producer-1")
    h.assign([0])
    h.poll([(0, 0, "x0"), (0, 30, "y0")])  # acknowledged at 0, read at 30: also a duplicate
    report = h.check()
    only(report, "inconsistent-offsets", "duplicate")
    # plain messages of one producer at one offset
    h = H()
    h.send("x0", 0, 0).send("x1", 0, 0)
    report = h.check()
    assert report["counts"]["inconsistent-offsets"] == 1


def test_inconsistent_offsets_acknowledgement_and_read():
    h = H()
    h.send("x0", 0, 0).send("y0", outcome="unknown")
    h.assign([0])
    h.poll([(0, 0, "y0")])  # x0 was acknowledged at 0, y0 is read there
    report = h.check()
    assert report["counts"]["inconsistent-offsets"] == 1
    only(report, "inconsistent-offsets", "unseen")


def test_nonmonotonic_poll_across_polls():
    h = H()
    for i in range(3):
        h.send(f"x{i}", 0, 30 * i)
    h.assign([0])
    h.poll([(0, 0, "x0"), (0, 30, "x1")])
    h.poll([(0, 30, "x1"), (0, 60, "x2")])  # went back without a rebalance or seek
    report = h.check()
    only(report, "nonmonotonic-poll")
    assert report["anomalies"]["nonmonotonic-poll"][0]["previous"] == [30, 0]


def test_nonmonotonic_poll_within_a_poll():
    h = H()
    for i in range(3):
        h.send(f"x{i}", 0, 30 * i)
    h.assign([0])
    h.poll([(0, 0, "x0"), (0, 60, "x2"), (0, 30, "x1")])
    report = h.check()
    # backwards from 60 to 30; and 0 -> 60 skipped 30
    only(report, "nonmonotonic-poll", "poll-skip")


def test_nonmonotonic_poll_rereading_a_wrapper_without_rebalance():
    h = clean_compressed()
    h.poll([(0, 200, "w2.0")])  # the wrapper again, from its start, without a rebalance
    only(h.check(), "nonmonotonic-poll")


def test_other_consumers_rebalance_does_not_reset_this_one():
    h = clean_plain()
    h.revoke([0], process="consumer-1")
    h.poll([(0, 120, "a4")])  # consumer-0 was not revoked: 150 -> 120 is backwards
    only(h.check(), "nonmonotonic-poll")


def test_poll_skip_plain():
    h = H()
    for i in range(4):
        h.send(f"x{i}", 0, 30 * i)
    h.assign([0])
    h.assign([0], process="consumer-1")
    h.poll([(0, 0, "x0"), (0, 30, "x1"), (0, 60, "x2"), (0, 90, "x3")], process="consumer-1")
    h.poll([(0, 0, "x0")])
    h.poll([(0, 60, "x2"), (0, 90, "x3")])  # jumped over 30, which consumer-1 read
    report = h.check()
    only(report, "poll-skip")
    assert report["anomalies"]["poll-skip"][0]["skipped"] == [[30, 0]]


def test_poll_skip_of_an_acknowledged_position_is_also_a_lost_write():
    h = H()
    for i in range(3):
        h.send(f"x{i}", 0, 30 * i)
    h.assign([0])
    h.poll([(0, 0, "x0"), (0, 60, "x2")])
    only(h.check(), "poll-skip", "lost-write")


def test_lossy_acks_lost_at_a_leader_change_are_counted_not_forbidden():
    """Replicated: an acks=1 set the followers had not fetched is truncated
    when a follower takes over, and the next set takes its offset."""
    def history() -> H:
        h = H()
        h.send("x0", 0, 0).send("x1", 0, 30, acks="1", process="producer-1")  # x1 only on the old leader
        h.send("y1", 0, 30, acks="1", process="producer-2")  # the new leader's set at the same offset
        h.send("x2", 0, 60).send("x3", 0, 90, acks="1", process="producer-1")  # x3 never read, nothing after
        h.assign([0])
        h.poll([(0, 0, "x0"), (0, 30, "y1"), (0, 60, "x2")])
        return h

    strict = history().check()
    only(strict, "lost-write", "inconsistent-offsets", "unseen")
    assert not strict["valid"]
    report = history().check(lossy_acks=("1",))
    assert report["valid"], report["forbidden"]
    assert report["lost_by_acks"] == {"1": 1} and report["unseen_by_acks"] == {"1": 1}
    only(report, "lost-write", "unseen")  # still reported


def test_lossy_acks_do_not_excuse_acks_all_or_a_duplicate():
    h = H()
    h.send("x0", 0, 0).send("x1", 0, 30, acks="all").send("x2", 0, 60, acks="1")
    h.assign([0])
    h.poll([(0, 0, "x0"), (0, 60, "x2"), (0, 90, "x2")])
    report = h.check(lossy_acks=("1",))
    assert report["lost_by_acks"] == {"all": 1}
    assert set(report["forbidden"]) == {"lost-write", "duplicate", "poll-skip"}


def test_poll_skip_rest_of_a_wrapper():
    h = H()
    for i in range(3):
        h.send(f"w0.{i}", 0, 0, codec="gzip")
    h.send("w1.0", 0, 100, codec="gzip")
    h.assign([0], process="consumer-1")
    h.poll([(0, 0, "w0.0"), (0, 0, "w0.1"), (0, 0, "w0.2"), (0, 100, "w1.0")], process="consumer-1")
    h.assign([0])
    h.poll([(0, 0, "w0.0"), (0, 100, "w1.0")])  # left w0.1 and w0.2 out
    report = h.check()
    only(report, "poll-skip")
    assert report["anomalies"]["poll-skip"][0]["skipped_count"] == 2


def test_garbage_read():
    h = clean_plain()
    h.poll([(1, 180, "never-sent")], process="consumer-1")
    only(h.check(), "garbage-read")


def test_flip_byte_destroys_instead_of_losing():
    h = H()
    for i in range(3):
        h.send(f"x{i}", 0, 30 * i)
    h.fault("flip-byte", topic="t", partition=0, offset=30, detected=True)
    h.assign([0])
    h.poll([(0, 0, "x0")]).seek(0, 60).poll([(0, 60, "x2")])
    report = h.check()
    only(report)
    assert report["destroyed_by_faults"] == 1 and report["faults"] == {"flip-byte": 1}
    assert report["flipped_bytes"] == {"detected": 1}


def test_every_anomaly_has_a_test():
    tested = {
        "lost-write", "unseen", "duplicate", "inconsistent-offsets", "nonmonotonic-poll", "poll-skip", "garbage-read",
    }
    assert tested == set(ANOMALIES)


@pytest.mark.parametrize("build", [clean_plain, clean_compressed])
def test_longest_unread_and_latency_are_reported(build):
    report = build().check()
    assert report["longest_unread_s"]["max"] > 0
    assert report["latency_s"]["max"] >= 0
