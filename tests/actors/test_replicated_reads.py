"""Bounded reads of a replicated topic on a real multi-node Ray cluster
(three disk nodes, RF 3) and a real ZooKeeper, in one child script: the
plan lists the in-sync candidates with their Ray nodes (the leader's node
is the range's locality); a read through a follower gives the leader's
bytes; a follower never serves past the high watermark it learned (one ISR
member stalled, another has more bytes than it may serve); Ray Data's
``read_raylog`` returns every message once; after the leader's node is
lost, the ranges planned before still read the same rows (and Ray Data too),
and a new plan names the new leader's node (not the placement's).

The Spark reader's replica choice is covered in
tests/integrations/spark/test_range_reader.py (RayDP on this cluster would
cost minutes)."""

from __future__ import annotations

import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys, time
    import ray
    from ray.cluster_utils import Cluster

    from raylog.actors.partition import actor_name
    from raylog.client import Client
    from raylog.config import NAMESPACE
    from raylog.read import plan_read, read_range, read_raylog
    from raylog.read.datasource import task_replicas
    from raylog.replication.assignment import replica_actor_name
    from raylog.replication.state import read_state
    from raylog.retry import RetryPolicy
    from raylog.testing.clusters import start_disk_nodes, wait_until
    from raylog.testing.faults import resume_process, stop_process

    zookeeper, cluster_name, data_dir = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    out = {}
    fallbacks = []

    class Count(logging.Handler):
        def emit(self, record):
            if "reading from the leader" in record.getMessage():
                fallbacks.append(record.getMessage())

    logging.getLogger("raylog.read.reader").addHandler(Count())
    logging.getLogger("raylog.read.reader").setLevel(logging.INFO)

    def rows(batches):
        return [[b.column(3)[i].as_py(), b.column(4)[i].as_py(), b.column(1)[i].as_py().decode()]
                for b in batches for i in range(b.num_rows)]

    try:
        nodes = start_disk_nodes(cluster, ("disk-a", "disk-b", "disk-c"))
        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        zk, paths = client.registry.zk, client.registry.paths
        client.create_topic("rr", partitions=3, replication_factor=3, min_insync_replicas=2,
                            replica_lag_ms=6000, flush_ms=5)
        producer = client.producer(acks="all")
        for i in range(300):
            producer.send("rr", b"v%03d" % i, key=b"k%d" % (i % 11))
        producer.flush()

        def actor(p, node):
            first = read_state(zk, paths, "rr", p)[0].replicas[0]
            return ray.get_actor(replica_actor_name(actor_name(cluster_name, "rr", p), node, first),
                                 namespace=NAMESPACE)

        def served(p, node):
            return ray.get(actor(p, node).replica_status.remote(), timeout=30).get("served_high_watermark")

        hws = {p: client.offsets("rr", p)[1] for p in range(3)}
        leaders = {p: read_state(zk, paths, "rr", p)[0].leader for p in range(3)}
        out["followers_learned"] = wait_until(lambda: all(
            served(p, n) == hws[p] for p in range(3) for n in ("disk-a", "disk-b", "disk-c") if n != leaders[p]))

        # The plan: per range, the candidates (leader first) with their Ray nodes; locality = the leader's node.
        plan = plan_read("rr", client=client)
        ray_node = {n: ray.get(actor(0, n).node_id.remote()) for n in ("disk-a", "disk-b", "disk-c")}
        out["plan"] = [{
            "partition": r.partition, "end": r.end, "hw": hws[r.partition], "leader": leaders[r.partition],
            "candidates": [c.node for c in r.replicas], "first_is_leader": r.replicas[0].leader,
            "nodes_match": all(c.node_id == ray_node[c.node] for c in r.replicas),
            "locality_is_leader": r.node_id == ray_node[leaders[r.partition]],
            "endpoints": len({(c.host, c.port) for c in r.replicas}),
        } for r in plan.ranges]

        # Each range through each follower: the leader's rows, and the same raw bytes.
        by_leader = {r.partition: rows(read_range(r, plan.settings, replica=None)) for r in plan.ranges}
        same, raw_same = [], []
        for r in plan.ranges:
            for c in r.replicas[1:]:
                same.append(rows(read_range(r, plan.settings, replica=c.node)) == by_leader[r.partition])
                with plan.settings.broker_connection(c.host, c.port) as f, \\
                        plan.settings.broker_connection(r.host, r.port) as l:
                    raw_same.append(bytes(f.fetch("rr", r.partition, r.start, r.size).data)
                                    == bytes(l.fetch("rr", r.partition, r.start, r.size).data))
        out["through_followers"] = [same, raw_same, len(fallbacks)]
        out["leader_rows"] = sum(len(v) for v in by_leader.values())

        # Ray Data: every message once (tasks read from their assigned replicas).
        out["assigned_followers"] = sum(1 for _, c in task_replicas(plan) if c is not None and not c.leader)
        ds_rows = sorted([[r["partition"], r["offset"], r["value"].decode()] for r in read_raylog("rr", plan=plan).take_all()])
        expected = sorted(row for v in by_leader.values() for row in v)
        out["ray_data"] = [len(ds_rows), ds_rows == expected, sorted(v for _, _, v in ds_rows) == ["v%03d" % i for i in range(300)]]

        # A follower never serves past what it learned: one follower of partition 0 stalls (still in the
        # ISR for replica_lag_ms), so the committed offset stays; the other replicates more (acks=1) than
        # it may serve.
        p = 0
        stalled, keeper = [n for n in ("disk-a", "disk-b", "disk-c") if n != leaders[p]]
        stalled_pid = ray.get(actor(p, stalled).pid.remote())
        keeper_actor = actor(p, keeper)
        ones = client.producer(acks=1)
        try:
            stop_process(stalled_pid)
            for i in range(40):
                ones.send("rr", b"x%03d" % i, partition=p)
            ones.flush()
            status = {}
            def keeper_ahead():
                status.update(ray.get(keeper_actor.replica_status.remote()))
                return status["log_end_offset"] > status["served_high_watermark"]
            out["keeper_ahead"] = wait_until(keeper_ahead, 5)
            k = json.loads(zk.get(f"{paths.partition('rr', p)}/replicas/{keeper}")[0])
            with plan.settings.broker_connection(k["host"], k["port"]) as conn:
                start, latest = conn.offsets("rr", p)
                whole = conn.fetch("rr", p, 0, 1 << 20)
                above = conn.fetch("rr", p, latest, 1 << 20)
            committed = client.offsets("rr", p)[1]
            out["bounded"] = {"served": status["served_high_watermark"], "log_end": status["log_end_offset"],
                              "offsets_latest": latest, "fetched": len(whole.data), "above": len(above.data),
                              "reply_hw": whole.high_watermark, "committed": committed, "hw": hws[p]}
        finally:
            resume_process(stalled_pid)
        ones.close()

        # The leader of partition 0 is lost with its node: the ranges planned before read the same rows.
        old = leaders[p]
        old_pid = ray.get(actor(p, old).pid.remote())
        try:
            os.kill(old_pid, 9)
        except ProcessLookupError:
            pass
        cluster.remove_node(nodes[old], allow_graceful=False)
        out["new_leader"] = wait_until(lambda: read_state(zk, paths, "rr", p)[0].leader != old, 90)
        del fallbacks[:]
        after = {r.partition: rows(read_range(r, plan.settings)) for r in plan.ranges}
        through_lost = [rows(read_range(r, plan.settings, replica=old)) == by_leader[r.partition]
                        for r in plan.ranges if old in [c.node for c in r.replicas[1:]]]
        out["after_failover"] = [after == by_leader, through_lost]
        replanned = [r for r in plan_read("rr", client=client).ranges if r.partition == p][0]
        new = read_state(zk, paths, "rr", p)[0].leader
        out["replanned"] = [replanned.replicas[0].node == new, old not in [c.node for c in replanned.replicas],
                            replanned.node_id == ray.get(actor(p, new).node_id.remote())]
        ds_after = sorted([[r["partition"], r["offset"], r["value"].decode()] for r in read_raylog("rr", plan=plan).take_all()])
        out["ray_data_after"] = ds_after == expected
        producer.close()
        client.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


def test_reads_of_a_replicated_topic_through_followers_and_across_a_failover(run_cluster_script):
    out = run_cluster_script(SCRIPT)
    assert out["followers_learned"]
    for r in out["plan"]:
        assert sorted(r["candidates"]) == ["disk-a", "disk-b", "disk-c"] and r["candidates"][0] == r["leader"]
        assert r["first_is_leader"] and r["nodes_match"] and r["locality_is_leader"] and r["endpoints"] == 3
        assert r["end"] == r["hw"]
    same, raw_same, fallbacks = out["through_followers"]
    assert len(same) == 6 and all(same) and all(raw_same) and fallbacks == 0
    assert out["leader_rows"] == 300
    assert out["assigned_followers"] >= 1
    assert out["ray_data"] == [300, True, True]
    bounded = out["bounded"]
    assert out["keeper_ahead"], bounded
    # the keeper holds more than the committed offset it learned and serves only that
    assert bounded["served"] == bounded["offsets_latest"] == bounded["reply_hw"] == bounded["fetched"]
    assert bounded["served"] < bounded["log_end"] and bounded["above"] == 0
    assert bounded["served"] <= bounded["committed"]
    assert out["new_leader"]
    same_after, through_lost = out["after_failover"]
    assert same_after and through_lost and all(through_lost)
    assert out["ray_data_after"]
    assert out["replanned"] == [True, True, True]  # the new leader's node serves, the lost one is no candidate
