"""Replica reassignment and the supervisor's care of replicas, on a real
Ray cluster of four disk nodes and a real ZooKeeper (one cluster, one
script: the scenarios follow each other):

1. a reassignment refused (not replicated, a node not alive, a node twice)
   changes nothing;
2. reassigning RF 3 to a set with the fourth node and without the leader,
   while an ``acks="all"`` producer sends: the lead moves to a target
   replica (leader epoch 1), every acknowledged message is read exactly
   once and in order, the new replica's log is byte-identical to the
   leader's up to the high watermark, the old leader's actor is stopped and
   its log gone;
3. every replica actor killed (a cluster restart as the logs and ZooKeeper
   see it): one repair pass starts the leader and both followers, which
   catch up, so that ``acks="all"`` goes on;
4. a follower's node lost: after the topic's ``replica_replace_after_s`` the
   supervisor moves that replica to the spare node; when the lost node
   returns, its old log is removed;
5. ``raylog topics reassign --replace`` moves it back to the returned node.

The cluster runs in a child process of its own, as in test_replication.py.
"""

from __future__ import annotations

import textwrap

SCRIPT = textwrap.dedent(
    """
    import glob, json, os, sys, threading, time
    import ray
    from ray.cluster_utils import Cluster

    from raylog.actors.partition import actor_name
    from raylog.client import Client
    from raylog.config import NAMESPACE
    from raylog.errors import InvalidReassignmentError
    from raylog.replication.assignment import replica_actor_name, replica_log_dir
    from raylog.replication.state import read_state
    from raylog.retry import RetryPolicy
    from raylog.testing.clusters import disk_node_args, log_bytes, start_disk_nodes, wait_until
    from raylog.testing.faults import actor_pid

    zookeeper, cluster_name, data_dir = sys.argv[1:4]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    out = {}

    def gone(pid):
        return wait_until(lambda: not os.path.exists(f"/proc/{pid}"))

    try:
        nodes = start_disk_nodes(cluster, ("disk-a", "disk-b", "disk-c", "disk-d"))
        client = Client(zookeeper=zookeeper, cluster=cluster_name, data_dir=data_dir, data_host="127.0.0.1")
        client.create_topic("m", replication_factor=3, min_insync_replicas=2, replica_lag_ms=1500, flush_ms=5,
                            replica_replace_after_s=3)
        client.create_topic("single")
        zk, paths = client.registry.zk, client.registry.paths
        state = lambda: read_state(zk, paths, "m", 0)[0]
        plain, plain_dir = actor_name(cluster_name, "m", 0), client.registry.placement("m", 0)["log_dir"]
        before = state()
        actor_of = lambda node: ray.get_actor(replica_actor_name(plain, node, before.origin), namespace=NAMESPACE)
        dir_of = lambda node: replica_log_dir(plain_dir, node, before.origin)
        spare = sorted(set(nodes) - set(before.replicas))[0]
        old_leader = before.leader
        target = [spare] + [n for n in before.replicas if n != old_leader]

        # 1. refused
        refused = {}
        for key, args in {"single": ("single", 0, ["disk-a"]), "down": ("m", 0, [spare, "disk-z", target[1]]),
                          "twice": ("m", 0, [spare, spare, target[1]])}.items():
            try:
                client.reassign_partition(*args, timeout_s=10)
                refused[key] = None
            except InvalidReassignmentError as err:
                refused[key] = type(err).__name__
        out["refused"] = refused
        out["unchanged"] = state() == before

        # 2. reassigned while producing with acks="all"
        producer = client.producer(acks="all", retry=RetryPolicy(max_tries=300, delay_s=0.1, max_delay_s=1.0,
                                                                  deadline_s=90))
        acked, failures, stop = [], [], threading.Event()

        def produce(prefix, limit):
            try:
                for i in range(limit):
                    if stop.is_set():
                        return
                    value = b"%s%d" % (prefix, i)
                    acked.append((value, producer.send("m", value).result(120)[1]))
            except Exception as err:
                failures.append(repr(err))

        sender = threading.Thread(target=produce, args=(b"v", 5000))
        sender.start()
        wait_until(lambda: len(acked) >= 50)
        out["result"] = client.reassign_partition("m", 0, target, timeout_s=90)
        at = len(acked)
        wait_until(lambda: len(acked) >= at + 50 or failures, 60)
        stop.set()
        sender.join(150)
        out["acked_during"] = [at, len(acked), failures]
        try:
            actor_of(old_leader)
            out["old_actor_gone"] = False
        except ValueError:
            out["old_actor_gone"] = True
        out["old_log_gone"] = not os.path.exists(dir_of(old_leader))
        leader = state().leader
        hw = client.offsets("m", 0)[1]
        out["identical_to_hw"] = wait_until(lambda: len(log_bytes(dir_of(spare))) >= hw
                                            and log_bytes(dir_of(spare))[:hw] == log_bytes(dir_of(leader))[:hw])
        out["hw"] = hw

        # 3. every replica actor killed; one repair pass brings leader and followers back
        pids = [actor_pid(actor_of(n)) for n in target]
        for n in target:
            ray.kill(actor_of(n), no_restart=True)
        out["killed"] = all(gone(pid) for pid in pids)
        from raylog.actors.supervisor import repair  # one pass, as the supervisor runs them
        rows = repair(client.registry, zookeeper, topic="m", host="127.0.0.1", token=client.settings.token)
        out["repair_rows"] = sorted([r["node"], r["state"], r["detail"]] for r in rows if r["topic"] == "m")
        stop.clear()
        produce(b"w", 30)
        out["after_restart"] = [len(acked), failures]
        out["followers_caught_up"] = wait_until(
            lambda: len(set(client.describe_topic("m")["partitions"][0]["replica_log_end_offsets"].values())) == 1
            and sorted(state().isr) == sorted(target), 60)

        # 4. a follower's node lost: the supervisor moves its replica to the spare node (old_leader's)
        client.start_supervisor(interval_s=2)
        victim = [n for n in target if n != state().leader][0]
        victim_pid = actor_pid(actor_of(victim))
        cluster.remove_node(nodes[victim], allow_graceful=False)
        try:
            os.kill(victim_pid, 9)
        except ProcessLookupError:
            pass
        out["replaced"] = wait_until(
            lambda: victim not in state().replicas and old_leader in state().isr and len(state().isr) == 3, 150)
        out["after_replace"] = [list(state().replicas), list(state().isr), state().removing]
        produce(b"x", 30)
        cluster.add_node(**disk_node_args(victim))
        out["victim_log_removed"] = wait_until(lambda: not os.path.exists(dir_of(victim)), 60)

        # 5. on the command line: the replica goes back to the returned node (--replace old=new)
        import subprocess
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
        env["RAYLOG_TOKEN"] = client.settings.token.decode()  # this cluster's, as from outside Ray
        # the auth mode this cluster was started with (else the CLI turns token auth on by itself
        # when ~/.ray/auth_token exists, and derives another cluster token than this cluster's)
        env["RAY_AUTH_MODE"] = os.environ.get("RAY_AUTH_MODE", "disabled")
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "raylog"), "--zookeeper", zookeeper, "--ray-address",
             cluster.address, "--cluster", cluster_name, "topics", "reassign", "m", "--replace",
             f"{old_leader}={victim}"], capture_output=True, text=True, timeout=300, env=env)
        out["cli"] = [proc.returncode, proc.stdout.splitlines(), proc.stderr[-2000:]]
        out["cli_state"] = [sorted(state().replicas), sorted(state().isr)]
        produce(b"y", 30)

        consumer = client.consumer(["m"], group="g", auto_offset_reset="earliest")
        seen, deadline = [], time.monotonic() + 60
        while len(seen) < len(acked) and time.monotonic() < deadline:
            seen += [m.value for m in consumer.poll(timeout_ms=500)]
        out["seen_exactly"] = seen == [v for v, _ in acked]
        out["offsets_increase"] = all(a[1] < b[1] for a, b in zip(acked, acked[1:]))
        out["counts"] = [len(seen), len(acked), failures]
        producer.close()
        consumer.close()
        client.delete_topic("m")
        out["no_logs_left"] = sorted(glob.glob(plain_dir + "*"))
        client.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


def test_reassign_restart_and_replace_lost_replicas(run_cluster_script):
    out = run_cluster_script(SCRIPT)
    assert out["refused"] == dict.fromkeys(("single", "down", "twice"), "InvalidReassignmentError")
    assert out["unchanged"]

    result = out["result"]
    at, total, failures = out["acked_during"]
    assert not failures and total >= at + 50 and at >= 50
    # the lead moved (epoch 1); a loaded machine may add a failover of its own (a session expiring)
    assert result["leader_epoch"] >= 1 and result["leader"] in result["replicas"]
    assert sorted(result["isr"]) == sorted(result["replicas"]) and len(result["replicas"]) == 3
    assert out["old_actor_gone"] and out["old_log_gone"]
    assert out["identical_to_hw"] and out["hw"] > 0

    assert out["killed"]
    states = {node: state for node, state, _ in out["repair_rows"]}
    assert sorted(states) == sorted(result["replicas"]) and set(states.values()) == {"started"}, out["repair_rows"]
    assert not out["after_restart"][1] and out["followers_caught_up"]

    assert out["replaced"], out["after_replace"]
    assert out["victim_log_removed"]
    code, lines, err = out["cli"]
    assert code == 0, err
    assert lines[0].split() == ["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR"]
    replicas = out["cli_state"][0]
    assert sorted(lines[1].split()[3].split(",")) == replicas and out["cli_state"][1] == replicas
    assert len(replicas) == 3 and out["after_replace"][0] != replicas  # back on the returned node
    assert out["seen_exactly"] and out["offsets_increase"], out["counts"]
    assert out["no_logs_left"] == []
