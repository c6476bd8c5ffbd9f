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
* **A server raylog launched** (:class:`raylog.zk.server.EmbeddedZooKeeper`
  with an ``owner_secret``, what ``raylog.connect()`` starts) is locked at
  start: ``/``, ``/raylog``, ``/zookeeper`` and ``/zookeeper/quota`` carry
  :func:`locked_acl` (the server owner's digest identity may do anything,
  everyone else only READ), so that nobody without a credential writes
  anything anywhere. The owner's user is ``raylog-owner``; its password is
  ``hex(HMAC-SHA256(secret, "raylog-zookeeper-owner"))``, the secret being
  the machine's Ray auth token (:func:`owner_secret`: every cluster of this
  user derives its token from it, so the clusters sharing one server share
  the owner too) or, without one, a random secret only the launching process
  knows. A cluster's root under a locked ``/raylog`` is made by an owner's
  session (:func:`secure_session` opens one for a moment when it can derive
  the owner's password, :meth:`EmbeddedZooKeeper.admit` does it for the
  launching client), with the cluster's ACL.
* **A ZooKeeper not launched by raylog** (``zookeeper="host:2181"``, the
  deploy kit's cluster server) is its administrators' to lock down: raylog
  sets ACLs on its own nodes only (``/raylog`` and below), and ``/raylog``
  lets everyone CREATE there as said above.
* **Existing clusters.** :func:`secure_session` creates ``/raylog`` and the
  cluster's root with these ACLs, and when it finds a root that anyone may
  write (made before ACLs existed) it sets :func:`cluster_acl` on every node
  of the cluster's tree, once. A root that another identity holds (a
  squatted cluster name, or a wrong token) is reported: a warning, then every
  write the session tries fails with :class:`raylog.errors.ClusterPathTakenError`
  naming the path and its holder; it is never taken over. A root that cannot be
  made at all (``/raylog`` held by a stranger, or a locked server and no
  owner credential) fails :func:`secure_session` with that error.

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

from raylog import auth
from raylog.errors import ClusterPathTakenError
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

#: the digest user of a locked server's owner
OWNER_USER = "raylog-owner"
#: the HMAC message of the owner's password
OWNER_CONTEXT = b"raylog-zookeeper-owner"
#: the nodes a locked server's owner holds (ZooKeeper makes them writable by anyone)
LOCKED_NODES = ("/", TOP, "/zookeeper", "/zookeeper/quota")

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


def owner_secret() -> bytes | None:
    """The secret a locked server's owner is derived from, as this process
    can read it: the machine's Ray auth token (:func:`raylog.auth.ray_token`),
    or None."""
    return auth.ray_token()


def owner_credential(secret: bytes) -> str:
    """``raylog-owner:password``, what an owner's session presents."""
    return f"{OWNER_USER}:{hmac.new(bytes(secret), OWNER_CONTEXT, hashlib.sha256).hexdigest()}"


def owner_identity(secret: bytes) -> Id:
    """The digest identity of a locked server's owner."""
    user, pw = owner_credential(secret).split(":", 1)
    return Id("digest", make_digest_acl_credential(user, pw))


def locked_acl(secret: bytes) -> list[ACL]:
    """The ACL of a locked server's top nodes: the owner may do anything,
    everyone else only read."""
    return [ACL(Permissions.ALL, owner_identity(secret)), WORLD_READ]


def lock_server(zk, secret: bytes, timeout_s: float = 10.0) -> None:
    """Give :data:`LOCKED_NODES` :func:`locked_acl` (creating ``/raylog``)
    through ``zk``, a session authenticated with :func:`owner_credential`.
    Idempotent; ``NoAuthError`` if another owner locked them already."""
    acl = locked_acl(secret)
    try:
        zk.create_async(TOP, b"", acl=acl).get(timeout=timeout_s)
    except NodeExistsError:
        pass
    for path in LOCKED_NODES:
        try:
            current, _ = zk.get_acls_async(path).get(timeout=timeout_s)
            if current != acl:
                zk.set_acls_async(path, acl).get(timeout=timeout_s)
        except NoNodeError:
            continue


def make_cluster_root(hosts: str, secret: bytes, token: bytes, cluster: str, timeout_s: float = 10.0) -> bool:
    """As the owner of a locked server at ``hosts``, make ``cluster``'s root
    with the cluster's ACL (a short session of its own). True if this call
    made it, False if it existed; ``NoAuthError`` if ``secret`` is not the
    server's owner's."""
    from kazoo.client import KazooClient  # only here: a short owner session

    zk = KazooClient(hosts=hosts, timeout=timeout_s, auth_data=[("digest", owner_credential(secret))])
    zk.start(timeout=timeout_s)
    try:
        try:
            zk.create_async(Paths(cluster).root, b"", acl=cluster_acl(token, cluster)).get(timeout=timeout_s)
            return True
        except NodeExistsError:
            return False
    finally:
        zk.stop()
        zk.close()


def describe_acl(acls) -> str:
    """The identities that may write, as ``scheme:id`` (for messages)."""
    writers = [f"{a.id.scheme}:{a.id.id}" for a in acls if a.perms & ~Permissions.READ]
    return ", ".join(writers) or "nobody"


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
    except NoAuthError:
        # (ZooKeeper checks the parent's ACL before whether the node exists)
        if zk.exists_async(TOP).get(timeout=timeout_s) is None:
            raise _taken(zk, "/", timeout_s, f"{TOP} cannot be made under it") from None
    try:
        zk.create_async(root, b"", acl=acl).get(timeout=timeout_s)
        return
    except NodeExistsError:
        pass
    except NoAuthError:
        if zk.exists_async(root).get(timeout=timeout_s) is not None:
            pass  # a locked /raylog: made already (by its owner, or a stranger before the lock)
        else:
            _make_root_as_owner(zk, token, cluster, root, timeout_s)
    try:
        acls, _ = zk.get_acls_async(root).get(timeout=timeout_s)
        holder = describe_acl(acls)
    except NoAuthError:  # (the holder let nobody read it)
        acls, holder = [], "who lets nobody read it"
    if acl[0] in acls:
        return
    if not _world_may_write(acls):
        # Another identity made the root: this session reads as anyone does,
        # and every write fails with ClusterPathTakenError (raylog.zk.errors).
        message = (f"the ZooKeeper node {root} was made by another identity ({holder}) than the "
                   f"holder of this session's token; if you passed the cluster's token, the name was taken: "
                   f"choose another cluster name or remove {root} with the ZooKeeper's admin credentials")
        zk._raylog_taken = message
        log.warning("%s; this session's writes will be refused", message)
        return
    _secure_tree(zk, root, acl, timeout_s)


def _make_root_as_owner(zk, token: bytes, cluster: str, root: str, timeout_s: float) -> None:
    """A locked server (raylog launched it): its owner makes the root."""
    secret = owner_secret()
    if secret is None:
        raise _taken(zk, TOP, timeout_s, f"cluster {cluster!r} cannot make its root {root} there; "
                     f"connect from a process that holds this machine's Ray auth token (the server's "
                     f"owner), or from the one that launched it")
    try:
        make_cluster_root(_hosts(zk), secret, token, cluster, timeout_s)
    except NoAuthError:
        raise _taken(zk, TOP, timeout_s, f"cluster {cluster!r} cannot make its root {root} there") from None


def _hosts(zk) -> str:
    return ",".join(f"{host}:{port}" for host, port in zk.hosts) + (zk.chroot or "")


def _taken(zk, path: str, timeout_s: float, what: str) -> ClusterPathTakenError:
    """The error for a node ``path`` that refuses this session's writes."""
    try:
        acls, _ = zk.get_acls_async(path).get(timeout=timeout_s)
        holder = describe_acl(acls)
    except (NoAuthError, NoNodeError):
        holder = "an identity this session may not see"
    return ClusterPathTakenError(
        f"the ZooKeeper node {path} is held by another identity ({holder}): {what}. Choose another "
        f"ZooKeeper or cluster name, or change the node with the ZooKeeper's admin credentials"
    )


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
            except NoAuthError:
                raise _taken(zk, path, timeout_s, f"it sits in cluster tree {root} made when anyone could "
                             f"write there") from None
            nodes.append(path)
            level.extend(f"{path}/{child}" for child in children)
    for path in reversed(nodes):
        try:
            zk.set_acls_async(path, acl).get(timeout=timeout_s)
        except NoNodeError:
            continue
        except NoAuthError:
            raise _taken(zk, path, timeout_s, f"it sits in cluster tree {root} made when anyone could "
                         f"write there") from None
    log.warning("ZooKeeper nodes of %s (%d) were writable by anyone; they now carry the cluster's ACL", root, len(nodes))
