"""trainrun.run(fn): one whole trainrun job from Python, running `fn` on every rank.

    results = trainrun.run(train, args=(lr,), np=4)             # this host
    results = trainrun.run(train, np=4, hosts="a:2,b:2")        # over SSH, as trainrun -H
    value = trainrun.TrainRunner(np=-2).run(train, lr=0.1)      # HorovodRunner's shape

The caller starts the `trainrun` launcher as a subprocess (`trainrun -np N [-H hosts] python
.../trainrun/_run_rank.py`, the same path on every host). Each rank connects back to the caller
over TCP, proves it belongs to the job with a secret the caller made for this call
(TRAINRUN_RUN_TOKEN, passed in the launcher's environment and exported to the ranks, never on a
command line), receives `fn` and its arguments (cloudpickle), runs it, and sends back its return
value or its exception with the traceback. The ranks reach the caller at the host part of
TRAINRUN_RENDEZVOUS_ADDR, the address the launcher gave them for itself, since the caller and the
launcher share a host.

When every rank returned, run() returns their values in rank order. When a rank raised, run()
raises that exception (the first one to arrive) in the caller, with `exc.rank` and
`exc.remote_traceback` set, a note naming the rank, and the remote traceback as its __cause__.
When the job failed otherwise (a rank killed, a host lost, a bad option), run() raises JobError
with trainrun's exit code and summary. Each call is a whole job: when it returns or raises, the
launcher, the ranks, the connections and any shared memory are gone.
"""

import hmac
import os
import pickle
import secrets
import shutil
import site
import socket
import struct
import subprocess
import sys
import threading
import time

__all__ = ["run", "TrainRunner", "JobError", "RemoteTraceback"]

# The wire: the rank sends TOKEN (64 hex characters) and its rank (uint32, network order); the
# caller answers with a frame holding the pickled (fn, args, kwargs); the rank sends one frame
# holding its pickled outcome; the caller answers with one byte, after which the rank exits. A
# frame is a uint64 length (network order) and that many bytes.
_TOKEN_BYTES = 64
_HEADER = struct.Struct("!I")
_LENGTH = struct.Struct("!Q")
_SUMMARY_LINES = 40


class JobError(RuntimeError):
    """The job failed without a rank raising an exception (trainrun's exit code and summary)."""

    def __init__(self, message, exit_code=None, summary=""):
        super().__init__(message)
        self.exit_code = exit_code
        self.summary = summary


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a rank; the __cause__ of the re-raised exception."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return self.text


def _recv_exact(conn, n):
    chunks = []
    while n:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _send_frame(conn, data):
    conn.sendall(_LENGTH.pack(len(data)))
    conn.sendall(data)


def _recv_frame(conn):
    (length,) = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size))
    return _recv_exact(conn, length)


def _find_trainrun(explicit):
    """The launcher: `trainrun=`, $TRAINRUN_BIN, the build tree this package is in, then PATH."""
    if explicit:
        return explicit
    if os.environ.get("TRAINRUN_BIN"):
        return os.environ["TRAINRUN_BIN"]
    here = os.path.dirname(os.path.abspath(__file__))
    # build/python/trainrun/ -> build/bin/trainrun
    beside = os.path.join(os.path.dirname(os.path.dirname(here)), "bin", "trainrun")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("trainrun")
    if found:
        return found
    raise JobError("trainrun.run: no trainrun launcher found: pass trainrun=PATH, set "
                   "TRAINRUN_BIN, or put trainrun on PATH")


def _rank_pythonpath():
    """PYTHONPATH for the ranks: this package's parent, then the caller's own import path (so that
    functions pickled by reference, from importable modules, import there too), minus the
    interpreter's standard directories, which the ranks' interpreter has anyway."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    standard = set()
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        standard.add(os.path.join(prefix, "lib"))
    skip = set(site.getsitepackages()) | {site.getusersitepackages()}
    entries = [package_parent]
    for entry in sys.path:
        entry = os.path.abspath(entry or os.getcwd())
        if entry in skip or entry in entries or not os.path.isdir(entry):
            continue
        if any(entry == s or entry.startswith(s + os.sep) for s in standard):
            continue
        entries.append(entry)
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and entry not in entries:
            entries.append(entry)
    return os.pathsep.join(entries)


def _only_this_host(hosts):
    """Whether a -H list names only this host (then the ranks dial the caller on loopback)."""
    for entry in str(hosts).split(","):
        name = entry.strip().rsplit(":", 1)[0] if entry.strip().count(":") <= 1 else entry
        if name not in ("localhost", "127.0.0.1"):
            return False
    return True


class _Server:
    """The caller's end: accepts the ranks' connections, sends the payload, collects outcomes."""

    def __init__(self, payload, np, token, local):
        self._payload = payload
        self._np = np
        self._token = token.encode()
        if local:
            self._listener = socket.create_server(("127.0.0.1", 0))
        elif socket.has_dualstack_ipv6():
            self._listener = socket.create_server(("::", 0), family=socket.AF_INET6,
                                                  dualstack_ipv6=True)
        else:
            self._listener = socket.create_server(("0.0.0.0", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._connections = set()
        self._threads = []
        self.outcomes = {}  # rank -> (ok, value)
        self.order = []  # ranks in the order their outcomes arrived
        self._closing = False
        self._acceptor = threading.Thread(target=self._accept, name="trainrun.run accept",
                                          daemon=True)
        self._acceptor.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closing:
                    conn.close()
                    return
                self._connections.add(conn)
                thread = threading.Thread(target=self._serve, args=(conn,),
                                          name="trainrun.run rank", daemon=True)
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn):
        try:
            conn.settimeout(30)
            token = _recv_exact(conn, _TOKEN_BYTES)
            if not hmac.compare_digest(token, self._token):
                return  # a stranger: say nothing
            (rank,) = _HEADER.unpack(_recv_exact(conn, _HEADER.size))
            if rank >= self._np:
                return
            _send_frame(conn, self._payload)
            conn.settimeout(None)  # fn runs as long as it runs; the job's end closes the socket
            outcome = pickle.loads(_recv_frame(conn))
            with self._lock:
                if rank not in self.outcomes:
                    self.outcomes[rank] = outcome
                    self.order.append(rank)
            conn.sendall(b"\0")
        except (OSError, ConnectionError, EOFError, pickle.UnpicklingError, struct.error):
            pass
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def close(self):
        with self._lock:
            self._closing = True
            connections = list(self._connections)
        # shutdown() wakes a thread blocked in accept() or recv(); close() alone may not.
        for sock in [self._listener] + connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._listener.close()
        self._acceptor.join()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()


def _tee_stderr(pipe, tail):
    """Copies the launcher's stderr to ours, keeping the last lines for a JobError."""
    for line in iter(pipe.readline, b""):
        tail.append(line.decode(errors="replace"))
        del tail[:-_SUMMARY_LINES]
        try:
            sys.stderr.write(line.decode(errors="replace"))
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
    pipe.close()


def _raise_rank_error(rank, error):
    exc_bytes, type_name, message, tb_text = error
    exc = None
    if exc_bytes is not None:
        try:
            exc = pickle.loads(exc_bytes)
        except Exception:  # pylint: disable=broad-except
            exc = None
    if not isinstance(exc, BaseException):
        exc = JobError(f"rank {rank} raised {type_name}: {message}")
    try:
        exc.rank = rank
        exc.remote_traceback = tb_text
    except AttributeError:
        pass
    if hasattr(exc, "add_note"):
        exc.add_note(f"(raised on rank {rank} of the trainrun.run job; its traceback is above)")
    cause = RemoteTraceback(f"\n\nOn rank {rank}:\n\"\"\"\n{tb_text}\"\"\"")
    raise exc from cause


def run(fn, args=(), kwargs=None, np=4, hosts=None, *, hostfile=None, env=None, python=None,
        trainrun=None, start_timeout=None, extra_args=(), verbose=False):
    """Runs fn(*args, **kwargs) on every rank of a new trainrun job; returns the per-rank values.

    np: the number of ranks (trainrun -np).
    hosts: "host1:2,host2:2" (or a list of "host:slots") as trainrun -H (over SSH), or hostfile=
        as --hostfile; neither means this host, or, inside a Slurm allocation, the allocation's
        nodes as trainrun plans them.
    env: extra environment variables for the ranks (a dict), exported with trainrun -x.
    python: the interpreter the ranks run (default: this one, at the same path on every host).
    trainrun: the launcher binary (default: $TRAINRUN_BIN, the build tree, then PATH).
    start_timeout: trainrun --start-timeout, in seconds.
    extra_args: more trainrun options, e.g. ("-i", "~/.ssh/key", "-p", "2222").
    verbose: trainrun --verbose.

    fn, args and kwargs travel by cloudpickle, so lambdas, closures and functions defined in
    __main__ or a notebook work; the return values come back by pickle. Inside fn, call
    trainrun.init() to use the collectives (run() shuts them down after fn if fn did not).
    """
    import cloudpickle  # pylint: disable=import-outside-toplevel

    if not callable(fn):
        raise TypeError(f"trainrun.run: fn must be callable, not {type(fn).__name__}")
    if not isinstance(np, int) or isinstance(np, bool) or np < 1:
        raise ValueError(f"trainrun.run: np must be a positive integer, not {np!r}")
    if hosts is not None and hostfile is not None:
        raise ValueError("trainrun.run: give hosts or hostfile, not both")
    if isinstance(hosts, (list, tuple)):
        hosts = ",".join(str(h) for h in hosts)
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    launcher = _find_trainrun(trainrun)

    token = secrets.token_hex(_TOKEN_BYTES // 2)
    local = hostfile is None and (_only_this_host(hosts) if hosts is not None else
                                  "SLURM_JOB_ID" not in os.environ)
    server = _Server(payload, np, token, local)
    child_env = dict(os.environ)
    child_env["TRAINRUN_RUN_TOKEN"] = token
    child_env["TRAINRUN_RUN_PORT"] = str(server.port)
    child_env["PYTHONPATH"] = _rank_pythonpath()
    exports = ["TRAINRUN_RUN_TOKEN", "TRAINRUN_RUN_PORT", "PYTHONPATH"]
    for name, value in (env or {}).items():
        child_env[str(name)] = str(value)
        exports.append(str(name))
    argv = [launcher, "-np", str(np)]
    if hosts is not None:
        argv += ["-H", str(hosts)]
    if hostfile is not None:
        argv += ["--hostfile", os.fspath(hostfile)]
    if start_timeout is not None:
        argv += ["--start-timeout", str(int(start_timeout))]
    if verbose:
        argv.append("--verbose")
    for name in exports:
        argv += ["-x", name]
    argv += [str(a) for a in extra_args]
    argv += [python or sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "_run_rank.py")]

    tail = []
    proc = None
    tee = None
    try:
        proc = subprocess.Popen(argv, env=child_env, stdin=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        tee = threading.Thread(target=_tee_stderr, args=(proc.stderr, tail),
                               name="trainrun.run stderr", daemon=True)
        tee.start()
        exit_code = proc.wait()
    except BaseException:
        # Interrupted (KeyboardInterrupt) or failed: end the job, then let the exception go on.
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise
    finally:
        if tee is not None:
            tee.join()
        server.close()

    errors = [rank for rank in server.order if not server.outcomes[rank][0]]
    if errors:
        rank = errors[0]
        _raise_rank_error(rank, server.outcomes[rank][1])
    summary = "".join(tail)
    if exit_code != 0:
        raise JobError(f"trainrun.run: the job failed (trainrun exit code {exit_code})"
                       + (f":\n{summary}" if summary else ""), exit_code, summary)
    missing = [r for r in range(np) if r not in server.outcomes]
    if missing:
        raise JobError(f"trainrun.run: rank(s) {', '.join(map(str, missing))} ended without "
                       "returning from fn (did fn exit the process?)", exit_code, summary)
    return [server.outcomes[r][1] for r in range(np)]


class TrainRunner:
    """HorovodRunner's shape: TrainRunner(np).run(fn, **kwargs) returns rank 0's return value.

    np > 0: that many ranks, on `hosts`/`hostfile` when given (else as trainrun plans them: this
    host, or the Slurm allocation); np < 0: -np processes on this host only (as HorovodRunner's
    local mode). Other keyword arguments go to trainrun.run.
    """

    def __init__(self, np, **options):
        if not isinstance(np, int) or isinstance(np, bool) or np == 0:
            raise ValueError(f"TrainRunner: np must be a non-zero integer, not {np!r}")
        if np < 0 and (options.get("hosts") is not None or options.get("hostfile") is not None):
            raise ValueError("TrainRunner: np < 0 means processes on this host only; "
                             "do not give hosts or hostfile with it")
        self.num_processor = abs(np)
        self._local = np < 0
        self._options = options

    def run(self, main, **kwargs):
        options = dict(self._options)
        if self._local:
            options["hosts"] = f"localhost:{self.num_processor}"
        results = run(main, kwargs=kwargs, np=self.num_processor, **options)
        return results[0]
