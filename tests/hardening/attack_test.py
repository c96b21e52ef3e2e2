"""A stranger on the network against a job's listeners, on loopback (issue "a stranger on the
network cannot stop a job"): each case runs real trainrun jobs with and without the attack,
alternating, and checks that the job still exits 0 within a second of its time without it.

  attack_test.py --trainrun T --worker W CASE

CASE is one of the names in CASES below. Exits 77 (CTest's skip) where the machine cannot run a
case (no tcpdump, no capture rights).
"""

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attack  # noqa: E402

SKIP = 77
# How much later than without the attack a job may end (the bar).
SLACK_S = 1.0
ROUNDS = 2  # attacked and plain runs each, alternating
# The admission deadline (Admission::kDefaultDeadline): a connection that has proved nothing by
# then is closed.
DEADLINE_S = 5.0
# HTTP/2's initial flow-control window, which gRPC's server keeps for a stream it has not read.
FLOW_CONTROL_WINDOW = 65535
# Prefixed to a rank's shell command: it then dials the rendezvous' TCP port (with TLS), as a
# remote host's ranks do, rather than the local socket trainrun gives the ranks on its machine.
TCP_RANKS = "unset TRAINRUN_RENDEZVOUS_SOCKET;"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


class Run:
    """A trainrun started in the background, its output captured."""

    def __init__(self, argv, env=None):
        self.argv = argv
        self.start = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self.out = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        self.out = self.proc.stdout.read()

    def wait(self, timeout=120):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=10)
        self.seconds = time.monotonic() - self.start
        return self.proc.returncode

    def text(self):
        return self.out.decode(errors="replace")


def compare(name, run_once):
    """run_once(attacked) -> (seconds, detail). Alternates plain and attacked runs; fails when an
    attacked one did not succeed or the median attacked time exceeds the plain one by SLACK_S."""
    plain, attacked = [], []
    for _ in range(ROUNDS):
        plain.append(run_once(False)[0])
        seconds, detail = run_once(True)
        attacked.append(seconds)
        print(f"{name}: plain {plain[-1]:.2f} s, attacked {seconds:.2f} s ({detail})", flush=True)
    p, a = statistics.median(plain), statistics.median(attacked)
    print(f"{name}: median plain {p:.2f} s, attacked {a:.2f} s, load {os.getloadavg()[0]:.1f}")
    if a > p + SLACK_S:
        fail(f"{name}: the job took {a:.2f} s under attack against {p:.2f} s without "
             f"(more than {SLACK_S} s later)")


def open_attack(kind, port, count):
    """Opens attack `kind` of `count` connections at 127.0.0.1:port, once it listens."""
    if not attack.wait_listening("127.0.0.1", port):
        fail(f"nothing listens at port {port}")
    first = {"idle": b"", "onebyte": b"x", "preface": attack.PREFACE + attack.frame(4, 0, 0)}
    return attack.open_many("127.0.0.1", port, count, first[kind])


def rendezvous_case(args, kind, count):
    def run_once(attacked):
        port = free_port()
        with tempfile.TemporaryDirectory() as tmp:
            go = os.path.join(tmp, "go")
            # The ranks join once the attack is in place (the file `go` exists); the job's time
            # is counted from then.
            # The ranks dial the TCP port, as a remote host's do (those here would take the
            # local socket, which no stranger can reach).
            argv = [args.trainrun, "-np", "2", "--rendezvous-port", str(port), "sh", "-c",
                    f'{TCP_RANKS} while [ ! -e {go} ]; do sleep 0.02; done; exec "$0"',
                    args.worker]
            run = Run(argv)
            held = open_attack(kind, port, count) if attacked else None
            if not attacked:
                attack.wait_listening("127.0.0.1", port)
            open(go, "w").close()
            t0 = time.monotonic()
            rc = run.wait()
            seconds = time.monotonic() - t0
        detail = ""
        if held is not None:
            detail = f"{held.opened} of {count} connections opened"
            held.stop()
        if rc != 0:
            fail(f"the job exited {rc} {'under attack' if attacked else ''}:\n{run.text()}")
        return seconds, detail

    compare(f"rendezvous, {count} {kind} connections", run_once)


def node_argv(args, node, port, command, token="t0ken"):
    return [args.trainrun, "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--nproc-per-node", "1", "--rdzv-token", token] + command


def join_case(args, kind, count):
    def run_once(attacked):
        port = free_port()
        node0 = Run(node_argv(args, 0, port, [args.worker]))
        held = open_attack(kind, port, count) if attacked else None
        if not attacked:
            attack.wait_listening("127.0.0.1", port)
        t0 = time.monotonic()
        node1 = Run(node_argv(args, 1, port, [args.worker]))
        rc1 = node1.wait()
        rc0 = node0.wait()
        seconds = time.monotonic() - t0
        detail = ""
        if held is not None:
            detail = f"{held.opened} of {count} connections opened"
            held.stop()
        if rc0 != 0 or rc1 != 0:
            fail(f"node 0 exited {rc0}, node 1 {rc1}:\nnode 0:\n{node0.text()}\nnode 1:\n"
                 f"{node1.text()}")
        return seconds, detail

    compare(f"per-node join port, {count} {kind} connections", run_once)


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def large_calls_against_job(args, job_sleep_s, watch_s, tls=False):
    """Starts a 2-rank job whose ranks wait job_sleep_s before they start, sends 16 calls of 60 MiB
    without the token to its rendezvous (over TLS when `tls`), and samples trainrun's resident
    memory for up to watch_s while they last. Returns the calls, trainrun's idle and peak RSS in
    KiB, and the job's exit status and output."""
    port = free_port()
    run = Run([args.trainrun, "-np", "2", "--rendezvous-port", str(port), "sh", "-c",
               f'sleep {job_sleep_s}; exec "$0"', args.worker])
    if not attack.wait_listening("127.0.0.1", port):
        fail("the rendezvous never listened")
    time.sleep(0.5)
    idle = max(rss_kib(run.proc.pid) or 0 for _ in range(5))
    calls = attack.large_calls("127.0.0.1", port, 16, 60 << 20, tls=tls)
    peak = idle
    end = time.monotonic() + watch_s
    while time.monotonic() < end and any(t.is_alive() for t in calls.threads):
        peak = max(peak, rss_kib(run.proc.pid) or 0)
        time.sleep(0.02)
    calls.stop()
    rc = run.wait()
    return calls, idle, peak, rc, run.text()


def large_calls_case(args):
    calls, idle, peak, rc, text = large_calls_against_job(args, 8, 6)
    sent = sum(calls.sent)
    print(f"16 calls of 60 MiB without the token: {sent / 2**20:.1f} MiB sent in all; trainrun "
          f"{idle / 1024:.1f} MiB idle, {peak / 1024:.1f} MiB at most")
    if rc != 0:
        fail(f"the job exited {rc}:\n{text}")
    if peak - idle >= 50 * 1024:
        fail(f"trainrun grew by {(peak - idle) / 1024:.1f} MiB (bar: under 50 MiB)")


def large_calls_tls_case(args):
    """A stranger that completes the TLS handshake (the server asks no certificate of a client)
    and then sends calls of 60 MiB without the token: each is refused as its headers arrive, so the
    server accepts at most one flow-control window of its message, and the connection is closed
    within the admission deadline of its accept."""
    calls, idle, peak, rc, text = large_calls_against_job(args, 9, 8, tls=True)
    print(f"16 calls of 60 MiB without the token after a completed TLS handshake "
          f"({calls.handshakes} handshakes): accepted {min(calls.sent)}-{max(calls.sent)} bytes "
          f"each; connections closed after {calls.closed_after} s; trainrun "
          f"{idle / 1024:.1f} MiB idle, {peak / 1024:.1f} MiB at most")
    if rc != 0:
        fail(f"the job exited {rc}:\n{text}")
    if calls.handshakes != 16:
        fail(f"only {calls.handshakes} of 16 TLS handshakes completed: the case tests nothing")
    if max(calls.sent) > FLOW_CONTROL_WINDOW:
        fail(f"the server accepted {max(calls.sent)} bytes of a call without the token (bar: one "
             f"flow-control window, {FLOW_CONTROL_WINDOW} bytes)")
    late = [t for t in calls.closed_after if t is None or t > DEADLINE_S + SLACK_S]
    if late:
        fail(f"{len(late)} connections without the token were not closed within "
             f"{DEADLINE_S + SLACK_S} s: {calls.closed_after}")
    if peak - idle >= 50 * 1024:
        fail(f"trainrun grew by {(peak - idle) / 1024:.1f} MiB (bar: under 50 MiB)")


def duplicate_node_case(args):
    port = free_port()
    node0 = Run(node_argv(args, 0, port, ["sleep", "4"]))
    node1 = Run(node_argv(args, 1, port, ["sleep", "4"]))
    time.sleep(2)
    second = Run(node_argv(args, 1, port, ["true"]))
    rc = second.wait(timeout=30)
    print(f"a second node 1: exit {rc} after {second.seconds:.2f} s: {second.text().strip()}")
    rc0, rc1 = node0.wait(), node1.wait()
    if rc0 != 0 or rc1 != 0:
        fail(f"the job exited {rc0}/{rc1}:\n{node0.text()}\n{node1.text()}")
    if rc == 0 or "node 1 of this job has already joined" not in second.text():
        fail("the second node 1 was not told that node 1 of this job has already joined")
    if second.seconds > 2.0:
        fail(f"the second node 1 was told only after {second.seconds:.2f} s")


def listening_addresses(pid):
    """The local addresses the process `pid` listens at (TCP), from ss."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," in line:
            found.append(line.split()[3])
    return found


def bind_loopback_case(args):
    port = free_port()
    node0 = Run(node_argv(args, 0, port, ["sleep", "3"]))
    node1 = Run(node_argv(args, 1, port, ["sleep", "3"]))
    time.sleep(2)
    bound = listening_addresses(node0.proc.pid)
    local = Run([args.trainrun, "-np", "2", "sleep", "3"])
    time.sleep(1.5)
    bound_local = listening_addresses(local.proc.pid)
    for r in (node0, node1, local):
        r.wait()
    print(f"per-node node 0 (endpoint 127.0.0.1:{port}) listens at {bound}; a local job at "
          f"{bound_local}")
    if not bound or not bound_local:
        fail("found no listening socket (ss -ltnp)")
    stray = [a for a in bound + bound_local if not a.startswith("127.0.0.1:")]
    if stray:
        fail(f"listening beyond loopback: {stray}")


def capture_case(args):
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        print("tcpdump is not installed (scripts/setup.sh installs it)")
        sys.exit(SKIP)
    with tempfile.TemporaryDirectory() as tmp:
        found = {}
        for tls in (True, False):
            # On a loaded machine a capture has come back short (1.5 KiB, where a whole job's
            # traffic is 4-12 KiB): such a capture proves nothing, and the job is run again.
            for attempt in range(3):
                data, token = capture_job(args, tcpdump, tmp, tls)
                print(f"{'TLS' if tls else '--no-tls'}: {len(data)} bytes captured; the token "
                      f"{'is' if token in data else 'is not'} in them")
                if len(data) >= 4096:
                    found[tls] = token in data
                    break
            else:
                fail("three captures came back short: the capture does not work here")
        if not found[False]:
            fail("the capture of a --no-tls job lacks the token: the capture does not work")
        if found[True]:
            fail("the token crossed the network in clear")


def node_capture_case(args):
    """Per-node mode: node 1's trainrun joins node 0's and runs the agent protocol over that
    TCP connection, which carries each rank's environment; a capture of it must not hold the
    job's token, while it shows the protocol itself (the worker's path, which crosses in the Job).
    (The rendezvous' own traffic is TLS, which token-capture checks.)"""
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        print("tcpdump is not installed (scripts/setup.sh installs it)")
        sys.exit(SKIP)
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(3):
            port = free_port()
            pcap = os.path.join(tmp, f"nodes-{port}.pcap")
            dump = subprocess.Popen(
                [tcpdump, "-i", "lo", "--immediate-mode", "-U", "-Z", "root", "-w", pcap, "tcp",
                 "port", str(port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            said = dump.stderr.readline().decode()
            if "listening" not in said:
                dump.wait()
                print("tcpdump cannot capture here: " + said + dump.stderr.read().decode())
                sys.exit(SKIP)
            # Node 0's command is every node's: both ranks append their token to one file.
            tokens = os.path.join(tmp, f"tokens-{port}")
            runs = [Run(node_argv(args, node, port,
                                  ["sh", "-c",
                                   f'echo "$TRAINRUN_JOB_TOKEN" >> {tokens}; exec "$0"',
                                   args.worker]))
                    for node in (0, 1)]
            codes = [run.wait() for run in runs]
            time.sleep(1.5)  # what the kernel holds reaches the file
            dump.send_signal(signal.SIGINT)
            dump.wait(timeout=10)
            if codes != [0, 0]:
                fail(f"the nodes exited {codes}:\nnode 0:\n{runs[0].text()}\nnode 1:\n"
                     f"{runs[1].text()}")
            with open(tokens) as f:
                seen = f.read().split()
            if len(seen) != 2 or seen[0] != seen[1]:
                fail(f"the two nodes' ranks were not given one token: {seen}")
            token = seen[0].encode()
            with open(pcap, "rb") as f:
                data = f.read()
            shown = args.worker.encode() in data
            print(f"{len(data)} bytes captured; the agent protocol's Job "
                  f"{'is' if shown else 'is not'} in them; the token "
                  f"{'is' if token in data else 'is not'} in them")
            if shown:
                break
        else:
            fail("three captures lack the agent protocol: the capture does not work here")
        if token in data:
            fail("the token crossed the network in clear between the nodes")


def capture_job(args, tcpdump, tmp, tls):
    """Runs a 2-rank job (TLS or --no-tls) under tcpdump on loopback; returns the capture and the
    job's token."""
    port = free_port()
    pcap = os.path.join(tmp, f"rendezvous-{port}.pcap")
    token_file = os.path.join(tmp, f"token-{port}")
    dump = subprocess.Popen(
        [tcpdump, "-i", "lo", "--immediate-mode", "-U", "-Z", "root", "-w", pcap, "tcp", "port",
         str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # It says "listening on lo" once it captures.
    said = dump.stderr.readline().decode()
    if "listening" not in said:
        dump.wait()
        print("tcpdump cannot capture here: " + said + dump.stderr.read().decode())
        sys.exit(SKIP)
    argv = [args.trainrun, "-np", "2", "--rendezvous-port", str(port)]
    if not tls:
        argv.append("--no-tls")
    argv += ["sh", "-c", f'{TCP_RANKS} echo "$TRAINRUN_JOB_TOKEN" > {token_file}; exec "$0"',
             args.worker]
    run = Run(argv)
    rc = run.wait()
    time.sleep(1.5)  # what the kernel holds reaches the file
    dump.send_signal(signal.SIGINT)
    dump.wait(timeout=10)
    if rc != 0:
        fail(f"the job exited {rc}:\n{run.text()}")
    with open(token_file) as f:
        token = f.read().strip().encode()
    with open(pcap, "rb") as f:
        return f.read(), token


def bare_pty_seconds(size):
    """`head -c size /dev/zero` writing to a pty set up as trainrun sets up a rank's (raw, but
    with output processing on and nothing to process, the faster of the two for bulk output),
    whose master this process reads in 1 MiB reads, without trainrun: the kernel's own pace for a
    pty (each read returns at most the line discipline's 4 KiB, each refill waits for the kernel's
    flush worker)."""
    import pty
    import termios
    import tty
    master, slave = pty.openpty()
    tty.setraw(slave)
    mode = termios.tcgetattr(slave)
    mode[1] |= termios.OPOST
    mode[1] &= ~(termios.ONLCR | termios.OCRNL | termios.ONOCR | termios.ONLRET | termios.OLCUC |
                 termios.OFILL | termios.NLDLY | termios.CRDLY | termios.TABDLY | termios.BSDLY |
                 termios.VTDLY | termios.FFDLY)
    termios.tcsetattr(slave, termios.TCSANOW, mode)
    start = time.monotonic()
    writer = subprocess.Popen(["head", "-c", str(size), "/dev/zero"], stdout=slave)
    os.close(slave)
    got = 0
    while True:
        try:
            chunk = os.read(master, 1 << 20)
        except OSError:  # EIO: the writer is gone and everything was read
            break
        if not chunk:
            break
        got += len(chunk)
    writer.wait()
    os.close(master)
    if got != size:
        fail(f"the bare pty read {got} of {size} bytes")
    return time.monotonic() - start


def pty_case(args):
    """Bulk output through trainrun's default pty, beside a pipe (--no-pty) and beside the same
    pty read by a bare loop (no trainrun), alternating, medians. A pty cannot come near a pipe on
    Linux (the bare loop alone is several times a pipe's time), so the bar is on what trainrun
    adds: its pty time within 1.5 times the bare loop's plus its time through the pipe (its own
    start and copying, which the bare loop does not pay)."""
    size = args.bytes
    command = ["sh", "-c", f"head -c {size} /dev/zero"]

    def once(pty):
        argv = [args.trainrun, "-np", "1"] + ([] if pty else ["--no-pty"]) + command
        start = time.monotonic()
        rc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode
        if rc != 0:
            fail(f"{argv} exited {rc}")
        return time.monotonic() - start

    pipes, ptys, bares = [], [], []
    for _ in range(args.rounds):
        pipes.append(once(False))
        ptys.append(once(True))
        bares.append(bare_pty_seconds(size))
    p, t, b = statistics.median(pipes), statistics.median(ptys), statistics.median(bares)
    print(f"{size} bytes, medians of {args.rounds}: pipe {p:.2f} s, pty {t:.2f} s ({t / p:.2f}x "
          f"the pipe), the bare pty loop {b:.2f} s ({b / p:.2f}x the pipe; trainrun's pty "
          f"{t / b:.2f}x it), load {os.getloadavg()[0]:.1f}")
    if t > 1.5 * b + p:
        fail(f"output through trainrun's pty took {t:.2f} s, over 1.5 times a bare read of the "
             f"same pty ({b:.2f} s) plus trainrun's time through a pipe ({p:.2f} s)")


def local_socket_case(args):
    """The ranks on trainrun's machine reach the rendezvous on a Unix socket in a directory only
    the user can enter, removed at the job's end: they join with TRAINRUN_RENDEZVOUS_ADDR pointing
    nowhere, and the TCP port (with TLS) is never built for them."""
    with tempfile.TemporaryDirectory() as tmp:
        seen = os.path.join(tmp, "seen")
        script = (f'd=$(dirname "$TRAINRUN_RENDEZVOUS_SOCKET"); '
                  f'echo "$TRAINRUN_RENDEZVOUS_SOCKET $(stat -c %a "$d") $(stat -c %F '
                  f'"$TRAINRUN_RENDEZVOUS_SOCKET")" >> {seen}; '
                  f'TRAINRUN_RENDEZVOUS_ADDR=127.0.0.1:1 exec "$0"')
        run = Run([args.trainrun, "-np", "2", "sh", "-c", script, args.worker])
        rc = run.wait()
        if rc != 0:
            fail(f"the job exited {rc}:\n{run.text()}")
        with open(seen) as f:
            lines = f.read().split()
        print(" ".join(lines))
        if len(lines) < 4 or lines[1] != "700" or lines[2] != "socket":
            fail(f"the ranks' TRAINRUN_RENDEZVOUS_SOCKET is not a socket in a 0700 directory: "
                 f"{lines}")
        if os.path.exists(os.path.dirname(lines[0])):
            fail(f"{os.path.dirname(lines[0])} is left behind after the job")


def valgrind_case(args):
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("valgrind is not installed (scripts/setup.sh installs it)")
        sys.exit(SKIP)
    result = subprocess.run([valgrind, "-q", "--error-exitcode=99", args.trainrun, "-np", "2",
                             "true"], capture_output=True, text=True, timeout=600)
    print(result.stdout + result.stderr)
    if result.returncode != 0 or "Unsupported clone" in result.stderr:
        fail(f"valgrind trainrun -np 2 true exited {result.returncode}")


CASES = {
    "rendezvous-idle-20": lambda a: rendezvous_case(a, "idle", 20),
    "rendezvous-idle-200": lambda a: rendezvous_case(a, "idle", 200),
    "rendezvous-onebyte-4200": lambda a: rendezvous_case(a, "onebyte", 4200),
    "rendezvous-preface-200": lambda a: rendezvous_case(a, "preface", 200),
    "rendezvous-large-calls": large_calls_case,
    "rendezvous-large-calls-tls": large_calls_tls_case,
    "join-idle-20": lambda a: join_case(a, "idle", 20),
    "join-idle-200": lambda a: join_case(a, "idle", 200),
    "join-onebyte-4200": lambda a: join_case(a, "onebyte", 4200),
    "duplicate-node": duplicate_node_case,
    "bind-loopback": bind_loopback_case,
    "token-capture": capture_case,
    "token-capture-nodes": node_capture_case,
    "pty-throughput": pty_case,
    "local-socket": local_socket_case,
    "valgrind": valgrind_case,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainrun", required=True)
    parser.add_argument("--worker", required=True, help="a worker that joins the rendezvous")
    parser.add_argument("--bytes", type=int, default=1 << 30, help="pty-throughput's output")
    parser.add_argument("--rounds", type=int, default=3, help="pty-throughput's rounds")
    parser.add_argument("case", choices=sorted(CASES))
    args = parser.parse_args()
    CASES[args.case](args)
    print("ok")


if __name__ == "__main__":
    main()
