"""Probes of bench/replication_steps.py (measurement only, never imported by
raylog): with this folder first on PYTHONPATH and RAYLOG_PROBE_DIR set, every
Python process of the bench's cluster (the driver, the partition actors)
wraps a few functions at start and appends one line per event to a file of
its own, ``<pid>.ev``: ``<time ns> <event> <fields>``. ``time.monotonic_ns``
is CLOCK_MONOTONIC, one clock for every process of the machine.

Events: ``round`` (driver: a producer's PRODUCE round; topic, its start,
first base offset, end), ``app`` (a log append; log, base, end), ``flush``
(a log flush; log, high watermark), ``rrecv``/``rapp`` (a replica append
called/returned; log, offset, end), ``serve`` (the leader read its log for a
follower; log, follower, offset, end), ``learn`` (the leader recorded a
follower's progress; log, follower, offset).
"""
import os

_dir = os.environ.get("RAYLOG_PROBE_DIR")
if _dir:
    import functools, threading, time
    _f = None
    _lock = threading.Lock()

    def ev(*fields):
        global _f
        line = " ".join(str(x) for x in fields) + "\n"
        with _lock:
            if _f is None:
                _f = open(os.path.join(_dir, f"{os.getpid()}.ev"), "a", buffering=1)
            _f.write(f"{time.monotonic_ns()} {line}")

    def _tag(log):
        d = getattr(log, "_dir", "") or ""
        return os.path.basename(os.path.dirname(d)) + "/" + os.path.basename(d)

    def install():
        from raylog.storage.log import PartitionLog
        orig_append, orig_seq, orig_flush, orig_rep = (PartitionLog.append, PartitionLog.append_sequenced,
                                                     PartitionLog.flush, PartitionLog.append_replica)

        def append(self, data, *a, **k):
            base = orig_append(self, data, *a, **k)
            ev("app", _tag(self), base, base + len(data))
            return base

        def append_sequenced(self, data, *a, **k):
            base = orig_seq(self, data, *a, **k)
            ev("app", _tag(self), base, base + len(data))
            return base

        def flush(self):
            r = orig_flush(self)
            ev("flush", _tag(self), self._hw)
            return r

        def append_replica(self, data, offset, *a, **k):
            ev("rrecv", _tag(self), offset, offset + len(data))
            r = orig_rep(self, data, offset, *a, **k)
            ev("rapp", _tag(self), offset, offset + len(data))
            return r

        PartitionLog.append, PartitionLog.append_sequenced = append, append_sequenced
        PartitionLog.flush, PartitionLog.append_replica = flush, append_replica

        from raylog.replication import leader as L
        for name in ("on_fetch", "record_progress"):  # (on_fetch: before REPLICA_FETCH)
            orig = getattr(L.Leader, name, None)
            if orig is None:
                continue

            def make(orig, name):
                def learn(self, follower, *a, **k):
                    ev("learn", _tag(self.log), follower, a[0] if name == "on_fetch" else a[1])
                    return orig(self, follower, *a, **k)
                return learn
            setattr(L.Leader, name, make(orig, name))
        RV = getattr(L, "ReplicaView", None)
        if RV is not None:
            orig_read = RV.read

            def read(self, offset, max_bytes):
                chunk = orig_read(self, offset, max_bytes)
                if chunk.length:
                    ev("serve", _tag(self._log), self._node, offset, offset + chunk.length)
                return chunk
            RV.read = read
        fetch_reads = getattr(L.Leader, "replica_read", None)
        if fetch_reads is not None:
            def rread(self, node, offset, max_bytes, *a, **k):
                answer = fetch_reads(self, node, offset, max_bytes, *a, **k)
                if answer.data.length:
                    ev("serve", _tag(self.log), node, offset, offset + answer.data.length)
                return answer
            L.Leader.replica_read = rread

        from raylog.transfer.connection import BrokerConnection
        orig_ps = BrokerConnection.produce_sets

        def produce_sets(self, topic, partition, sets, acks=1, **k):
            t0 = time.monotonic_ns()
            r = orig_ps(self, topic, partition, sets, acks, **k)
            bases = [x for x in (r or []) if isinstance(x, int)]
            if bases:
                ev("round", topic, t0, bases[0], bases[-1] + len(sets[-1]))
            return r
        BrokerConnection.produce_sets = produce_sets

    try:
        install()
    except Exception as err:  # noqa: BLE001
        ev("probe-failed", repr(err))
