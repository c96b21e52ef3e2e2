"""What a stranger on the network can do to a listener of a job, as tools for attack_test.py.

Each attack dials HOST:PORT (retrying until it listens) and holds what it opened until stop() is
called. Nothing here needs more than Python's standard library: the HTTP/2 and gRPC framing of
the "large call" is written out by hand.
"""

import resource
import socket
import ssl
import struct
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def wait_listening(host, port, timeout=30.0):
    """Returns once HOST:PORT accepts a connection (the probe is closed at once)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.01)
    return False


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def literal(name, value):
    """An HPACK literal header field without indexing, new name, no Huffman (lengths < 127)."""
    name, value = name.encode(), value.encode()
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


class Attack:
    """Connections opened by one attack, closed by stop()."""

    def __init__(self):
        self.sockets = []
        self.threads = []
        self.opened = 0
        self.closed_by_peer = 0
        self._stop = threading.Event()

    def stop(self):
        self._stop.set()
        for t in self.threads:
            t.join(timeout=5)
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass


def open_many(host, port, count, first_bytes=b"", rate=None):
    """`count` connections, each sending `first_bytes` (nothing: idle), opened as fast as the
    listener takes them (or `rate` a second)."""
    raise_fd_limit()
    attack = Attack()
    for i in range(count):
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect((host, port))
            if first_bytes:
                s.sendall(first_bytes)
            attack.sockets.append(s)
            attack.opened += 1
        except OSError:
            pass
        if rate:
            time.sleep(1.0 / rate)
    return attack


def tls_wrap(sock):
    """Completes a TLS handshake on `sock` as a stranger can (HTTP/2 by ALPN), trusting whatever
    certificate the server shows; returns the TLS socket."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context.wrap_socket(sock, server_hostname="trainrun-rendezvous")


def large_call(sock, path, size, stop, scheme="http"):
    """Sends one gRPC call of a `size`-byte message on `sock` (HTTP/2, no token), obeying the
    server's flow control; returns the bytes of the message sent before the end."""
    sock.settimeout(5)
    sock.sendall(PREFACE + frame(0x4, 0, 0))  # SETTINGS, empty
    headers = (literal(":method", "POST") + literal(":scheme", scheme) + literal(":path", path) +
               literal(":authority", "trainrun") + literal("content-type", "application/grpc") +
               literal("te", "trailers"))
    sock.sendall(frame(0x1, 0x4, 1, headers))
    message = b"\x00" + struct.pack(">I", size)
    connection_window = stream_window = 65535
    sent = 0
    pending = b""
    chunk = b"\x00" * 16384

    def read_frames(block):
        nonlocal pending, connection_window, stream_window
        sock.settimeout(5 if block else 0.0001)
        try:
            data = sock.recv(65536)
        except (BlockingIOError, socket.timeout, ssl.SSLWantReadError):
            return True
        except OSError:
            return False
        if not data:
            return False
        pending += data
        while len(pending) >= 9:
            length = int.from_bytes(pending[:3], "big")
            if len(pending) < 9 + length:
                break
            kind, flags = pending[3], pending[4]
            stream = int.from_bytes(pending[5:9], "big") & 0x7FFFFFFF
            payload = pending[9:9 + length]
            pending = pending[9 + length:]
            if kind == 0x8:  # WINDOW_UPDATE
                increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                if stream == 0:
                    connection_window += increment
                else:
                    stream_window += increment
            elif kind == 0x4 and not flags & 0x1:  # SETTINGS: acknowledge
                for i in range(0, len(payload), 6):
                    key, value = struct.unpack(">HI", payload[i:i + 6])
                    if key == 0x4:
                        stream_window += value - 65535
                sock.sendall(frame(0x4, 0x1, 0))
            elif kind in (0x3, 0x7):  # RST_STREAM, GOAWAY
                return False
        return True

    total = len(message) + size
    while sent < total and not stop.is_set():
        window = min(connection_window, stream_window)
        if window <= 0:
            if not read_frames(True):
                break
            continue
        if not read_frames(False):
            break
        take = min(window, 16384, total - sent)
        if sent < len(message):
            data = message[sent:sent + take]
        else:
            data = chunk[:take]
        last = sent + len(data) == total
        sock.sendall(frame(0x0, 0x1 if last else 0, 1, data))
        sent += len(data)
        connection_window -= len(data)
        stream_window -= len(data)
    return sent


def wait_closed(sock, seconds):
    """Reads and drops what `sock` receives until the peer closes it (True) or `seconds` pass."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except (socket.timeout, ssl.SSLWantReadError):
            continue
        except OSError:
            return True
    return False


def large_calls(host, port, count, size, path="/trainrun.rendezvous.proto.Rendezvous/Set",
                tls=False):
    """`count` connections, each sending one `size`-byte call without a token, concurrently. With
    `tls`, each first completes a TLS handshake (tls_wrap), then waits, after its call, for the
    server to close the connection: attack.closed_after[i] is the seconds from connecting to that
    close (None: not within 30 s)."""
    attack = Attack()
    attack.sent = [0] * count
    attack.handshakes = 0
    attack.closed_after = [None] * count

    def one(i):
        try:
            t0 = time.monotonic()
            s = socket.create_connection((host, port), timeout=5)
            if tls:
                s = tls_wrap(s)
                attack.handshakes += 1
            attack.sockets.append(s)
            attack.opened += 1
            attack.sent[i] = large_call(s, path, size, attack._stop,
                                        scheme="https" if tls else "http")
            if tls and wait_closed(s, 30):
                attack.closed_after[i] = time.monotonic() - t0
        except OSError:
            pass

    for i in range(count):
        t = threading.Thread(target=one, args=(i,), daemon=True)
        t.start()
        attack.threads.append(t)
    return attack
