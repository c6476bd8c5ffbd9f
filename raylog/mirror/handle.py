"""Starting, finding and stopping a mirror from a target cluster's client.

:func:`start_mirror` checks everything before it creates anything (the
source is reachable and takes the token, the pattern matches, no target
topic has another partition count), then creates the target topics, stores
the spec in the target's ZooKeeper and starts the controller
(:mod:`raylog.mirror.controller`). A :class:`MirrorHandle` finds the
controller by name.
"""

from __future__ import annotations

import json

from kazoo.exceptions import NodeExistsError, NoNodeError

from raylog.errors import (
    AuthenticationError,
    ConfigError,
    MirrorNoTopicsError,
    MirrorNotFoundError,
    MirrorSourceError,
    RaylogError,
)
from raylog.mirror import spec as specs
from raylog.mirror.controller import MirrorController, create_target_topics, missing_target_topics
from raylog.mirror.member import source_client
from raylog.zk.session import connect_kazoo

#: how long to wait for the controller and its members to answer
START_TIMEOUT_S = 120.0


class MirrorHandle:
    """A running mirror: ``status()`` and ``stop()``."""

    def __init__(self, target_cluster: str, name: str):
        self.target_cluster = target_cluster
        self.name = name

    def _actor(self):
        import ray

        try:
            return ray.get_actor(specs.controller_name(self.target_cluster, self.name), namespace=specs.NAMESPACE)
        except ValueError:
            raise MirrorNotFoundError(f"no mirror named {self.name!r} runs in cluster {self.target_cluster!r}; "
                                      f"list them with 'raylog mirror status'") from None

    def status(self) -> dict:
        """``{"name", "spec", "partitions": [{topic, partition, target_topic,
        source_end, mirrored, lag_bytes, lag_messages, lag_s, target_end}],
        "members": [...]}``."""
        import ray

        return ray.get(self._actor().status.remote(), timeout=60)

    def stop(self) -> None:
        """Stop the members and the controller (progress stays in ZooKeeper:
        a mirror started again under the same name resumes)."""
        import ray

        actor = self._actor()
        try:
            ray.get(actor.stop.remote(), timeout=90)
        finally:
            ray.kill(actor, no_restart=True)


def _client_kwargs(client) -> dict:
    return {"zookeeper": client.settings.zookeeper, "cluster": client.settings.cluster,
            "data_dir": client.data_dir, "data_host": client.data_host}


def _open_source(client_cls, spec):
    """A client of the source, once its ZooKeeper is known to hold the
    cluster (a client made first would create the cluster's root there)."""
    try:
        zk = connect_kazoo(spec.source_zookeeper)
        try:
            known = zk.exists(f"/raylog/{spec.source_cluster}") is not None
        finally:
            zk.stop()
            zk.close()
        if not known:
            raise MirrorSourceError(f"ZooKeeper {spec.source_zookeeper} holds no raylog cluster named "
                                    f"{spec.source_cluster!r}; check --source-cluster")
        return source_client(client_cls, spec)
    except MirrorSourceError:
        raise
    except RaylogError as err:
        raise MirrorSourceError(f"the source cluster {spec.source_cluster!r} at {spec.source_zookeeper} could not "
                                f"be reached: {err}") from None


def _check_source(spec, source) -> list[str]:
    """The matching source topics; each reachable with the token."""
    topics = [t for t in source.list_topics() if spec.matches(t)]
    if not topics:
        raise MirrorNoTopicsError(
            f"no topic of source cluster {spec.source_cluster!r} matches {spec.topics!r} (it must match whole "
            f"names; the source has {len(source.list_topics())} topics)")
    try:
        source.offsets(topics[0], 0)
    except AuthenticationError as err:
        raise MirrorSourceError(f"the source cluster {spec.source_cluster!r} refused the token: {err}") from None
    return topics


def start_mirror(client, spec) -> MirrorHandle:
    import ray

    client_cls = type(client)
    target_cluster = client.settings.cluster
    handle = MirrorHandle(target_cluster, spec.name)
    try:
        handle._actor()
    except MirrorNotFoundError:
        pass
    else:
        raise ConfigError(f"a mirror named {spec.name!r} already runs in cluster {target_cluster!r}; "
                          f"stop it first (raylog mirror stop {spec.name}) or pick another name")
    source = _open_source(client_cls, spec)
    try:
        _check_source(spec, source)
        missing_target_topics(spec, source, client)  # MirrorTopicMismatchError before anything is made
        create_target_topics(spec, source, client)
    finally:
        source.close()
    root = specs.mirror_root(target_cluster, spec.name)
    data = json.dumps(spec.public(), sort_keys=True).encode()
    try:
        client._zk.create(root, data, makepath=True)
    except NodeExistsError:
        client._zk.set(root, data)
    controller = ray.remote(MirrorController).options(
        name=specs.controller_name(target_cluster, spec.name), namespace=specs.NAMESPACE, lifetime="detached",
        max_restarts=-1, max_task_retries=-1, num_cpus=0,
    ).remote(spec, client_cls, _client_kwargs(client))
    ray.get(controller.ready.remote(), timeout=START_TIMEOUT_S)
    return handle


def list_mirrors(zk, target_cluster: str) -> list[str]:
    try:
        return sorted(zk.get_children(specs.mirror_root(target_cluster)))
    except NoNodeError:
        return []
