"""One rank of a trainrun.run(fn) job, started by trainrun as `python .../trainrun/_run_rank.py`.

Connects to the caller (the host of TRAINRUN_RENDEZVOUS_ADDR, port TRAINRUN_RUN_PORT), proves it
belongs to the job (TRAINRUN_RUN_TOKEN), receives fn and its arguments, runs fn, and sends back the
return value or the exception and its traceback (trainrun/_launch.py describes the wire). Exits 0
when fn returned, 1 when it raised (so that trainrun ends the job's other ranks at once).

Run as a script, not with `-m trainrun._run_rank`, so that the trainrun package (and its
extension) is imported only when fn uses it: a rank of an empty fn starts in the time of
`python -c "import cloudpickle"`.
"""

import os
import pickle
import socket
import struct
import sys
import traceback

# The same as trainrun/_launch.py's.
_HEADER = struct.Struct("!I")
_LENGTH = struct.Struct("!Q")


def _recv_exact(conn, n):
    chunks = []
    while n:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the caller closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _caller_address():
    rendezvous = os.environ.get("TRAINRUN_RENDEZVOUS_ADDR", "")
    host = rendezvous.rsplit(":", 1)[0] if ":" in rendezvous else "127.0.0.1"
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(os.environ["TRAINRUN_RUN_PORT"])


def _outcome_bytes(ok, value):
    try:  # plain pickle first: cloudpickle is imported only when needed (~100 ms on a busy host)
        return pickle.dumps((ok, value))
    except Exception:  # pylint: disable=broad-except
        pass
    import cloudpickle  # pylint: disable=import-outside-toplevel

    try:
        return cloudpickle.dumps((ok, value))
    except Exception as exc:  # pylint: disable=broad-except
        what = "return value" if ok else "exception"
        error = (None, type(exc).__name__, f"its {what} cannot be pickled: {exc}",
                 traceback.format_exc())
        return cloudpickle.dumps((False, error))


def main():
    rank = int(os.environ["TRAINRUN_RANK"])
    token = os.environ.pop("TRAINRUN_RUN_TOKEN").encode()
    host, port = _caller_address()
    try:
        conn = socket.create_connection((host, port), timeout=60)
    except OSError as exc:
        sys.exit(f"trainrun.run: rank {rank} cannot reach the caller at {host}:{port}: {exc}")
    with conn:
        conn.sendall(token + _HEADER.pack(rank))
        (length,) = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size))
        payload = _recv_exact(conn, length)
        conn.settimeout(None)
        ok = True
        try:
            fn, args, kwargs = pickle.loads(payload)
            value = fn(*args, **kwargs)
        except BaseException as exc:  # pylint: disable=broad-except
            ok = False
            try:
                exc_bytes = pickle.dumps(exc)
                pickle.loads(exc_bytes)  # what cannot come back whole comes back as text
            except Exception:  # pylint: disable=broad-except
                exc_bytes = None
            # The traceback from fn down (this module's frame left out).
            tb = exc.__traceback__.tb_next or exc.__traceback__
            text = "".join(traceback.format_exception(type(exc), exc, tb))
            value = (exc_bytes, type(exc).__name__, str(exc), text)
        # The collectives end with fn, also when fn forgot to shut them down (not after a failure:
        # the job is being stopped, and the launcher cleans up).
        trainrun = sys.modules.get("trainrun")
        if ok and trainrun is not None and trainrun.is_initialized():
            trainrun.shutdown()
        data = _outcome_bytes(ok, value)
        conn.sendall(_LENGTH.pack(len(data)))
        conn.sendall(data)
        conn.recv(1)  # the caller has it
    sys.stdout.flush()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
