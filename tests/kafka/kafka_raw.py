"""A raw Kafka connection for the tests: requests built with kafka-python's
protocol classes, responses decoded with them, SCRAM with scramp."""

from __future__ import annotations

import io
import socket
import struct

from kafka.protocol.api_header import ResponseHeader
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from scramp import ScramClient


def bootstrap(config: dict) -> tuple[str, int]:
    host, port = config["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    return host, int(port)


class RawKafka:
    """One Kafka connection to the first bootstrap server of ``config``."""

    def __init__(self, config: dict, timeout_s: float = 60.0):
        self.config = config
        self.sock = socket.create_connection(bootstrap(config), timeout=timeout_s)
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def read_frame(self) -> bytes | None:
        """The next response payload, or None if the listener closed the connection."""
        head = self._read(4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        return self._read(size)

    def _read(self, size: int) -> bytes | None:
        chunks = []
        while size:
            chunk = self.sock.recv(size)
            if not chunk:
                return None
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def request(self, request, response_class):
        """Send a kafka-python request object; decode its response."""
        self._correlation += 1
        request.with_header(correlation_id=self._correlation, client_id="raw")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        payload = self.read_frame()
        assert payload is not None, "the listener closed the connection"
        stream = io.BytesIO(payload)
        flexible = response_class.flexible_version_q(request.API_VERSION) and response_class.API_KEY != 18
        header = ResponseHeader.decode(stream, flexible=flexible)
        assert header.correlation_id == self._correlation
        return response_class.decode(payload[stream.tell():], version=request.API_VERSION)

    def authenticate(self, password: str | None = None) -> None:
        from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

        answer = self.request(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-256"), SaslHandshakeResponse)
        assert answer.error_code == 0
        client = ScramClient(["SCRAM-SHA-256"], self.config["sasl.username"],
                             password if password is not None else self.config["sasl.password"])
        first = self.request(SaslAuthenticateRequest[1](auth_bytes=client.get_client_first().encode()),
                             SaslAuthenticateResponse)
        assert first.error_code == 0, first.error_message
        client.set_server_first(bytes(first.auth_bytes).decode())
        final = self.request(SaslAuthenticateRequest[1](auth_bytes=client.get_client_final().encode()),
                             SaslAuthenticateResponse)
        if final.error_code:
            raise PermissionError(final.error_message)
        client.set_server_final(bytes(final.auth_bytes).decode())  # the listener proved the token too
