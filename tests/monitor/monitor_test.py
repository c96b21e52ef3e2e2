#!/usr/bin/env python3
"""Watching a running job: the straggler line, the --monitor page in headless Chromium, /metrics
through Prometheus' own parser, `trainrun top` through tmux, and bad input to the page.

    monitor_test.py TRAINRUN WORKER CASE [OUT_DIR]

CASE: straggler-shm, straggler-tcp, balanced, page, token, port-in-use, gpu (a rank's GPU use
through a stand-in for NVML, TRAINRUN_FAKE_NVML: tests/monitor/fake_nvml.cc). Exits 77 (CTest's skip)
when a tool the case needs (chromium, tmux, prometheus_client, websocket) is missing outside CI.
"""
import base64
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

TRAINRUN, WORKER, CASE = sys.argv[1:4]
OUT = sys.argv[4] if len(sys.argv) > 4 else tempfile.mkdtemp()
SKIP = 77


def skip_or_fail(what):
    if os.environ.get("CI") == "true":
        sys.exit(f"FAIL: {what}, which CI installs (scripts/setup.sh)")
    print(f"SKIP: {what}")
    sys.exit(SKIP)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """A trainrun job whose stderr lines are collected with the time they arrived."""

    def __init__(self, args, env=None, job_dir=None):
        self.dir = job_dir or tempfile.mkdtemp()
        self.lines = []
        self.start = time.monotonic()
        full_env = dict(os.environ, TRAINRUN_TIMEOUT="60", **(env or {}))
        self.proc = subprocess.Popen(
            [TRAINRUN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=full_env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append((time.monotonic() - self.start, line.rstrip("\n")))

    def wait_line(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if re.search(pattern, line):
                    return at, line
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        return None

    def pid_of(self, rank):
        path = os.path.join(self.dir, f"rank{rank}.pid")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with open(path) as f:
                    return int(f.read())
            except (OSError, ValueError):
                time.sleep(0.05)
        raise AssertionError(f"rank {rank} wrote no pid")

    def finish(self, timeout=120):
        code = self.proc.wait(timeout=timeout)
        self.reader.join(5)
        return code

    def stderr(self):
        return "\n".join(line for _, line in self.lines)


def worker(seconds, slow_rank, sleep_ms, job_dir):
    return [WORKER, str(seconds), str(slow_rank), str(sleep_ms), job_dir]


def check(condition, message, job=None):
    if not condition:
        if job is not None:
            print("--- trainrun's stderr ---\n" + job.stderr(), file=sys.stderr)
        sys.exit("FAIL: " + message)


def run_straggler(transport):
    env = {"TRAINRUN_TRANSPORT": transport}
    job_dir = tempfile.mkdtemp()
    job = Job(["-np", "4", "-x", f"TRAINRUN_TRANSPORT={transport}",
               *worker(30, 2, 200, job_dir)], env)
    found = job.wait_line(r"^.*straggler: rank \d+", 40)
    check(found is not None, "no straggler line", job)
    at, line = found
    print(f"{transport}: after {at:.1f} s: {line}")
    check("straggler: rank 2 " in line, f"the straggler line names another rank: {line}", job)
    check(at <= 15, f"the straggler line came after {at:.1f} s, not within 15 s", job)
    code = job.finish()
    check(code == 0, f"the job exited {code}", job)
    named = [l for _, l in job.lines if "straggler: rank" in l]
    check(len(named) == 1, f"the straggler line was repeated without a change: {named}", job)
    check("collectives over the whole run" in job.stderr(), "no end-of-job table", job)
    print(job.stderr().split("collectives over the whole run")[1][:900])


def run_balanced():
    for run in range(5):
        job_dir = tempfile.mkdtemp()
        job = Job(["-np", "4", "--straggler-window", "5", *worker(11, -1, 0, job_dir)])
        code = job.finish()
        check(code == 0, f"balanced run {run}: the job exited {code}", job)
        false = [l for _, l in job.lines if "straggler:" in l]
        check(not false, f"balanced run {run} named a straggler: {false}", job)
        print(f"balanced run {run}: no straggler line")


class Browser:
    """Headless Chromium driven through the DevTools protocol (python3-websocket)."""

    def __init__(self):
        import websocket  # python3-websocket
        self.profile = tempfile.mkdtemp()
        self.proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "--remote-allow-origins=*", "--window-size=1280,860", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if time.monotonic() > deadline:
                raise AssertionError("chromium did not start")
            time.sleep(0.1)
        with open(port_file) as f:
            port = int(f.readline())
        tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in tabs if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def close(self):
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            self.proc.wait(10)
            shutil.rmtree(self.profile, ignore_errors=True)


ROWS = ("JSON.stringify(Array.from(document.querySelectorAll('tr.rank')).map(r => "
        "({id: r.id, state: r.dataset.state, straggler: r.classList.contains('straggler')})))")


def rows(browser):
    return json.loads(browser.evaluate(ROWS) or "[]")


def metric_values(url):
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(url + "metrics", timeout=5).read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def run_page():
    try:
        import websocket  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError as e:
        skip_or_fail(f"python module {e.name} is missing")
    for tool in ("chromium", "tmux"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is missing")
    port = free_port()
    job_dir = tempfile.mkdtemp()
    job = Job(["-np", "4", "--monitor", f"127.0.0.1:{port}", "--stall-check-warning-time-seconds",
               "2", *worker(40, 2, 200, job_dir)], job_dir=job_dir)
    found = job.wait_line(r"monitor: http://", 30)
    check(found is not None, "trainrun printed no monitor address", job)
    url = re.search(r"(http://\S+)", found[1]).group(1)
    browser = Browser()
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=url)
        # Every rank on the page while the job runs.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(rows(browser)) < 4:
            time.sleep(0.2)
        shown = rows(browser)
        check(sorted(r["id"] for r in shown) == [f"rank-{r}" for r in range(4)],
              f"the page shows {shown}", job)
        # The straggler, highlighted once trainrun names it.
        check(job.wait_line(r"straggler: rank 2 ", 30) is not None, "no straggler line", job)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(r["straggler"] for r in rows(browser)):
            time.sleep(0.2)
        highlighted = [r["id"] for r in rows(browser) if r["straggler"]]
        check(highlighted == ["rank-2"], f"the page highlights {highlighted}, not rank-2", job)
        time.sleep(1.5)  # a timeline with a few points in it
        shot = browser.call("Page.captureScreenshot", format="png")
        shot_path = os.path.join(OUT, "monitor_page.png")
        with open(shot_path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        check(os.path.getsize(shot_path) > 10000, "the screenshot is empty", job)
        print(f"page: every rank shown, rank 2 highlighted; screenshot {shot_path}")

        # /metrics through Prometheus' parser: the counters grow while the job runs.
        before = metric_values(url)
        time.sleep(2.5)
        after = metric_values(url)
        for rank in range(4):
            key = ("trainrun_collectives_total", (("host", "localhost"), ("rank", str(rank))))
            if key not in before:
                key = next(k for k in before if k[0] == "trainrun_collectives_total" and
                           dict(k[1])["rank"] == str(rank))
            check(after[key] > before[key], f"rank {rank}'s collectives did not grow: "
                  f"{before[key]} -> {after[key]}", job)
        state = [k for k in after if k[0] == "trainrun_rank_state"]
        check(len(state) == 4, f"trainrun_rank_state has {len(state)} series", job)
        print("metrics: parsed, trainrun_collectives_total grew for every rank")

        # trainrun top, read through tmux.
        session = f"trainrun-top-{os.getpid()}"
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "30",
                        f"{TRAINRUN} top 127.0.0.1:{port}"], check=True)
        try:
            time.sleep(3)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                    capture_output=True, text=True, check=True).stdout
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session])
        check("RANK" in screen and all(re.search(rf"^\s+{r} ", screen, re.M) for r in range(4)),
              f"trainrun top shows:\n{screen}", job)
        check("straggler" in screen, f"trainrun top names no straggler:\n{screen}", job)
        print("top:\n" + screen.rstrip())

        # Bad input: a malformed request gets a 4xx; 1,000 idle connections hold nothing up.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"NOT HTTP AT ALL\x00\x01\r\n\r\n")
            answer = s.recv(4096).decode(errors="replace")
        check(re.match(r"HTTP/1\.[01] 4\d\d", answer) is not None,
              f"a malformed request got: {answer[:200]!r}", job)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(1000)]
        started = time.monotonic()
        body = urllib.request.urlopen(url + "api/state", timeout=5).read()
        took = time.monotonic() - started
        check(json.loads(body)["job"]["size"] == 4, "the state under 1,000 idle connections", job)
        for s in idle:
            s.close()
        print(f"bad input: malformed request -> {answer.splitlines()[0]}; with 1,000 idle "
              f"connections open the state came in {took * 1000:.0f} ms")

        # A SIGSTOPped rank shows `stalled` within 2 s of the stall warning.
        stopped = job.pid_of(1)
        os.kill(stopped, signal.SIGSTOP)
        try:
            warned = job.wait_line(r"stall: ", 20)
            check(warned is not None, "no stall warning", job)
            deadline = time.monotonic() + 5
            stalled_at = None
            while time.monotonic() < deadline:
                state = {r["id"]: r["state"] for r in rows(browser)}
                if state.get("rank-1") == "stalled":
                    stalled_at = time.monotonic() - job.start
                    break
                time.sleep(0.1)
            check(stalled_at is not None, f"rank 1 is shown as {state.get('rank-1')}", job)
            late = stalled_at - warned[0]
            print(f"stall: warning at {warned[0]:.1f} s, the page showed rank 1 stalled "
                  f"{late:.2f} s later")
            check(late <= 2, f"the page showed the stall {late:.2f} s after the warning", job)
        finally:
            os.kill(stopped, signal.SIGCONT)
    finally:
        browser.close()
    code = job.finish()
    check(code == 0, f"the job exited {code} (it should have run on unharmed)", job)


def run_token():
    port = free_port()
    job_dir = tempfile.mkdtemp()
    job = Job(["-np", "2", "--monitor", f"0.0.0.0:{port}", *worker(8, -1, 0, job_dir)],
              {"TRAINRUN_MONITOR_TOKEN": "s3cret-token"})
    found = job.wait_line(r"monitor: http://", 30)
    check(found is not None and "token=s3cret-token" in found[1],
          "trainrun printed no address with the token", job)
    base = f"http://127.0.0.1:{port}/"
    for path in ("", "api/state", "metrics"):
        try:
            urllib.request.urlopen(base + path, timeout=5)
            check(False, f"/{path} answered without the token", job)
        except urllib.error.HTTPError as e:
            body = e.read().decode()
            check(e.code == 401 and "token" in body, f"/{path}: {e.code} {body}", job)
    request = urllib.request.Request(base + "api/state",
                                     headers={"Authorization": "Bearer wrong"})
    try:
        urllib.request.urlopen(request, timeout=5)
        check(False, "a wrong token was accepted", job)
    except urllib.error.HTTPError as e:
        check(e.code == 401, f"a wrong token got {e.code}", job)
    state = json.load(urllib.request.urlopen(base + "api/state?token=s3cret-token", timeout=5))
    check(state["job"]["size"] == 2, "the state with the token", job)
    top = subprocess.run([TRAINRUN, "top", f"127.0.0.1:{port}", "--once"], capture_output=True,
                         text=True, env=dict(os.environ, TRAINRUN_MONITOR_TOKEN="s3cret-token"))
    check(top.returncode == 0 and "RANK" in top.stdout, f"top --once: {top.stderr}", job)
    code = job.finish()
    check(code == 0, f"the job exited {code}", job)
    print("token: 401 with one sentence without it or with a wrong one; 200 with it")


def run_port_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job_dir = tempfile.mkdtemp()
        job = Job(["-np", "2", "--monitor", str(port), *worker(2, -1, 0, job_dir)])
        code = job.finish()
    said = [l for _, l in job.lines if "--monitor" in l]
    check(code == 0, f"the job exited {code}", job)
    check(len(said) == 1 and "in use" in said[0] and "runs without the page" in said[0],
          f"trainrun said {said}", job)
    print(f"port in use: {said[0]}")


def run_gpu():
    try:
        import prometheus_client  # noqa: F401
    except ImportError as e:
        skip_or_fail(f"python module {e.name} is missing")
    port = free_port()
    job_dir = tempfile.mkdtemp()
    # The stand-in NVML puts local rank i on device i, busy 40 + 10·i %, with (i + 1) × 256 MiB of
    # the rank's own there.
    job = Job(["-np", "2", "--monitor", f"127.0.0.1:{port}", *worker(8, -1, 0, job_dir)],
              env={"TRAINRUN_NVML_LIBRARY": os.environ["TRAINRUN_FAKE_NVML"]}, job_dir=job_dir)
    found = job.wait_line(r"monitor: http://", 30)
    check(found is not None, "trainrun printed no monitor address", job)
    url = re.search(r"(http://\S+)", found[1]).group(1)
    want = {"0": (0.40, 1 << 28), "1": (0.50, 2 << 28)}
    deadline = time.monotonic() + 20
    seen = {}
    while time.monotonic() < deadline:
        values = metric_values(url)
        seen = {dict(labels)["rank"]: (value, values.get(("trainrun_gpu_memory_used_bytes", labels)))
                for (name, labels), value in values.items()
                if name == "trainrun_gpu_utilization_ratio"}
        if len(seen) == 2:
            break
        time.sleep(0.5)
    check(seen == want, f"/metrics gives the ranks' GPUs as {seen}, not {want}", job)
    state = json.loads(urllib.request.urlopen(url + "api/state", timeout=5).read())
    gpus = {str(r["rank"]): (r["gpu"], r["gpu_memory"]) for r in state["ranks"]}
    check(gpus == want, f"the page's state gives the ranks' GPUs as {gpus}", job)
    code = job.finish()
    check(code == 0, f"the job exited {code}", job)
    print("gpu: /metrics and the page show rank 0 at 40% and 256 MiB, rank 1 at 50% and 512 MiB")


CASES = {
    "straggler-shm": lambda: run_straggler("shm"),
    "straggler-tcp": lambda: run_straggler("tcp"),
    "balanced": run_balanced,
    "page": run_page,
    "token": run_token,
    "port-in-use": run_port_in_use,
    "gpu": run_gpu,
}
CASES[CASE]()
print(f"{CASE}: passed")
