"""Replication on a real multi-node Ray cluster (three disk nodes) and a
real ZooKeeper: replicas on distinct nodes, followers with byte-identical
logs, ``acks="all"`` through the ISR, and ``NotEnoughReplicasError`` below
``min_insync_replicas`` with the data already accepted intact; the leader's
node lost: an ISR member takes over (leader epoch + 1), nothing acknowledged
is lost, a set whose ack was lost with the leader is stored once (the
followers keep the idempotent producers' sequences), the old leader comes
back, truncates to the new epoch and rejoins; a follower whose node is lost
and comes back on the same disk catches up and rejoins the ISR.

The cluster runs in a child process of its own, as in test_multinode.py.
"""

from __future__ import annotations

import textwrap

from tests.doc_blocks import block


PREAMBLE = textwrap.dedent(
    """
    import glob, json, os, sys, time
    import ray
    from ray.cluster_utils import Cluster

    from raylog.client import Client
    from raylog.errors import ConfigError, NotEnoughReplicasError
    from raylog.retry import RetryPolicy
    from raylog.testing.clusters import disk_node_args, log_bytes, start_disk_nodes, wait_until

    zookeeper, cluster_name, data_dir = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    out = {}

    try:
        nodes = start_disk_nodes(cluster, ("disk-a", "disk-b", "disk-c"))
    """
)
EPILOGUE = textwrap.dedent(
    """
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


def script(body: str) -> str:
    """A child script: the three-node cluster, ``body`` (run inside its ``try``), then ``RESULT``."""
    return PREAMBLE + textwrap.indent(textwrap.dedent(body), "    ") + EPILOGUE


SCRIPT = script(
    """
        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        try:
            client.create_topic("toomany", replication_factor=4)
        except ConfigError as err:
            out["too_few_nodes"] = [type(err).__name__, str(err), err.retriable]
        out["toomany_exists"] = "toomany" in client.list_topics()

        # the replication example of docs/howto/replication.md, as written
        exec(README_EXAMPLE, {"client": client})
        out["readme_topic"] = [(len(p["replicas"]), len(p["isr"])) for p in client.describe_topic("payments")["partitions"]]
        client.delete_topic("payments")

        client.create_topic("r", partitions=1, replication_factor=3, min_insync_replicas=2, replica_lag_ms=1500,
                            flush_ms=5)
        producer = client.producer(acks="all")
        acked = [producer.send("r", b"v%d" % i).result(60) for i in range(200)]
        out["acked"] = len(acked)
        row = client.describe_topic("r")["partitions"][0]
        out["describe"] = {k: row.get(k) for k in ("leader", "leader_epoch", "replicas", "isr", "under_replicated")}
        end = acked[-1][1]
        out["all_caught_up"] = wait_until(
            lambda: set(client.describe_topic("r")["partitions"][0]["replica_log_end_offsets"].values())
            == {client.offsets("r", 0)[1]})
        leader_dir = client.registry.placement("r", 0)["log_dir"]
        dirs = [leader_dir] + sorted(glob.glob(leader_dir + "@*"))
        out["identical"] = [len(dirs), len({log_bytes(d) for d in dirs}), len(log_bytes(leader_dir))]

        # One follower's node goes: after replica_lag_ms the ISR shrinks to 2 and acks=all goes on.
        state = row
        followers = [n for n in state["replicas"] if n != state["leader"]]
        cluster.remove_node(nodes[followers[0]], allow_graceful=False)
        more = [producer.send("r", b"w%d" % i).result(60) for i in range(50)]
        out["acked_with_one_follower_gone"] = len(more)
        out["isr_after_one"] = wait_until(lambda: len(client.describe_topic("r")["partitions"][0]["isr"]) == 2)

        # The second follower goes: below min_insync_replicas acks=all fails, retriable.
        cluster.remove_node(nodes[followers[1]], allow_graceful=False)
        out["isr_after_two"] = wait_until(lambda: len(client.describe_topic("r")["partitions"][0]["isr"]) == 1)
        out["leader_status"] = ray.get(client.partition_actor("r", 0).replica_status.remote())
        strict = client.producer(acks="all", retry=RetryPolicy(max_tries=2, delay_s=0.1, deadline_s=10))
        try:
            strict.send("r", b"refused").result(60)
            out["refused"] = None
        except NotEnoughReplicasError as err:
            out["refused"] = [type(err).__name__, err.retriable]
        except Exception as err:
            out["refused"] = [type(err).__name__, str(err)]
        ones = client.producer(acks=1)
        ones.send("r", b"acks1").result(60)  # acks=1 still works on the leader

        consumer = client.consumer(["r"], group="g", auto_offset_reset="earliest")
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 250 and time.monotonic() < deadline:
            seen += [m.value for m in consumer.poll(timeout_ms=500)]
        out["seen_prefix_ok"] = seen[:250] == [b"v%d" % i for i in range(200)] + [b"w%d" % i for i in range(50)]
        out["seen"] = len(seen)
        for p in (producer, ones):
            p.close()
        try:
            strict.close()  # its refused message is reported once more
        except Exception:
            pass
        consumer.close()
        client.delete_topic("r")
        client.close()
    """
)


def _readme_example() -> str:
    """The replication example of docs/howto/replication.md (its first python block)."""
    return block("docs/howto/replication.md", "Replication")


def test_replicas_on_three_nodes_acks_all_and_not_enough_replicas(run_cluster_script):
    out = run_cluster_script(f"README_EXAMPLE = {_readme_example()!r}\n" + SCRIPT)

    assert out["readme_topic"] == [[3, 3]] * 4

    name, message, retriable = out["too_few_nodes"]
    assert name == "ConfigError" and "replication_factor 4" in message and not retriable
    assert not out["toomany_exists"]
    assert out["acked"] == 200
    described = out["describe"]
    assert described["leader_epoch"] == 0 and described["leader"] == described["replicas"][0]
    assert sorted(described["replicas"]) == ["disk-a", "disk-b", "disk-c"]
    assert sorted(described["isr"]) == ["disk-a", "disk-b", "disk-c"] and not described["under_replicated"]
    assert out["all_caught_up"]
    replicas, distinct, size = out["identical"]
    assert replicas == 3 and distinct == 1 and size > 0  # the same bytes at the same offsets
    assert out["acked_with_one_follower_gone"] == 50 and out["isr_after_one"]
    assert out["isr_after_two"]
    assert out["refused"] == ["NotEnoughReplicasError", True]
    assert out["seen_prefix_ok"], out["seen"]


FAILOVER = script(
    """
        from raylog.actors.partition import actor_name
        from raylog.testing.faults import resume_process, stop_process
        from raylog.config import NAMESPACE
        from raylog.replication.assignment import replica_actor_name, replica_log_dir
        from raylog.replication.state import read_state

        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        client.create_topic("f", replication_factor=3, min_insync_replicas=2, replica_lag_ms=5000, flush_ms=5)
        producer = client.producer(acks="all", retry=RetryPolicy(max_tries=200, delay_s=0.2, max_delay_s=1.0,
                                                                  deadline_s=90))
        acked = [producer.send("f", b"v%d" % i).result(60) for i in range(100)]
        before = client.describe_topic("f")["partitions"][0]
        leader_pid = ray.get(client.partition_actor("f", 0).pid.remote())

        # One follower stalls (SIGSTOP): the leader appends v100 and the other follower (the keeper)
        # replicates it, but acks="all" waits for the stalled ISR member, so v100's ack is still owed
        # when the leader's node is lost. The producer retries v100 at the keeper, which must answer
        # it as a duplicate (the sequences were replicated with the bytes), not store it again.
        first = before["replicas"][0]
        keeper, stalled = [n for n in before["replicas"] if n != before["leader"]]
        stalled_actor = ray.get_actor(replica_actor_name(actor_name(cluster_name, "f", 0), stalled, first),
                                      namespace=NAMESPACE)
        stalled_pid = ray.get(stalled_actor.pid.remote())
        keeper_dir = replica_log_dir(client.registry.placement("f", 0)["log_dir"], keeper, first)
        zk, paths = client.registry.zk, client.registry.paths
        try:
            stop_process(stalled_pid)
            size = len(log_bytes(keeper_dir))
            pending = producer.send("f", b"v100")
            out["replicated_unacked"] = [wait_until(lambda: len(log_bytes(keeper_dir)) > size), pending.done()]
            try:  # a lost node takes all its processes: the leader's too, at once
                os.kill(leader_pid, 9)
            except ProcessLookupError:
                pass
            cluster.remove_node(nodes[before["leader"]], allow_graceful=False)
            out["keeper_leads"] = wait_until(lambda: read_state(zk, paths, "f", 0)[0].leader == keeper, 90)
        finally:
            resume_process(stalled_pid)
        started = time.monotonic()
        acked.append(pending.result(120))
        acked += [producer.send("f", b"v%d" % i).result(120) for i in range(101, 200)]
        out["failover_s"] = time.monotonic() - started
        after = client.describe_topic("f")["partitions"][0]
        out["leaders"] = [before["leader"], after["leader"], after["leader_epoch"]]
        out["node_after"] = after["node"]  # describe's node: the one serving now, not the first leader's
        out["offsets_increase"] = all(a[1] < b[1] for a, b in zip(acked, acked[1:]))
        consumer = client.consumer(["f"], group="g", auto_offset_reset="earliest")
        seen, deadline = [], time.monotonic() + 60
        while len(seen) < 200 and time.monotonic() < deadline:
            seen += [m.value for m in consumer.poll(timeout_ms=500)]
        out["seen_exactly"] = seen == [b"v%d" % i for i in range(200)]
        first_seen = list(dict.fromkeys(seen))  # each value at its first appearance
        out["seen_all_in_order"] = first_seen == [b"v%d" % i for i in range(200)]
        out["seen"] = len(seen)
        leader_dir = client.registry.placement("f", 0)["log_dir"]
        survivors = [d for d in [leader_dir] + glob.glob(leader_dir + "@*") if not d.endswith(before["leader"])
                     and not (d == leader_dir and before["leader"] == before["replicas"][0])]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len({log_bytes(d) for d in survivors}) != 1:
            time.sleep(0.2)
        out["identical"] = [len(survivors), len({log_bytes(d) for d in survivors})]

        # The old leader's node comes back: it follows, truncated to the new epoch, and rejoins the ISR.
        cluster.add_node(**disk_node_args(before["leader"]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(client.describe_topic("f")["partitions"][0]["isr"]) < 3:
            time.sleep(0.5)
        out["rejoined"] = sorted(client.describe_topic("f")["partitions"][0]["isr"])
        every = [leader_dir] + glob.glob(leader_dir + "@*")
        while time.monotonic() < deadline and len({log_bytes(d) for d in every}) != 1:
            time.sleep(0.2)
        out["all_identical"] = [len(every), len({log_bytes(d) for d in every})]
        producer.close()
        consumer.close()
        client.close()
    """
)


def test_leader_node_lost_an_isr_member_takes_over_and_nothing_acknowledged_is_lost(run_cluster_script):
    out = run_cluster_script(FAILOVER)
    assert out["replicated_unacked"] == [True, False]  # v100 was on the keeper, its ack still owed
    assert out["keeper_leads"]
    old, new, epoch = out["leaders"]
    assert new != old and epoch == 1
    assert out["node_after"] == new
    assert out["offsets_increase"]
    assert out["seen_all_in_order"], out["seen"]  # nothing acknowledged is lost
    assert out["identical"] == [2, 1]  # the two surviving replicas hold the same bytes
    assert out["rejoined"] == ["disk-a", "disk-b", "disk-c"] and out["all_identical"] == [3, 1]
    # Followers keep the idempotent producers' sequences: a set retried across the failover is stored once.
    assert out["seen_exactly"], f"{out['seen']} messages for 200"


REJOIN = script(
    """
        import subprocess

        def describe_cli(topic):
            # `raylog topics describe` against this cluster: [exit code, stdout lines, stderr]
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
            env["RAYLOG_TOKEN"] = client.settings.token.decode()  # this cluster's, as from outside Ray
            proc = subprocess.run(
                [os.path.join(os.path.dirname(sys.executable), "raylog"), "--zookeeper", zookeeper,
                 "--ray-address", cluster.address, "--cluster", cluster_name, "topics", "describe", topic],
                capture_output=True, text=True, timeout=300, env=env)
            return [proc.returncode, proc.stdout.splitlines(), proc.stderr]

        from raylog.actors.partition import actor_name
        from raylog.config import NAMESPACE
        from raylog.replication.assignment import replica_actor_name, replica_log_dir

        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        client.create_topic("j", replication_factor=3, min_insync_replicas=2, replica_lag_ms=1500, flush_ms=5)
        producer = client.producer(acks="all")
        acked = [producer.send("j", b"v%d" % i).result(60) for i in range(100)]
        before = client.describe_topic("j")["partitions"][0]
        # "k" deletes old segments by size: while a follower is away its leader's log start passes the
        # follower's log end, and the follower must start over there when it is back.
        client.create_topic("k", replication_factor=3, min_insync_replicas=2, replica_lag_ms=1500, flush_ms=5,
                            segment_bytes=1024, max_message_bytes=1024, retention_bytes=1024, retention_check_ms=200)
        for i in range(60):
            producer.send("k", b"k%03d" % i).result(60)
        k_before = client.describe_topic("k")["partitions"][0]
        gone = [n for n in before["replicas"] if n != before["leader"] and n != k_before["leader"]][0]
        k_dir = replica_log_dir(client.registry.placement("k", 0)["log_dir"], gone, k_before["replicas"][0])
        k_gone_end = client.offsets("k", 0)[1]
        follower = ray.get_actor(replica_actor_name(actor_name(cluster_name, "j", 0), gone, before["replicas"][0]),
                                 namespace=NAMESPACE)
        follower_pid = ray.get(follower.pid.remote())
        cluster.remove_node(nodes[gone], allow_graceful=False)
        try:  # a lost node takes all its processes: the follower's too, at once
            os.kill(follower_pid, 9)
        except ProcessLookupError:
            pass
        out["shrunk"] = wait_until(lambda: gone not in client.describe_topic("j")["partitions"][0]["isr"], 60)
        acked += [producer.send("j", b"w%d" % i).result(60) for i in range(100)]
        out["acked"] = len(acked)
        out["cli_gone_end"] = client.offsets("j", 0)[1]
        i = 60
        while client.offsets("k", 0)[0] <= k_gone_end and i < 2000:
            producer.send("k", b"k%03d" % i).result(60)
            i += 1
        out["k_passed"] = [client.offsets("k", 0)[0], k_gone_end]
        out["cli_gone"] = describe_cli("j")

        # The node comes back on the same disk: the follower recovers its log, catches up and rejoins.
        cluster.add_node(**disk_node_args(gone))
        out["rejoined"] = wait_until(lambda: gone in client.describe_topic("j")["partitions"][0]["isr"], 90)
        after = client.describe_topic("j")["partitions"][0]
        out["after"] = {k: after.get(k) for k in ("leader", "leader_epoch", "isr", "under_replicated")}
        out["leader"] = [before["leader"], after["leader"]]
        leader_dir = client.registry.placement("j", 0)["log_dir"]
        every = [leader_dir] + sorted(glob.glob(leader_dir + "@*"))
        out["caught_up"] = wait_until(lambda: len({log_bytes(d) for d in every}) == 1, 60)
        out["identical"] = [len(every), len({log_bytes(d) for d in every}), len(log_bytes(leader_dir))]
        out["ends"] = after["replica_log_end_offsets"]
        out["end"] = client.offsets("j", 0)[1]
        out["cli_back"] = describe_cli("j")
        out["k_rejoined"] = wait_until(lambda: gone in client.describe_topic("k")["partitions"][0]["isr"], 90)
        k_after = client.describe_topic("k")["partitions"][0]
        out["k_ends"] = sorted(set(k_after["replica_log_end_offsets"].values()))
        out["k_follower_start"] = min(int(os.path.basename(f)[:-4]) for f in glob.glob(os.path.join(k_dir, "*.log")))
        producer.close()
        client.close()
    """
)


def test_a_follower_whose_node_returns_catches_up_and_rejoins_the_isr(run_cluster_script):
    out = run_cluster_script(REJOIN)
    assert out["shrunk"] and out["acked"] == 200
    assert out["rejoined"], out["after"]
    assert out["leader"][0] == out["leader"][1] and out["after"]["leader_epoch"] == 0
    assert sorted(out["after"]["isr"]) == ["disk-a", "disk-b", "disk-c"] and not out["after"]["under_replicated"]
    assert out["caught_up"] and out["identical"][:2] == [3, 1] and out["identical"][2] == out["end"]

    # `raylog topics describe` shows the leader, epoch, replicas, ISR and log ends, and marks the gap.
    code, lines, err = out["cli_gone"]
    assert code == 0, err
    assert "replication_factor: 3  min_insync_replicas: 2" in lines[0]
    columns, row = lines[-2].split(), lines[-1].split()
    assert columns == ["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "REPLICA_LOG_ENDS", "REPLICATION"]
    leader = out["leader"][0]
    gone = sorted({"disk-a", "disk-b", "disk-c"} - set(row[4].split(",")))
    assert row[:3] == ["0", leader, "0"] and sorted(row[3].split(",")) == ["disk-a", "disk-b", "disk-c"]
    assert len(gone) == 1 and row[6] == "UNDER-REPLICATED" and "1 of 1 partitions under-replicated" in err
    ends = dict(pair.split("=") for pair in row[5].split(","))
    assert ends[gone[0]] == "-" and ends[leader] == str(out["cli_gone_end"])
    code, lines, err = out["cli_back"]
    assert code == 0, err
    row = lines[-1].split()
    assert sorted(row[4].split(",")) == ["disk-a", "disk-b", "disk-c"] and row[6] == "ok"
    assert set(dict(pair.split("=") for pair in row[5].split(",")).values()) == {str(out["end"])}

    # Back after the leader's retention passed its log end: the follower starts over at the leader's log start.
    leader_start, gone_end = out["k_passed"]
    assert leader_start > gone_end
    assert out["k_rejoined"] and len(out["k_ends"]) == 1
    assert out["k_follower_start"] > gone_end
