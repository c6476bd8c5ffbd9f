"""The transactional checker on hand-made histories: a valid history is
VALID, and each anomaly of Jepsen's Kafka workload is found (one test per
anomaly, each with a history that has it and only it)."""

from __future__ import annotations

from raylog.testing.txn_checker import (
    ABORTED_READ, ANOMALIES, DUPLICATE, FINAL_INCOMPLETE, HUNG_TRANSACTION, INCONSISTENT_OFFSET, INTERMEDIATE_READ,
    LOST_WRITE, NONMONOTONIC_POLL, NONMONOTONIC_SEND, OFFSETS, POLL_SKIP, WRITE_CYCLE, ZOMBIE_COMMIT, check,
    strongly_connected,
)

TOPIC = "txn"


class History:
    """Builds a history: writers' transactions, readers' polls, the final read."""

    def __init__(self):
        self.ops = []
        self.seq = {}
        self.n = {}
        self.finals = {}

    def _op(self, process, type, t0, t1=None, **fields):
        seq = self.seq.get(process, 0)
        self.seq[process] = seq + 1
        op = {"process": process, "seq": seq, "type": type, "t0": t0, "t1": t0 if t1 is None else t1, **fields}
        self.ops.append(op)
        return op

    def txn(self, writer, writes, *, outcome="committed", intent=None, t0=0.0, t1=None, offsets=None, end=True,
            **extra):
        """``writes``: ``[(partition, offset or None), ...]``; returns the values."""
        n = self.n.get(writer, 0)
        self.n[writer] = n + 1
        txn = f"{writer}-t{n}"
        t1 = t0 + 1.0 if t1 is None else t1
        intent = intent or ("abort" if outcome == "aborted" else "commit")
        self._op(writer, "txn", t0, phase="begin", txn=txn, intent=intent, partitions=[p for p, _ in writes],
                 offsets=offsets, kill=False)
        values = []
        for i, (p, offset) in enumerate(writes):
            value = f"{txn}-{i}"
            values.append(value)
            if end:
                ok = offset is not None
                self._op(writer, "send", t0, t0 + 0.1, topic=TOPIC, txn=txn, value=value, outcome="ok" if ok else
                         "unknown", partition=p if ok else None, offset=offset)
        if end:
            self._op(writer, "txn", t0, t1, phase="end", txn=txn, intent=intent, outcome=outcome, values=values,
                     offsets=offsets, error=None, **extra)
        return values

    def poll(self, reader, reads, *, t=50.0):
        """``reads``: ``[(partition, offset, value), ...]``."""
        self._op(reader, "poll", t, reads=[[TOPIC, p, o, v] for p, o, v in reads], error=None)

    def seek(self, reader, partition, offset, t=50.0):
        self._op(reader, "seek", t, topic=TOPIC, partition=partition, offset=offset, reason="new consumer")

    def final(self, partition, reads, *, hw=None, lso=None, complete=True, t=100.0):
        end = (max((o for o, _ in reads), default=-1) + 10) if hw is None else hw
        self._op("final-reader", "final", t, what="read", topic=TOPIC, partition=partition, hw=end,
                 lso=end if lso is None else lso, position=end, reads=[list(r) for r in reads], complete=complete)

    def state(self, transactional_id, state, t=101.0):
        self._op("final-reader", "final", t, what="txn-state", transactional_id=transactional_id, state=state,
                 error=None)

    def offsets(self, offsets, *, t=102.0, final=True):
        if final:
            self._op("final-reader", "final", t, what="offsets", offsets=offsets)
        else:
            self._op("offsets-watch", "offsets", t, offsets=offsets)


RC, RU = "reader-read-committed", "reader-read-uncommitted"


def only(report, name):
    """The report found ``name`` and nothing else."""
    assert report["counts"][name] > 0, report
    others = {k: v for k, v in report["counts"].items() if k != name and v}
    assert not others, (others, report["examples"])
    assert report["forbidden"] == [name] and not report["valid"]
    return report["examples"][name]


def valid_history() -> History:
    h = History()
    a = h.txn("w0", [(0, 0), (1, 0)], t0=0.0, offsets={"txn-input-w0": 1})
    b = h.txn("w0", [(0, 10)], outcome="aborted", t0=2.0, offsets={"txn-input-w0": 2})
    c = h.txn("w1", [(0, 20), (0, 30), (1, 10)], t0=4.0)
    u = h.txn("w1", [(1, 20)], outcome="unknown", t0=6.0)  # committed after all: the final read has it
    h.poll(RC, [(0, 0, a[0]), (1, 0, a[1])], t=1.5)
    h.poll(RC, [(0, 20, c[0]), (0, 30, c[1]), (1, 10, c[2]), (1, 20, u[0])], t=8.0)
    h.poll(RU, [(0, 0, a[0]), (0, 10, b[0]), (0, 20, c[0]), (0, 30, c[1])], t=8.0)
    h.final(0, [(0, a[0]), (20, c[0]), (30, c[1])])
    h.final(1, [(0, a[1]), (10, c[2]), (20, u[0])])
    h.state("w0", "CompleteAbort")
    h.state("w1", "CompleteCommit")
    h.offsets({"txn-input-w0": 1}, t=3.0, final=False)
    h.offsets({"txn-input-w0": 1})
    return h


def test_a_valid_history_is_valid():
    report = check(valid_history().ops)
    assert report["valid"], (report["counts"], report["examples"])
    assert set(report["counts"]) == set(ANOMALIES)
    ops = report["operations"]
    assert ops["transactions"] == 4 and ops["unknown_resolved"] == {"unknown->committed": 1}
    assert ops["committed_values"] == 6


def test_lost_write_a_committed_value_absent_from_the_final_read():
    h = History()
    a = h.txn("w0", [(0, 0), (1, 0)])
    h.final(0, [(0, a[0])])
    h.final(1, [], hw=10)  # a[1] was committed at 1/0 and is gone
    examples = only(check(h.ops), LOST_WRITE)
    assert examples[0]["value"] == a[1]


def test_duplicate_a_value_read_at_two_offsets():
    h = History()
    a = h.txn("w0", [(0, 0)])
    h.poll(RC, [(0, 0, a[0])])
    h.seek(RC, 0, 0)
    h.poll(RC, [(0, 40, a[0])])  # the same value again, elsewhere
    h.final(0, [(0, a[0])], hw=50)
    examples = only(check(h.ops), DUPLICATE)
    assert examples[0]["at"] == [[0, 0], [0, 40]] or examples[0]["at"] == [(0, 0), (0, 40)]


def test_inconsistent_offset_one_offset_read_with_two_values():
    h = History()
    a = h.txn("w0", [(0, 0)])
    b = h.txn("w1", [(0, None)], outcome="unknown")  # its commit unanswered; the final read holds it
    h.poll(RU, [(0, 0, b[0])])  # read at a's offset
    h.final(0, [(0, a[0]), (10, b[0])])
    report = check(h.ops)
    assert report["counts"][INCONSISTENT_OFFSET] == 1, report
    assert report["counts"][DUPLICATE] == 1  # b read at 0 and at 10


def test_aborted_read_g1a_an_aborted_value_seen_read_committed():
    h = History()
    a = h.txn("w0", [(0, 0)], outcome="aborted")
    h.poll(RC, [(0, 0, a[0])])
    h.final(0, [], hw=10)
    examples = only(check(h.ops), ABORTED_READ)
    assert examples[0]["value"] == a[0]


def test_aborted_read_of_a_dropped_producer_s_transaction_and_of_an_unknown_one_the_final_read_lacks():
    h = History()
    dropped = h.txn("w0", [(0, 0)], outcome="not-committed")
    unknown = h.txn("w1", [(0, 10), (1, 0)], outcome="unknown")
    h.poll(RC, [(0, 0, dropped[0]), (0, 10, unknown[0])])
    h.final(0, [], hw=20)
    h.final(1, [], hw=10)
    report = check(h.ops)
    assert report["counts"][ABORTED_READ] == 2, report
    assert report["operations"]["unknown_resolved"] == {"unknown->aborted": 1}


def test_intermediate_read_g1b_part_of_a_transaction_in_a_partition():
    h = History()
    a = h.txn("w0", [(0, 0), (0, 10), (0, 20)])
    b = h.txn("w1", [(0, 30)], t0=3.0)
    h.poll(RC, [(0, 0, a[0]), (0, 20, a[2]), (0, 30, b[0])])  # a[1] at 10 passed over
    h.final(0, [(0, a[0]), (10, a[1]), (20, a[2]), (30, b[0])])
    examples = only(check(h.ops), INTERMEDIATE_READ)
    assert examples[0]["missed"] == a[1]


def test_poll_skip_a_committed_value_passed_over():
    h = History()
    a = h.txn("w0", [(0, 0)])
    b = h.txn("w1", [(0, 10)], t0=2.0)
    c = h.txn("w0", [(0, 20)], t0=4.0)
    h.poll(RC, [(0, 0, a[0]), (0, 20, c[0])])  # b skipped
    h.final(0, [(0, a[0]), (10, b[0]), (20, c[0])])
    examples = only(check(h.ops), POLL_SKIP)
    assert examples[0]["value"] == b[0]


def test_poll_skip_read_uncommitted_passes_over_an_aborted_value():
    h = History()
    a = h.txn("w0", [(0, 0)])
    b = h.txn("w1", [(0, 10)], outcome="aborted", t0=2.0)
    c = h.txn("w0", [(0, 20)], t0=4.0)
    h.poll(RU, [(0, 0, a[0]), (0, 20, c[0])])  # read_uncommitted hands out aborted records too
    h.final(0, [(0, a[0]), (20, c[0])])
    examples = only(check(h.ops), POLL_SKIP)
    assert examples[0]["value"] == b[0]


def test_nonmonotonic_poll_offsets_going_back_without_a_seek():
    h = History()
    a = h.txn("w0", [(0, 0)])
    b = h.txn("w0", [(0, 10)], t0=2.0)
    h.poll(RC, [(0, 0, a[0]), (0, 10, b[0])])
    h.poll(RC, [(0, 0, a[0])], t=60.0)  # back to 0, no seek
    h.final(0, [(0, a[0]), (10, b[0])])
    only(check(h.ops), NONMONOTONIC_POLL)


def test_a_seek_starts_a_new_stream():
    h = History()
    a = h.txn("w0", [(0, 0)])
    b = h.txn("w0", [(0, 10)], t0=2.0)
    h.poll(RC, [(0, 0, a[0]), (0, 10, b[0])])
    h.seek(RC, 0, 0, t=55.0)
    h.poll(RC, [(0, 0, a[0])], t=60.0)
    h.final(0, [(0, a[0]), (10, b[0])])
    report = check(h.ops)
    assert report["valid"], report["examples"]


def test_nonmonotonic_send_a_writer_s_acknowledged_offsets_going_back():
    h = History()
    a = h.txn("w0", [(0, 20)])
    b = h.txn("w0", [(0, 10)], t0=0.5, t1=0.9)
    h.final(0, [(10, b[0]), (20, a[0])])
    report = check(h.ops)
    assert report["counts"][NONMONOTONIC_SEND] == 1, report


def test_write_cycle_a_write_below_that_of_a_transaction_committed_before_it_began():
    h = History()
    a = h.txn("w0", [(0, 20)], t0=0.0, t1=1.0)
    b = h.txn("w1", [(0, 10)], t0=2.0, t1=3.0)  # began after a committed, stored below it
    h.final(0, [(10, b[0]), (20, a[0])])
    examples = only(check(h.ops), WRITE_CYCLE)
    assert examples[0]["txn"] == "w1-t0" and examples[0]["above_txn"] == "w0-t0"


def test_write_cycles_of_overlapping_transactions_are_counted_not_forbidden():
    h = History()
    a = h.txn("w0", [(0, 0), (1, 10)], t0=0.0, t1=5.0)
    b = h.txn("w1", [(1, 0), (0, 10)], t0=0.0, t1=5.0)  # a before b in 0, b before a in 1
    h.final(0, [(0, a[0]), (10, b[1])])
    h.final(1, [(0, b[0]), (10, a[1])])
    report = check(h.ops)
    assert report["valid"], report["examples"]
    assert report["write_cycles_concurrent"] == 1
    assert report["write_cycle_example"] == ["w0-t0", "w1-t0"]


def test_hung_transaction_the_last_stable_offset_stuck_below_the_high_watermark():
    h = History()
    a = h.txn("w0", [(0, 0)])
    h.final(0, [(0, a[0])], hw=50, lso=10)
    examples = only(check(h.ops), HUNG_TRANSACTION)
    assert examples[0]["lso"] == 10


def test_hung_transaction_an_open_record_at_the_coordinator_and_a_transaction_never_ended():
    h = History()
    a = h.txn("w0", [(0, 0)])
    h.txn("w1", [(0, None)], end=False)
    h.final(0, [(0, a[0])])
    h.state("w0", "Ongoing")
    report = check(h.ops)
    assert report["counts"][HUNG_TRANSACTION] == 2, report
    assert {e["what"] for e in report["examples"][HUNG_TRANSACTION]} == {
        "began and never ended", "the coordinator's record is not ended after the run"}


def test_offsets_of_an_aborted_transaction_visible():
    h = History()
    h.txn("w0", [(0, 0)], outcome="aborted", offsets={"txn-input-w0": 1})
    h.final(0, [], hw=10)
    h.offsets({"txn-input-w0": 1})
    examples = only(check(h.ops), OFFSETS)
    assert examples[0]["what"] == "an offset no committed transaction committed"


def test_offsets_of_a_committed_transaction_not_visible_once_it_completed():
    h = History()
    a = h.txn("w0", [(0, 0)], offsets={"txn-input-w0": 1}, t0=0.0, t1=1.0)
    b = h.txn("w0", [(0, 10)], t0=1.0, t1=4.0)  # passed the coordinator: a was complete by then
    h.final(0, [(0, a[0]), (10, b[0])])
    h.offsets({}, t=2.0, final=False)  # a acknowledged, maybe not complete yet: no anomaly
    h.offsets({}, t=5.0, final=False)
    examples = only(check(h.ops), OFFSETS)
    assert len(examples) == 1 and examples[0]["expected_at_least"] == 1 and examples[0]["read_at"] == 5.0


def test_offsets_of_a_committed_transaction_missing_from_the_final_read():
    h = History()
    a = h.txn("w0", [(0, 0)], offsets={"txn-input-w0": 1}, t0=0.0, t1=1.0)
    h.final(0, [(0, a[0])])
    h.offsets({"txn-input-w0": 1}, t=3.0, final=False)
    h.offsets({})
    examples = only(check(h.ops), OFFSETS)
    assert examples[0]["final"] is True


def test_zombie_commit_a_dropped_producer_s_commit_accepted():
    h = History()
    refused = h.txn("w0", [(0, 0)], outcome="not-committed", killed=True, zombie_commit="refused")
    accepted = h.txn("w0", [(0, 10)], outcome="not-committed", killed=True, zombie_commit="accepted", t0=2.0)
    h.final(0, [], hw=20)
    examples = only(check(h.ops), ZOMBIE_COMMIT)
    assert examples == [{"txn": "w0-t1", "writer": "w0"}]
    assert check(h.ops)["operations"]["zombie_commits_refused"] == 1
    assert refused and accepted


def test_final_incomplete_a_partition_not_read_to_its_end():
    h = History()
    a = h.txn("w0", [(0, 0)])
    h.final(0, [(0, a[0])], complete=False)
    only(check(h.ops), FINAL_INCOMPLETE)


def test_strongly_connected_components_of_a_graph():
    graph = {1: {2}, 2: {3}, 3: {1, 4}, 4: {5}, 5: {4}, 6: set()}
    components = sorted(sorted(c) for c in strongly_connected(graph))
    assert components == [[1, 2, 3], [4, 5], [6]]
    # deep: no recursion limit
    chain = {i: {i + 1} for i in range(5000)}
    chain[5000] = {0}
    assert [len(c) for c in strongly_connected(chain)] == [5001]
