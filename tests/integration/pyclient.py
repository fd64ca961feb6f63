"""A minimal synchronous client of kilnd in pure Python, for the integration
tests that need the raw protocol (protocol/PROTOCOL.md). The kiln package
does not use it: it calls libkiln's client through ctypes, so the protocol
is implemented once, in C.

One connection, one request at a time: frames are a 4-byte big-endian
length and one msgpack map. Errors from the daemon raise ``KilnError`` with
the protocol's error code.
"""
import os
import socket
import struct

import msgpack

__all__ = ["Client", "KilnError", "default_socket"]


class KilnError(Exception):
    """An error reply: ``code`` is one of PROTOCOL.md's error codes."""

    def __init__(self, code, message, node=None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.node = node


def default_socket():
    """The socket path kilnd uses by default (daemon/README.md)."""
    if os.environ.get("KILN_SOCKET"):
        return os.environ["KILN_SOCKET"]
    if os.geteuid() == 0:
        return "/run/kiln/kilnd.sock"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "kiln", "kilnd.sock")
    return f"/tmp/kiln-{os.geteuid()}/kilnd.sock"


class Client:
    def __init__(self, path=None, timeout=None):
        self.path = path or default_socket()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(self.path)
        self.next_id = 1

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("kilnd closed the connection")
            buf += chunk
        return bytes(buf)

    def call(self, op, **fields):
        """Sends one request and returns the reply map (raises KilnError)."""
        req = {"v": 1, "id": self.next_id, "op": op, **fields}
        self.next_id += 1
        body = msgpack.packb(req, use_bin_type=True)
        self.sock.sendall(struct.pack(">I", len(body)) + body)
        n = struct.unpack(">I", self._recv_exact(4))[0]
        rep = msgpack.unpackb(self._recv_exact(n), raw=False)
        if not rep.get("ok"):
            e = rep.get("error", {})
            raise KilnError(e.get("code", "internal"), e.get("message", ""),
                            e.get("node"))
        return rep

    def hello(self):
        return self.call("hello", client="kiln-python", pid=os.getpid())

    def compile(self, graph, target=None, options=None, priority=None):
        """graph: a Graph v1 map, or its msgpack bytes."""
        if isinstance(graph, (bytes, bytearray)):
            graph = msgpack.unpackb(graph, raw=False)
        fields = {"graph": graph, "target": target or {"backend": "cpu"}}
        if options is not None:
            fields["options"] = options
        if priority is not None:
            fields["priority"] = priority
        return self.call("compile", **fields)

    def lookup(self, signature):
        return self.call("lookup", signature=signature)

    def status(self, settings=False):
        return self.call("status", settings=settings)
