"""The fault kit: faults that tests and the fault runner inject into a real cluster.

Nothing is mocked: each function hurts a real process, server, node or file
the way the fault happens in production.

ZooKeeper clients (kazoo's own test harness does the same)::

    drop_connection(zk)   # the socket breaks; the client reconnects, same session
    expire_session(zk)    # the session expires: LOST, ephemeral nodes gone,
                          # then the client connects again with a new session

Processes (a partition actor, a consumer process, anything with a pid)::

    kill_process(pid)                 # SIGKILL: no clean-up at all
    stop_process(pid); resume_process(pid)   # SIGSTOP (every thread stopped), SIGCONT
    pause_process(pid, seconds=3)     # SIGSTOP, then SIGCONT: a GC pause, a stalled disk
    kill_actor(actor); pause_actor(actor, 3)   # the same for a Ray actor with a pid() method

ZooKeeper itself (an :class:`~raylog.zk.server.EmbeddedZooKeeper`)::

    zookeeper_outage(server, seconds=4)   # stop the server, wait, start it again

Disk and nodes::

    flip_byte(log_dir, offset)        # damage one byte of the message at offset
    crash_at(log_dir, "clean-written")   # the actor SIGKILLs itself at that point of
                                      # its log (raylog.storage.faults; the switch on)
    fill_disk(path); free_disk(path)  # the file system of path full (a filler file), then room again
    remove_node(cluster, node)        # a ray.cluster_utils.Cluster node dies

Hosts and the network (a :class:`raylog.testing.hosts.HostsCluster`)::

    cut_host(host); restore_host(host)          # its link down / up; its processes live on
    partition([h1, h2], [h3])                   # nothing passes between the two sides
    one_way_partition([h2], [h3])               # h2's packets to h3 dropped, h3's to h2 pass
    cut_from_zookeeper(host, cluster)           # the zombie: no ZooKeeper traffic, clients still reach it
    heal(cluster)                               # every link up, every drop rule gone
    kill_host(host); cluster.restart_ray(host)  # every process SIGKILLed, its disk kept
    pause_host(host, seconds=3)                 # every process SIGSTOPped, then SIGCONT

Every function raises :class:`FaultInjectionError` when the fault could not
be made (or, where it waits for it, not seen) in time.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import threading
import time

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from raylog.errors import FaultInjectionError
from raylog.retry import RetryPolicy

# The on-disk layout the byte faults read, as docs/design.md §2 defines it (the fault kit
# stands outside the storage layer, as a failing disk does): a format-2 record batch has
# byte 8 = 0 (the top of batchLength) and byte 16 = its magic 2; its size is 12 (baseOffset
# and batchLength) + batchLength, its records start after the 61-byte header.
LOG_OVERHEAD = 12
BATCH_HEADER_SIZE = 61


def format_at(raw) -> int:
    """2 for a record batch at the start of ``raw`` (17 bytes at least), else 1."""
    return 2 if len(raw) >= 17 and raw[8] == 0 and raw[16] == 2 else 1


def _hosts(client: KazooClient) -> str:
    return ",".join(f"{host}:{port}" for host, port in client.hosts) + (client.chroot or "")


class _StateRecorder:
    """Records the states a client passes through, from now on."""

    def __init__(self, client: KazooClient, first: str, then: str):
        self.first_seen = threading.Event()
        self.then_seen = threading.Event()
        self._first, self._then = first, then
        self._client = client
        client.add_listener(self)

    def __call__(self, state):
        if state == self._first:
            self.first_seen.set()
        elif state == self._then and self.first_seen.is_set():
            self.then_seen.set()

    def remove(self):
        self._client.remove_listener(self)


def expire_session(client: KazooClient, timeout_s: float = 30.0, *, wait_reconnect: bool = True) -> None:
    """Force the server to expire ``client``'s session.

    A second client attaches to the same session (id and password) and
    closes it; the server then tells ``client`` its session expired, which
    kazoo reports as ``KazooState.LOST``. Ephemeral nodes of the session are
    gone at that point. With ``wait_reconnect`` (the default), waits until
    ``client`` has connected again with a new session.

    Raises :class:`FaultInjectionError` if LOST (or the reconnect) is not seen
    within ``timeout_s``.
    """
    if not client.connected:
        raise FaultInjectionError("expire_session needs a connected client")
    old_session = client.client_id[0]
    recorder = _StateRecorder(client, KazooState.LOST, KazooState.CONNECTED)
    try:
        attempts = 0
        per_attempt = max(1.0, timeout_s / 5)
        while not recorder.first_seen.is_set() and attempts < 5:
            attempts += 1
            intruder = KazooClient(hosts=_hosts(client), client_id=client.client_id, timeout=client._session_timeout / 1000.0)
            try:
                intruder.start(timeout=per_attempt)
                intruder.stop()
            except Exception:  # noqa: BLE001 - the next attempt may do it
                pass
            finally:
                intruder.close()
            recorder.first_seen.wait(per_attempt)
        if not recorder.first_seen.is_set():
            raise FaultInjectionError(
                f"session 0x{old_session:x} did not expire after {attempts} attempts"
            )
        if wait_reconnect:
            if not recorder.then_seen.wait(timeout_s):
                raise FaultInjectionError(
                    f"the client did not reconnect within {timeout_s:g}s after its session expired"
                )
            if client.client_id[0] == old_session:
                raise FaultInjectionError("the client reconnected with its old session")
    finally:
        recorder.remove()


def drop_connection(client: KazooClient, timeout_s: float = 30.0, *, wait_reconnect: bool = True) -> None:
    """Break ``client``'s TCP connection; the session survives.

    The socket is shut down under the client, which sees the connection drop
    (``KazooState.SUSPENDED``) and reconnects within the same session. With
    ``wait_reconnect`` (the default), waits until it is ``CONNECTED`` again.

    Raises :class:`FaultInjectionError` if that does not happen within ``timeout_s``.
    """
    if not client.connected:
        raise FaultInjectionError("drop_connection needs a connected client")
    session = client.client_id[0]
    recorder = _StateRecorder(client, KazooState.SUSPENDED, KazooState.CONNECTED)
    try:
        sock = client._connection._socket
        if sock is None:
            raise FaultInjectionError("the client has no open socket")
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already broken: the client notices all the same
        if not recorder.first_seen.wait(timeout_s):
            raise FaultInjectionError(f"the client did not notice the dropped connection within {timeout_s:g}s")
        if wait_reconnect:
            if not recorder.then_seen.wait(timeout_s):
                raise FaultInjectionError(f"the client did not reconnect within {timeout_s:g}s")
            if client.client_id[0] != session:
                raise FaultInjectionError("the client lost its session instead of resuming it")
    finally:
        recorder.remove()


# -- processes -------------------------------------------------------------------


def kill_process(pid: int) -> None:
    """SIGKILL ``pid``: the process ends at once, without any clean-up."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        raise FaultInjectionError(f"no process {pid} to kill") from None


def _stopped_threads(pid: int) -> tuple[int, int]:
    """(threads stopped, threads) of ``pid``, from ``/proc/<pid>/task``."""
    stopped = total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        total += 1
        # "tid (comm) S ...": the state follows the last ")" (comm may hold one)
        state = stat[stat.rindex(b")") + 2 :][:1]
        stopped += state in (b"T", b"t")
    return stopped, total


def stop_process(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once **every** thread of it is stopped.

    The kernel stops a process's threads one after another: the thread the
    signal is given to stops the others once it runs, and on a busy machine
    another thread may go on serving a request meanwhile. A test that
    freezes a process and then expects silence waits for this. If some
    thread is still running at the deadline, the process is resumed before
    the error is raised.
    """
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        raise FaultInjectionError(f"no process {pid} to stop") from None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            stopped, total = _stopped_threads(pid)
        except FileNotFoundError:
            raise FaultInjectionError(f"process {pid} ended while it was being stopped") from None
        if stopped == total:
            return
        if time.monotonic() >= deadline:
            resume_process(pid)
            raise FaultInjectionError(f"{total - stopped} of {total} threads of process {pid} "
                                      f"were still running {timeout_s} s after SIGSTOP")
        time.sleep(0.001)


def resume_process(pid: int) -> None:
    """SIGCONT ``pid`` (a process that is gone is left alone)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass  # it died meanwhile; nothing left to resume


def pause_process(pid: int, seconds: float) -> None:
    """SIGSTOP ``pid`` for ``seconds``, then SIGCONT (always, even if this
    thread is interrupted meanwhile): the process is frozen as by a long GC
    pause or a stalled disk, and its peers see it silent but not gone. The
    pause counts from the moment every thread is stopped."""
    try:
        stop_process(pid)
        time.sleep(seconds)
    finally:
        resume_process(pid)


def actor_pid(actor, timeout_s: float = 30.0) -> int:
    """The pid of a Ray actor that has a ``pid()`` method (the partition
    actor, the fault runner's consumers)."""
    import ray  # heavy (Ray): imported when used

    def ask() -> int:
        return ray.get(actor.pid.remote(), timeout=timeout_s)

    try:  # an actor that Ray is restarting (an earlier fault killed it) answers once it is back
        return RetryPolicy.until(timeout_s, delay_s=0.2).call(ask, retry_on=(ray.exceptions.ActorUnavailableError,))
    except Exception as err:  # noqa: BLE001 - the actor is away
        raise FaultInjectionError(f"could not get the pid of {actor}: {err}") from err


def kill_actor(actor, timeout_s: float = 30.0) -> int:
    """SIGKILL the process of a Ray actor (Ray restarts it if the actor allows
    restarts, as partition actors do); returns the pid killed."""
    pid = actor_pid(actor, timeout_s)
    kill_process(pid)
    return pid


def pause_actor(actor, seconds: float, timeout_s: float = 30.0) -> int:
    """SIGSTOP the process of a Ray actor for ``seconds``, then SIGCONT;
    returns the pid paused."""
    pid = actor_pid(actor, timeout_s)
    pause_process(pid, seconds)
    return pid


# -- ZooKeeper the server ----------------------------------------------------------


def zookeeper_outage(server, seconds: float) -> None:
    """Stop an :class:`~raylog.zk.server.EmbeddedZooKeeper` process,
    keep it down ``seconds``, start it again on the same port with the same
    data (sessions whose timeout did not pass meanwhile survive)."""
    server.kill_process()
    try:
        time.sleep(seconds)
    finally:
        server.start()


# -- disk ----------------------------------------------------------------------------

# size, crc, magic, attributes, timestamp, key_length (docs/design.md section 2);
# 22 bytes, enough to tell a record batch too (format_at reads bytes 8 and 16)
_HEADER = struct.Struct(">IIBBqi")


def _segment_holding(log_dir: str, offset: int) -> tuple[str, int]:
    bases = sorted(int(n[:-4]) for n in os.listdir(log_dir) if n.endswith(".log") and n[:-4].isdigit())
    for base in reversed(bases):
        if base <= offset:
            path = os.path.join(log_dir, "%020d.log" % base)
            if offset - base < os.path.getsize(path):
                return path, offset - base
            break
    raise FaultInjectionError(f"no segment of {log_dir} holds offset {offset} (segments at {bases})")


def message_size(log_dir: str, offset: int) -> int:
    """The whole size of the entry at ``offset`` of the partition log in
    ``log_dir`` (a format-1 message, size field included, or a format-2
    record batch, 12 + batchLength): the next entry starts at
    ``offset + message_size(...)``."""
    path, position = _segment_holding(log_dir, offset)
    with open(path, "rb") as f:
        f.seek(position)
        raw = f.read(17)
    if len(raw) >= 17 and format_at(raw) == 2:
        return LOG_OVERHEAD + int.from_bytes(raw[8:12], "big")
    if len(raw) < 4:
        raise FaultInjectionError(f"offset {offset} of {log_dir} is not a whole message")
    return 4 + int.from_bytes(raw[:4], "big")


def flip_byte(log_dir: str, offset: int, rng=None) -> dict:
    """Invert one byte of the message at ``offset`` (a message boundary) of
    the partition log in ``log_dir``, in place, as a failing disk would.

    The byte is taken from the message's value (or, for an empty value, its
    timestamp; for a format-2 record batch, from its records section), never
    from its size field: the log keeps its message
    boundaries and readers detect the damage by the message's CRC32C.
    Writing through the file also changes what the page cache serves, so a
    running partition actor serves the damaged byte from now on. Flip only
    below the high watermark (flushed data): recovery cuts a damaged
    unflushed tail, which is another fault.

    Returns ``{"segment", "position", "offset", "size", "byte"}`` (the
    file, the byte's position in it, the message's offset and size, the old
    byte value).
    """
    path, position = _segment_holding(log_dir, offset)
    fd = os.open(path, os.O_RDWR)
    try:
        header = os.pread(fd, _HEADER.size, position)
        if len(header) < _HEADER.size:
            raise FaultInjectionError(f"offset {offset} of {log_dir} is not a whole message")
        if format_at(header) == 2:
            # a record batch: a byte of its records section (the batch's
            # length fields stay, its crc finds the damage)
            size = int.from_bytes(header[8:12], "big") + LOG_OVERHEAD - 4
            lo, hi = position + BATCH_HEADER_SIZE, position + 4 + size
            if lo >= hi:
                raise FaultInjectionError(f"the batch at offset {offset} of {log_dir} has no records section")
        else:
            size, _crc, _magic, _attrs, _ts, key_length = _HEADER.unpack(header)
            value_start = position + _HEADER.size + max(key_length, 0)
            end = position + 4 + size
            if value_start < end:
                lo, hi = value_start, end
            else:  # empty value: the timestamp
                lo, hi = position + 10, position + 18
        target = lo if rng is None else rng.randrange(lo, hi)
        old = os.pread(fd, 1, target)
        if len(old) != 1:
            raise FaultInjectionError(f"offset {offset} of {log_dir} is past the end of {path}")
        os.pwrite(fd, bytes([old[0] ^ 0xFF]), target)
    finally:
        os.close(fd)
    return {"segment": path, "position": target, "offset": offset, "size": 4 + size, "byte": old[0]}


#: the switch of raylog.storage.faults (set in a process's environment before it opens its logs)
FAULT_INJECTION_ENV = "RAYLOG_FAULT_INJECTION"
#: the cleaner's fault points (raylog.storage.cleaner.swap), in the order a pass meets them
CLEAN_POINTS = ("clean-written", "clean-index-swap", "clean-swapped", "clean-deleted", "clean-index")
#: the file that takes a disk's room (fill_disk)
FILLER = ".raylog-fault-filler"


def crash_at(log_dir: str, point: str) -> str:
    """Arm ``point`` (:mod:`raylog.storage.faults`) of the partition log in
    ``log_dir`` so that the process owning it SIGKILLs itself when it gets
    there (a crash at that very step); needs the fault-injection switch in
    that process's environment. Returns the trigger file's path: it is gone
    once the crash happened (:func:`disarm` removes it otherwise)."""
    if point not in CLEAN_POINTS + ("fsync", "roll", "retention"):
        raise FaultInjectionError(f"unknown fault point {point!r}")
    # the trigger file as raylog.storage.faults reads it (the kit stands outside the storage layer)
    path = os.path.join(log_dir, ".fault-" + point)
    with open(path, "w") as f:
        f.write("kill")
    return path


def disarm(path: str) -> bool:
    """Remove a trigger file that did not fire; False when it had fired."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def fill_disk(path: str, leave_bytes: int = 4096) -> int:
    """Take all the room of the file system holding ``path`` but
    ``leave_bytes`` with a filler file (``<path>/`` :data:`FILLER`), as a
    disk that other data filled; returns the bytes taken. The filler grows
    by ever smaller pieces until the file system refuses one (others write
    meanwhile: a size read from ``statvfs`` first would be stale).
    :func:`free_disk` gives the room back."""
    filler = os.path.join(path, FILLER)
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    size = 0
    try:
        for piece in (16 << 20, 1 << 20, 64 << 10, 4 << 10):
            while True:
                try:
                    os.posix_fallocate(fd, size, piece)
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        os.unlink(filler)
                        raise FaultInjectionError(f"could not fill the disk of {path}: {err}") from err
                    break
                size += piece
        size = max(0, size - leave_bytes)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return size


def free_disk(path: str) -> None:
    """Remove the filler of :func:`fill_disk`."""
    try:
        os.unlink(os.path.join(path, FILLER))
    except FileNotFoundError:
        pass


# -- nodes ---------------------------------------------------------------------------


def remove_node(cluster, node) -> None:
    """Remove a node of a :class:`ray.cluster_utils.Cluster` at once (its
    raylet and every worker on it die, as when a machine is lost). Actors
    pinned to it wait for a node with its label to come back; the caller
    adds one with ``cluster.add_node(**same arguments)``."""
    try:
        cluster.remove_node(node, allow_graceful=False)
    except Exception as err:  # noqa: BLE001
        raise FaultInjectionError(f"could not remove node {node}: {err}") from err


# -- hosts and the network (raylog.testing.hosts) --------------------------------------
#
# A host is a raylog.testing.hosts.Host; a cluster a HostsCluster. The partitions
# are nftables drop rules in the hosts' own network namespaces (table
# ``raylog_faults``). Packets are dropped where they arrive, never where they
# leave: a sender gets no error, its packets vanish on the wire, as in a real
# partition (a drop on output would fail its send at once with EPERM).
# ``heal`` removes every rule and brings every link up.


def _ensure_table(host) -> None:
    from raylog.testing.hosts import NFT_TABLE  # lazy: the hosts kit pulls in the client

    host.nft(
        f"table inet {NFT_TABLE} {{\n"
        f"  chain input {{ type filter hook input priority -10; policy accept; }}\n"
        f"  chain output {{ type filter hook output priority -10; policy accept; }}\n"
        f"}}\n"
    )


def _drop(host, direction: str, peer_address: str, ports=None) -> None:
    """Drop what ``host`` sends to (``output``) or receives from (``input``)
    ``peer_address``; with ``ports``, only TCP from or to those ports."""
    from raylog.testing.hosts import NFT_TABLE  # lazy: the hosts kit pulls in the client

    _ensure_table(host)
    match = "daddr" if direction == "output" else "saddr"
    if ports:
        portset = "{ " + ", ".join(str(p) for p in ports) + " }"
        rules = [f"ip {match} {peer_address} tcp dport {portset} drop",
                 f"ip {match} {peer_address} tcp sport {portset} drop"]
    else:
        rules = [f"ip {match} {peer_address} drop"]
    host.nft("".join(f"add rule inet {NFT_TABLE} {direction} {rule}\n" for rule in rules))


def cut_host(host) -> None:
    """Cut ``host`` off: its link to the bridge goes down (no carrier, as with
    a cable pulled). Its processes stay alive and its peers see silence: a
    connect to it times out, it is not refused."""
    host.set_link(False)


def restore_host(host) -> None:
    """Bring ``host``'s link up again."""
    host.set_link(True)


def partition(side_a, side_b, *, ports=None) -> None:
    """Nothing passes between any host of ``side_a`` and any of ``side_b``, in
    either direction (with ``ports``: only TCP traffic from or to those
    ports). Each side still reaches its own members and the client machine."""
    side_a, side_b = list(side_a), list(side_b)
    if set(side_a) & set(side_b):
        raise FaultInjectionError("a partition's two sides share a host")
    for a in side_a:
        for b in side_b:
            _drop(a, "input", b.address, ports)
            _drop(b, "input", a.address, ports)


def one_way_partition(sources, targets) -> None:
    """Packets from any host of ``sources`` to any of ``targets`` are dropped;
    the other direction passes. (TCP needs both directions to connect, so a
    new connection fails either way; on a connection made before, bytes from
    ``targets`` still arrive at ``sources`` and none go the other way.)"""
    for s in sources:
        for t in targets:
            _drop(t, "input", s.address)


def cut_from_zookeeper(host, cluster) -> None:
    """The zombie: ``host`` and ZooKeeper's host exchange no ZooKeeper traffic
    (TCP to or from port 2181 between the two), while ``host`` still reaches
    and is reached by everyone else: a leader there loses its ZooKeeper
    session but producers and consumers can still talk to it. (The Ray head
    shares ZooKeeper's host and keeps talking to ``host``.)"""
    from raylog.testing.hosts import ZOOKEEPER_PORT  # lazy: the hosts kit pulls in the client

    if host is cluster.head:
        raise FaultInjectionError("the head host runs ZooKeeper: it cannot be cut from itself")
    partition([host], [cluster.head], ports=[ZOOKEEPER_PORT])


def heal(cluster) -> None:
    """Undo every network fault: all links up, every drop rule gone."""
    from raylog.testing.hosts import NFT_TABLE  # lazy: the hosts kit pulls in the client

    for host in cluster.hosts:
        host.set_link(True)
        host.run(["nft", "delete", "table", "inet", NFT_TABLE], check=False)


def kill_host(host) -> list[int]:
    """SIGKILL every process of ``host`` (its Ray node, the actors on it, a
    ZooKeeper there) at once, as a machine that loses power; its disk stays
    (start it again with ``cluster.restart_ray(host)``). Returns the pids."""
    pids = host.process_pids()
    if not pids:
        raise FaultInjectionError(f"host {host.name} runs no process to kill")
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    host.ray = None
    return pids


def stop_host(host) -> list[int]:
    """SIGSTOP every process of ``host`` (each stopped whole, see
    :func:`stop_process`); returns the pids. Undo with :func:`resume_host`."""
    stopped = []
    try:
        for pid in host.process_pids():
            try:
                stop_process(pid)
            except FaultInjectionError:
                if os.path.exists(f"/proc/{pid}"):
                    raise
                continue  # ended meanwhile
            stopped.append(pid)
    except BaseException:
        for pid in stopped:
            resume_process(pid)
        raise
    return stopped


def resume_host(pids) -> None:
    for pid in pids:
        resume_process(pid)


def pause_host(host, seconds: float) -> list[int]:
    """Every process of ``host`` frozen for ``seconds`` (SIGSTOP, then SIGCONT,
    always): a host that stalls; returns the pids."""
    pids = []
    try:
        pids = stop_host(host)
        time.sleep(seconds)
    finally:
        resume_host(pids)
    return pids
