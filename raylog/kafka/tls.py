"""TLS on the Kafka listener: the settings, the server's context, the
handshake of an accepted connection, the CA file a client is given, and the
certificates ``raylog tls init`` makes.

A listener started with :class:`TlsSettings` serves TLS only: every
accepted connection first completes a TLS handshake (:func:`wrap`, then
:func:`handshake` at each readiness of the connection: a client that stalls
in it holds no thread) within the strangers' authentication deadline
counted from its accept; a client that sends anything else (a plaintext
Kafka request, garbage, nothing) is closed at the first bad byte or at the
deadline, and no other connection notices. SASL then runs inside TLS as on
a plaintext listener (SCRAM-SHA-512 or -256; PLAIN too, the token being
inside TLS). Fetch responses are the same bytes: their file ranges are read
and sent through the TLS socket
(:meth:`raylog.kafka.file_ranges.FileRange.send_to`) instead of
``sendfile``.

The listener registers its security protocol (``SASL_SSL``, or ``SSL`` on a
cluster opened on purpose) and, when the settings name one, the CA
certificate clients verify it with (PEM text: a certificate is public) in
its ZooKeeper node (:mod:`raylog.kafka.brokers`). ``client.kafka_config()``
writes that certificate to a file of the caller's machine
(:func:`ca_file`) and names it as each client takes it
(``ssl.ca.location`` for librdkafka, :mod:`raylog.kafka.dialects` for the
others).

The files :func:`make_files` writes (``raylog tls init DIR``; all PEM):

================  ==============================================================
file              what it holds
================  ==============================================================
``ca.pem``        the CA's self-signed certificate (ECDSA P-256; basic
                  constraints CA, key usage certificate and CRL signing):
                  what clients verify the listeners with
``ca.key``        the CA's private key (PKCS #8, unencrypted, mode ``0600``):
                  keep it to sign more server certificates, or delete it
``server.pem``    the listeners' certificate (ECDSA P-256, signed by the CA;
                  extended key usage server authentication; subject
                  alternative names ``127.0.0.1``, ``localhost`` and every
                  host given, IP addresses as IP addresses, names as DNS names)
``server.key``    its private key (PKCS #8, unencrypted, mode ``0600``)
================  ==============================================================

One certificate serves every listener of the cluster, so the names of every
node a client reaches a listener by must be among its names. ``TlsSettings``
names files by path: the same paths must hold the files on every disk node.

Thread-safety: the functions keep no state; an :class:`ssl.SSLContext` is
shared by the listener's connections (thread-safe), each SSL socket is
confined to its connection's thread.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import ipaddress
import os
import select
import socket
import ssl
import tempfile
import time

from raylog.errors import ConfigError

#: the file names :func:`make_files` writes in its directory
CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.pem", "ca.key", "server.pem", "server.key"
#: how long the certificates :func:`make_files` makes are valid by default (Apple's and browsers' bound)
DEFAULT_DAYS = 825
#: the names every certificate :func:`make_files` makes holds
LOCAL_NAMES = ("127.0.0.1", "localhost")


class HandshakeFailed(Exception):
    """A connection's TLS handshake failed or missed its deadline; that
    connection must be closed."""


@dataclasses.dataclass(frozen=True)
class TlsSettings:
    """TLS for the Kafka listeners: ``cert``, the PEM file of the listeners'
    certificate (the chain after it, if any), ``key``, the PEM file of its
    private key, and ``ca``, the PEM file of the CA certificate clients
    verify them with (None: clients use their system's trust store, for a
    certificate a public CA signed). Paths as the disk nodes see them.

    ``TlsSettings.in_dir(DIR)`` names the files ``raylog tls init DIR``
    wrote; :meth:`make` writes them and returns the settings."""

    cert: str
    key: str
    ca: str | None = None

    def __post_init__(self):
        for field in ("cert", "key", "ca"):
            value = getattr(self, field)
            if value is None and field == "ca":
                continue
            if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
                raise ConfigError(f"TlsSettings.{field} must be a path to a PEM file, got {value!r}")
            object.__setattr__(self, field, os.path.abspath(os.fspath(value)))

    @classmethod
    def in_dir(cls, directory: str | os.PathLike) -> "TlsSettings":
        """The files ``raylog tls init DIR`` wrote: ``server.pem``,
        ``server.key`` and ``ca.pem`` of ``directory``."""
        directory = os.fspath(directory)
        return cls(os.path.join(directory, SERVER_CERT), os.path.join(directory, SERVER_KEY),
                   os.path.join(directory, CA_CERT))

    @classmethod
    def make(cls, directory: str | os.PathLike, hosts=(), days: int = DEFAULT_DAYS) -> "TlsSettings":
        """Make a CA and the listeners' certificate and key in ``directory``
        (see :func:`make_files`); the settings that name them."""
        make_files(directory, hosts, days)
        return cls.in_dir(directory)

    def check(self) -> None:
        """ConfigError unless the files make a server context here (the
        certificate and its key readable, PEM, and matching; the CA file
        readable and a certificate)."""
        server_context(self)
        ca_pem(self)


def checked_tls(tls, name: str) -> TlsSettings | None:
    """``tls`` when it is None or :class:`TlsSettings` whose files can be
    used here (:meth:`TlsSettings.check`); ConfigError naming ``name`` otherwise."""
    if tls is None:
        return None
    if not isinstance(tls, TlsSettings):
        raise ConfigError(f"{name} must be a raylog.TlsSettings (certificate, key and CA files), got {tls!r}")
    tls.check()
    return tls


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The listener's TLS context: TLS 1.2 or later, the settings'
    certificate and key; ConfigError naming the file when they cannot be
    used. An encrypted key is refused (a listener has no one to ask for its
    password; OpenSSL would ask on the terminal)."""

    def no_password():
        raise ConfigError(f"the Kafka listeners' TLS key {settings.key!r} is encrypted; give it unencrypted, "
                          f"readable by its owner only (raylog keeps no key passwords)")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.cert, settings.key, password=no_password)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"the Kafka listeners' TLS certificate {settings.cert!r} and key {settings.key!r} cannot be "
                          f"used: {err}") from None
    return context


def ca_pem(settings: TlsSettings) -> str | None:
    """The PEM text of the settings' CA certificate (None without one);
    ConfigError when the file is unreadable or holds no certificate."""
    if settings.ca is None:
        return None
    try:
        with open(settings.ca, encoding="ascii") as file:
            text = file.read()
        ssl.PEM_cert_to_DER_cert(text)
    except (OSError, ValueError) as err:
        raise ConfigError(f"the Kafka listeners' CA certificate {settings.ca!r} cannot be read as PEM: {err}") from None
    return text


def wrap(client, context: ssl.SSLContext) -> ssl.SSLSocket:
    """Make ``client``'s accepted socket a TLS socket, non-blocking, its
    handshake not begun (``client.sock`` is replaced by it, so the
    listener's table closes it); :class:`HandshakeFailed` when it cannot be."""
    try:
        tls = context.wrap_socket(client.sock, server_side=True, do_handshake_on_connect=False)
    except (OSError, ValueError) as err:
        raise HandshakeFailed(f"no TLS socket: {err}") from None
    client.sock = tls
    tls.setblocking(False)
    return tls


def handshake(tls: ssl.SSLSocket, write_wait_s: float = 1.0) -> bool:
    """Take the handshake of a non-blocking TLS socket (:func:`wrap`) as far
    as the bytes received allow: True once it is complete (the socket is
    then blocking again, for the listener's frames), False when it waits
    for more from the client (the listener watches the socket again and
    calls this at its next readiness; the authentication deadline bounds
    the whole). A client that sends anything but a TLS handshake, or one
    the context refuses, is :class:`HandshakeFailed` at once. The server's
    own flights wait at most ``write_wait_s`` for room in the socket."""
    while True:
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLWantWriteError:
            _, writable, _ = select.select([], [tls], [], write_wait_s)
            if not writable:
                raise HandshakeFailed("the client takes no bytes of the TLS handshake") from None
            continue
        except (ssl.SSLError, OSError, ValueError) as err:
            raise HandshakeFailed(f"TLS handshake failed: {err}") from None
        tls.setblocking(True)
        return True


def ca_file(pem: str) -> str:
    """A file holding ``pem`` (a CA certificate a listener registered) on
    this machine, for the clients that take a path: under
    ``$XDG_CACHE_HOME/raylog`` (default ``~/.cache/raylog``), named by the
    text's SHA-256, written once (atomically: a reader never sees half of it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "raylog")
    path = os.path.join(directory, f"kafka-ca-{hashlib.sha256(pem.encode('ascii')).hexdigest()[:32]}.pem")
    try:
        with open(path, encoding="ascii") as file:
            if file.read() == pem:
                return path
    except (OSError, UnicodeDecodeError):
        pass
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=directory, prefix=".kafka-ca-", suffix=".pem")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as file:
            file.write(pem)
        os.chmod(scratch, 0o644)  # a certificate is public
        os.replace(scratch, path)
    except BaseException:
        try:
            os.unlink(scratch)
        except OSError:
            pass
        raise
    return path


def make_files(directory: str | os.PathLike, hosts=(), days: int = DEFAULT_DAYS) -> dict[str, str]:
    """Write a new CA and the listeners' certificate and key into
    ``directory`` (made if missing; the files of the module docstring's
    table), with ``127.0.0.1``, ``localhost`` and ``hosts`` (IP addresses or
    DNS names) as the certificate's names, valid ``days`` days from now.
    ConfigError, writing nothing, when a file of those names is there
    already, a host is not a name or an address, or ``days`` is not positive.
    Returns ``{file name: path}``."""
    from cryptography import x509  # only this command needs it
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not isinstance(days, int) or days <= 0:
        raise ConfigError(f"days must be a positive number of days, got {days!r}")
    names = []
    for host in (*LOCAL_NAMES, *hosts):
        name = _subject_name(x509, host)
        if name not in names:
            names.append(name)
    directory = os.path.abspath(os.fspath(directory))
    paths = {name: os.path.join(directory, name) for name in (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY)}
    present = [path for path in paths.values() if os.path.lexists(path)]
    if present:
        raise ConfigError(f"{', '.join(present)} exist already; nothing was written (remove them, or give another "
                          f"directory)")
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raylog Kafka listeners CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raylog Kafka listener")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def private(k) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    os.makedirs(directory, exist_ok=True)
    contents = {CA_CERT: (ca_cert.public_bytes(serialization.Encoding.PEM), 0o644),
                CA_KEY: (private(ca_key), 0o600),
                SERVER_CERT: (cert.public_bytes(serialization.Encoding.PEM), 0o644),
                SERVER_KEY: (private(key), 0o600)}
    written = []
    for name, (data, mode) in contents.items():
        try:
            fd = os.open(paths[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:  # made between the check and now: leave it, take back ours
            for path in written:
                os.unlink(path)
            raise ConfigError(f"{paths[name]} appeared while the files were written; nothing was kept") from None
        written.append(paths[name])
        with os.fdopen(fd, "wb") as file:
            file.write(data)
    return paths


def _subject_name(x509, host: str):
    """``host`` as a subject alternative name: an IP address, else a DNS name."""
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(f"a certificate name must be an IP address or a DNS name, got {host!r}")
    host = host.strip()
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if not all(label and len(label) <= 63 and all(c.isalnum() or c in "-*" for c in label) for label in labels):
        raise ConfigError(f"a certificate name must be an IP address or a DNS name, got {host!r}")
    return x509.DNSName(host.rstrip(".").lower())
