"""ZooKeeper access for token holders only: digest authentication derived
from the cluster token, and the ACLs raylog's nodes carry.

* **Credentials.** The digest user is ``raylog``; its password is
  ``hex(HMAC-SHA256(token, "raylog-zookeeper:" + cluster))``. ZooKeeper's
  digest scheme sends the password in plain text when a session
  authenticates, so the password is derived: whoever reads it on the wire can
  write the cluster's nodes, but learns nothing of the token that opens the
  data ports (and the data channel's challenge–response never sends it to a
  peer that has not proven it holds it, :mod:`raylog.transfer.handshake`).
* **ACLs.** Every node of a cluster (under ``/raylog/<cluster>``) is created
  with :func:`cluster_acl`: the cluster's digest identity may do anything,
  everyone else may only READ. What readers without the token need (topic
  configurations, endpoints, offsets, schemas) stays readable; an endpoint
  read by anyone is harmless because a client proves the peer behind it
  before sending anything derived from the token. ``/raylog``, shared by
  every cluster of a ZooKeeper ensemble, lets everyone READ and CREATE (a
  new cluster makes its root there) and nobody else delete.
* **Existing clusters.** :func:`secure_session` creates ``/raylog`` and the
  cluster's root with these ACLs, and when it finds a root that anyone may
  write (made before ACLs existed) it sets :func:`cluster_acl` on every node
  of the cluster's tree, once. A root that another identity holds is
  reported (a warning; the session's writes are refused), never taken over.

A session without the token (``token`` None) authenticates nothing: it reads
what it may, and its writes are refused by ZooKeeper
(:func:`raylog.zk.errors.zookeeper_errors` turns that into AuthenticationError).

Thread-safety: the functions may be called from any thread; a session is
secured once whatever the number of callers.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading

from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from raylog.zk.paths import Paths

log = logging.getLogger(__name__)

#: the digest user of every cluster (clusters differ by password)
USER = "raylog"
#: how the derived password starts its HMAC message
CONTEXT = b"raylog-zookeeper:"
#: the parent of every cluster's root
TOP = "/raylog"

WORLD = Id("world", "anyone")
WORLD_READ = ACL(Permissions.READ, WORLD)
WORLD_READ_CREATE = ACL(Permissions.READ | Permissions.CREATE, WORLD)

_secured_lock = threading.Lock()


def password(token: bytes, cluster: str) -> str:
    """The digest password of ``cluster`` derived from its token."""
    return hmac.new(bytes(token), CONTEXT + cluster.encode("utf-8"), hashlib.sha256).hexdigest()


def credential(token: bytes, cluster: str) -> str:
    """``user:password``, what a session presents (``add_auth("digest", ...)``)."""
    return f"{USER}:{password(token, cluster)}"


def identity(token: bytes, cluster: str) -> Id:
    """The digest identity the ACLs name (``user:base64(sha1(user:password))``)."""
    return Id("digest", make_digest_acl_credential(USER, password(token, cluster)))


def cluster_acl(token: bytes, cluster: str) -> list[ACL]:
    """The ACL of every node under ``/raylog/<cluster>``: the token's holders
    may do anything, everyone else only read."""
    return [ACL(Permissions.ALL, identity(token, cluster)), WORLD_READ]


def top_acl(token: bytes, cluster: str) -> list[ACL]:
    """The ACL of ``/raylog``: anyone reads and creates a cluster root there."""
    return [ACL(Permissions.ALL, identity(token, cluster)), WORLD_READ_CREATE]


def _world_may_write(acls) -> bool:
    return any(a.id == WORLD and a.perms & ~(Permissions.READ | Permissions.CREATE) for a in acls)


def secure_session(zk, token: bytes | None, cluster: str, timeout_s: float = 10.0) -> None:
    """Authenticate ``zk`` as a holder of ``cluster``'s token, make every node
    it creates from now on carry :func:`cluster_acl` (its default ACL), and
    make sure ``/raylog`` and the cluster's root carry theirs (see the module
    docstring). ``token`` None: nothing (the session stays a reader); a
    root that another token made is left alone (the session's writes to it
    are refused)."""
    if token is None:
        return
    key = (cluster, password(token, cluster))
    with _secured_lock:
        done = getattr(zk, "_raylog_secured", None)
        if done is None:
            done = set()
            zk._raylog_secured = done
        if key in done:
            return
        zk.add_auth_async("digest", credential(token, cluster)).get(timeout=timeout_s)
        acl = cluster_acl(token, cluster)
        zk.default_acl = acl
        _secure_roots(zk, token, cluster, acl, timeout_s)
        done.add(key)


def _secure_roots(zk, token: bytes, cluster: str, acl: list[ACL], timeout_s: float) -> None:
    root = Paths(cluster).root
    try:
        zk.create_async(TOP, b"", acl=top_acl(token, cluster)).get(timeout=timeout_s)
    except NodeExistsError:
        acls, _ = zk.get_acls_async(TOP).get(timeout=timeout_s)
        if _world_may_write(acls):  # made before ACLs: anyone could delete a cluster's empty root
            try:
                zk.set_acls_async(TOP, top_acl(token, cluster)).get(timeout=timeout_s)
            except NoAuthError:
                pass
    try:
        zk.create_async(root, b"", acl=acl).get(timeout=timeout_s)
        return
    except NodeExistsError:
        pass
    acls, _ = zk.get_acls_async(root).get(timeout=timeout_s)
    if acl[0] in acls:
        return
    if not _world_may_write(acls):
        # Another token made the root: this session reads as anyone does, and
        # ZooKeeper refuses its writes (AuthenticationError, raylog.zk.errors).
        log.warning("the ZooKeeper root %s of cluster %r is held by another token than this session's; "
                    "its writes will be refused (pass the cluster's token)", root, cluster)
        return
    _secure_tree(zk, root, acl, timeout_s)


def _secure_tree(zk, root: str, acl: list[ACL], timeout_s: float) -> None:
    """Set ``acl`` on ``root`` and every node below it (a cluster made before
    ACLs); children before their parent, so that a failure leaves the root
    open and the next session tries again."""
    nodes: list[str] = []
    level = [root]
    while level:
        pending = [(path, zk.get_children_async(path)) for path in level]
        level = []
        for path, result in pending:
            try:
                children = result.get(timeout=timeout_s)
            except NoNodeError:
                continue
            nodes.append(path)
            level.extend(f"{path}/{child}" for child in children)
    for path in reversed(nodes):
        try:
            zk.set_acls_async(path, acl).get(timeout=timeout_s)
        except NoNodeError:
            continue
    log.warning("ZooKeeper nodes of %s (%d) were writable by anyone; they now carry the cluster's ACL", root, len(nodes))
