"""Elastic training end to end (issue 17), real processes under build/bin/trainrun:

    elastic_check.py TRAINRUN PYTHON survive [--tcp]   4 ranks, --min-np 2, rank 2 SIGKILLed
                                                        mid-epoch: the job finishes at 3 ranks
    elastic_check.py TRAINRUN PYTHON second-loss [--tcp]
                                                        as survive, and rank 1 SIGKILLs itself
                                                        in the reset (once generation 1 is out,
                                                        before it connects): the others, forming
                                                        generation 1, move on to generation 2 in
                                                        seconds, not TRAINRUN_TIMEOUT (60 s here)
    elastic_check.py TRAINRUN PYTHON below-min          2 ranks, --min-np 2, rank 1 SIGKILLed: the
                                                        job waits --elastic-timeout 3, then ends
    elastic_check.py TRAINRUN PYTHON discovery          --host-discovery-script lists localhost:2
                                                        and 127.0.0.1:2; after epoch 5 it drops
                                                        127.0.0.1 (and names a new host): ranks 2-3
                                                        are stopped, the job finishes at 2

    elastic_check.py TRAINRUN PYTHON grow               --host-discovery-script lists localhost:2;
                                                        after epoch 5 it adds 127.0.0.1:2: ranks
                                                        2-3 start, join, get the state; the job
                                                        finishes at 4
    elastic_check.py TRAINRUN PYTHON blacklist          as grow, but every rank on 127.0.0.1 fails
                                                        at once: the host is blacklisted, retried
                                                        after 2 s, then after 4 s (cooldown 2 8)
    elastic_check.py TRAINRUN PYTHON all-fail           every rank fails (--min-np 1: the second
                                                        failure leaves none; --min-np 2: the first
                                                        already left too few): the job ends within
                                                        2 s of the last failure, with its code
    elastic_check.py TRAINRUN PYTHON blacklist-all      the discovery script lists localhost:2;
                                                        rank 1 fails, blacklisting the only host:
                                                        the job fails with Horovod's message
    elastic_check.py TRAINRUN PYTHON start-max-np       the discovery script lists localhost:4;
                                                        -np 2 --max-np 4 starts 4 ranks (Horovod's)

Prints "elastic check ok" when every expectation holds; otherwise names the first that failed and
shows trainrun's output.
"""

import re
import subprocess
import sys
import time

KILL_AT_STEP = 30  # mid-epoch: 11 steps an epoch at 4 ranks, so epoch 3's 9th step
BATCHES_PER_COMMIT = 4


def fail(why, output):
    print(output)
    print(f"elastic check FAILED: {why}")
    sys.exit(1)


def run(trainrun, python, flags, script_flags):
    command = [trainrun, *flags, python, "examples/elastic_train.py", *script_flags]
    start = time.monotonic()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240, check=False)
    return done.returncode, done.stdout, time.monotonic() - start


def survive(trainrun, python, tcp):
    flags = ["-np", "4", "--min-np", "2"] + (["--tcp"] if tcp else [])
    code, out, _ = run(trainrun, python, flags,
                       ["--kill-rank", "2", "--kill-at-step", str(KILL_AT_STEP),
                        "--batches-per-commit", str(BATCHES_PER_COMMIT), "--min-accuracy", "0.95"])
    if code != 0:
        fail(f"trainrun exited {code}, not 0", out)
    if not re.search(r"trainrun: warning: rank 2 on localhost was killed by SIGKILL; the job goes "
                     r"on at 3 ranks \(generation 1, formed by ranks 0-1,3 of the start\), "
                     r"recovered in \d+\.\d\d s", out):
        fail("no membership-change line for rank 2's loss", out)
    if "the job survived 1 membership change, 3 of 4 ranks remain" not in out:
        fail("the end does not count the membership change", out)
    # Every survivor resumed at the last commit before the kill: never further back.
    last_commit = KILL_AT_STEP // BATCHES_PER_COMMIT * BATCHES_PER_COMMIT
    resumed = re.findall(r"resumed at step (\d+) of epoch \d+ on (\d+) ranks "
                         r"\(last commit: step (\d+)\)", out)
    if len(resumed) != 3:
        fail(f"{len(resumed)} ranks said they resumed, not 3", out)
    for step, size, commit in resumed:
        if int(step) != last_commit or int(commit) != last_commit or int(size) != 3:
            fail(f"a rank resumed at step {step} on {size} ranks; expected step {last_commit} "
                 "on 3", out)
    final = re.search(r"final test accuracy (\d\.\d+) on 3 rank\(s\) after (\d+) steps", out)
    if not final:
        fail("no final accuracy at 3 ranks", out)
    if float(final.group(1)) < 0.95:
        fail(f"final accuracy {final.group(1)} is below 0.95", out)
    if "parameters bit-identical on every rank" not in out:
        fail("the parameters differ across ranks", out)
    print(f"accuracy {final.group(1)} at 3 ranks, resumed at step {last_commit}")


def second_loss(trainrun, python, tcp):
    import os
    import tempfile
    os.environ["TRAINRUN_TIMEOUT"] = "60"  # what the survivors waited before the fix
    with tempfile.TemporaryDirectory() as tmp:
        times = os.path.join(tmp, "times")
        flags = ["-np", "4", "--min-np", "2"] + (["--tcp"] if tcp else [])
        code, out, took = run(trainrun, python, flags,
                              ["--kill-rank", "2", "--kill-at-step", str(KILL_AT_STEP),
                               "--kill-in-reset", "1", "--times", times,
                               "--min-accuracy", "0.95"])
        with open(times) as f:
            events = [line.split() for line in f]
    if code != 0:
        fail(f"trainrun exited {code}, not 0", out)
    kills = [float(t) for what, t in events if what == "kill"]
    steps = [float(t) for what, t in events if what == "step"]
    if len(kills) != 2 or not steps or steps[-1] < kills[-1]:
        fail(f"expected two kills, then a step; the times file has {events}", out)
    recovery = steps[-1] - kills[-1]
    if not re.search(r"rank 1 on localhost was killed by SIGKILL; the job goes on at 2 ranks "
                     r"\(generation 2, formed by ranks 0,3 of the start\)", out):
        fail("no membership-change line for rank 1's loss", out)
    if "the job survived 2 membership changes, 2 of 4 ranks remain" not in out:
        fail("the end does not count both membership changes", out)
    final = re.search(r"final test accuracy (\d\.\d+) on 2 rank\(s\)", out)
    if not final or float(final.group(1)) < 0.95:
        fail("no final accuracy of 0.95 or more at 2 ranks", out)
    if "parameters bit-identical on every rank" not in out:
        fail("the parameters differ across ranks", out)
    # Before the bootstrap could be interrupted, this took TRAINRUN_TIMEOUT (60 s).
    if recovery > 15:
        fail(f"the survivors took {recovery:.2f} s after the second loss to train again", out)
    print(f"recovered {recovery:.2f} s after the second loss (job {took:.1f} s), "
          f"accuracy {final.group(1)} at 2 ranks")


def below_min(trainrun, python):
    code, out, took = run(trainrun, python,
                          ["-np", "2", "--min-np", "2", "--elastic-timeout", "3"],
                          ["--kill-rank", "1", "--kill-at-step", "5"])
    if code != 128 + 9:
        fail(f"trainrun exited {code}, not 137 (the lost rank's SIGKILL)", out)
    if "rank 1 on localhost was killed by SIGKILL; 1 rank is left, fewer than --min-np 2: " \
       "waiting up to 3 s (--elastic-timeout) for ranks" not in out:
        fail("no line saying trainrun waits for ranks", out)
    if "trainrun: error: rank 1 on localhost was killed by SIGKILL; 1 rank was left, fewer than " \
       "--min-np 2, and no rank came within 3 s (--elastic-timeout), so the job was stopped" \
       not in out:
        fail("no summary saying why the job ended", out)
    if took < 3:
        fail(f"trainrun ended after {took:.1f} s, before the elastic timeout", out)
    left = subprocess.run(["pgrep", "-f", "examples/elastic_train.py --kill-rank 1"],
                          stdout=subprocess.PIPE, text=True, check=False).stdout.split()
    if left:
        fail(f"ranks left running: {left}", out)
    print(f"ended after {took:.1f} s")


def discovery(trainrun, python):
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        hosts = os.path.join(tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("localhost:2\n127.0.0.1:2\n")
        command = [trainrun, "--min-np", "2", "--host-discovery-script", f"cat {hosts}", python,
                   "examples/elastic_train.py", "--epochs", "12", "--min-accuracy", "0.9",
                   # From epoch 5 on each step takes at least 50 ms, so that the job is still
                   # training when the script's next poll (every second) finds the host gone: a
                   # quiet machine trains all 12 epochs in 0.7 s.
                   "--step-sleep", "0.05", "--sleep-from-epoch", "5"]
        start = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        out = ""
        for line in proc.stdout:
            out += line
            if "epoch   5" in line:
                with open(hosts + ".new", "w") as f:
                    f.write("# 127.0.0.1 went away\nlocalhost:2\nnewhost.invalid\n")
                os.rename(hosts + ".new", hosts)
        code = proc.wait(timeout=240)
        took = time.monotonic() - start
    if code != 0:
        fail(f"trainrun exited {code}, not 0", out)
    if not re.search(r"trainrun: warning: host 127\.0\.0\.1 left the host discovery script's "
                     r"output: ranks 2-3 stopped; the job goes on at 2 ranks \(generation 1, "
                     r"formed by ranks 0-1 of the start\), recovered in \d+\.\d\d s", out):
        fail("no membership-change line for the host that left the discovery output", out)
    if "host newhost.invalid appeared in the host discovery script's output" not in out:
        fail("no line for the host that appeared", out)
    if not re.search(r"final test accuracy 0\.9\d+ on 2 rank\(s\)", out):
        fail("the job did not finish at 2 ranks with accuracy >= 0.9", out)
    if "the job survived 1 membership change, 2 of 4 ranks remain, 1 host lost (127.0.0.1)" \
            not in out:
        fail("the end does not count the change", out)
    print(f"shrank to 2 ranks in a job of {took:.1f} s")


def run_with_discovery(trainrun, python, flags, script_flags, rewrite_at, new_hosts):
    """Runs trainrun with --host-discovery-script `cat FILE` listing localhost:2; when a line
    containing `rewrite_at` appears, FILE is rewritten to `new_hosts`. Returns the exit code, the
    output, and each line's arrival time (monotonic seconds), in order."""
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        hosts = os.path.join(tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("localhost:2\n")
        command = [trainrun, "--min-np", "2", *flags, "--host-discovery-script", f"cat {hosts}",
                   python, "examples/elastic_train.py", *script_flags]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        out, times = "", []
        rewritten = None
        for line in proc.stdout:
            out += line
            times.append((time.monotonic(), line))
            if rewritten is None and rewrite_at in line:
                with open(hosts + ".new", "w") as f:
                    f.write(new_hosts)
                os.rename(hosts + ".new", hosts)
                rewritten = time.monotonic()
        code = proc.wait(timeout=240)
    return code, out, times, rewritten


def grow(trainrun, python):
    code, out, _, rewritten = run_with_discovery(
        trainrun, python, ["--max-np", "4"],
        ["--epochs", "12", "--min-accuracy", "0.9",
         # From epoch 5 on each step sleeps 0.3 s until the job has 4 ranks, so that it is still
         # training when the new ranks (a Python with torch each: seconds on a loaded machine)
         # have started and joined.
         "--step-sleep", "0.3", "--sleep-from-epoch", "5", "--sleep-until-size", "4"],
        "epoch   5", "localhost:2\n127.0.0.1:2\n")
    if code != 0:
        fail(f"trainrun exited {code}, not 0", out)
    if rewritten is None:
        fail("the job never reached epoch 5", out)
    if "host 127.0.0.1 appeared in the host discovery script's output: starting ranks 2-3 on it" \
            not in out:
        fail("no line saying the new host's ranks start", out)
    joined = re.search(r"trainrun: warning: host 127\.0\.0\.1 joined \(from the host discovery "
                       r"script\): ranks 2-3 started; the job goes on at 4 ranks \(generation 1, "
                       r"formed by ranks 0-1 of the start and 2-3\), recovered in (\d+\.\d\d) s",
                       out)
    if not joined:
        fail("no membership-change line for the host that joined", out)
    resumed = re.findall(r"resumed at step (\d+) of epoch \d+ on (\d+) ranks "
                         r"\(last commit: step (\d+)\)", out)
    if len(resumed) != 2 or any(int(size) != 4 or step != commit for step, size, commit in resumed):
        fail(f"expected ranks 0-1 to resume at their last commit on 4 ranks: {resumed}", out)
    final = re.search(r"final test accuracy (\d\.\d+) on 4 rank\(s\)", out)
    if not final or float(final.group(1)) < 0.9:
        fail("the job did not finish at 4 ranks with accuracy >= 0.9", out)
    if "parameters bit-identical on every rank" not in out:
        fail("the parameters differ across ranks", out)
    if "the job survived 1 membership change, 4 ranks at the end (2 at the start), 2 ranks " \
       "joined (on 127.0.0.1)" not in out:
        fail("the end does not count the join", out)
    print(f"grew to 4 ranks (recovered in {joined.group(1)} s), accuracy {final.group(1)}")


def blacklist(trainrun, python):
    code, out, times, rewritten = run_with_discovery(
        trainrun, python, ["--max-np", "4", "--blacklist-cooldown-range", "2", "8"],
        ["--epochs", "20", "--fail-on-host", "127.0.0.1",
         "--step-sleep", "0.05", "--sleep-from-epoch", "3"],
        "epoch   5", "localhost:2\n127.0.0.1:2\n")
    if code != 0:
        fail(f"trainrun exited {code}, not 0", out)
    starts = [t for t, line in times
              if "host 127.0.0.1 appeared in the host discovery script's output: starting" in line]
    listed = [(t, line) for t, line in times if "host 127.0.0.1 blacklisted after rank" in line]
    if len(starts) < 3 or len(listed) < 2:
        fail(f"expected at least 3 tries on 127.0.0.1 and 2 blacklistings, saw {len(starts)} and "
             f"{len(listed)}", out)
    expected = [("2", 2.0), ("4", 4.0)]
    for (t, line), (cooldown, seconds), retry in zip(listed, expected, starts[1:]):
        if not re.search(r"host 127\.0\.0\.1 blacklisted after rank \d+ exited with code 1; "
                         rf"not retried for {cooldown} s", line):
            fail(f"blacklisting line not as expected (cooldown {cooldown} s): {line!r}", out)
        # Retried no sooner than the cooldown (less the 0.1 s the log line may lag), and not much
        # later (the discovery polls every second; the machine may be loaded).
        waited = retry - t
        if waited < seconds - 0.1 or waited > seconds + 6:
            fail(f"retried {waited:.2f} s after a {seconds} s blacklisting", out)
        print(f"blacklisted for {cooldown} s, retried after {waited:.2f} s")
    if not re.search(r"final test accuracy \d\.\d+ on 2 rank\(s\)", out):
        fail("the job did not finish at its 2 ranks", out)


def run_ranks(trainrun, flags, code):
    """Runs `code` (Python) as every rank under trainrun `flags`; returns the exit code, the output
    and time.time() when trainrun ended."""
    command = [trainrun, *flags, sys.executable, "-c", code]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, check=False)
    return done.returncode, done.stdout, time.time()


# Rank r sleeps 0.3 + 0.7 r s, prints when it fails, and exits 3 + r.
FAILING_RANK = """
import os, sys, time
rank = int(os.environ["HOROVOD_RANK"])
time.sleep(0.3 + 0.7 * rank)
print(f"rank {rank} fails at {time.time():.3f}", flush=True)
sys.exit(3 + rank)
"""


def all_fail(trainrun):
    for min_np in (1, 2):
        code, out, ended = run_ranks(trainrun, ["-np", "2", "--min-np", str(min_np)], FAILING_RANK)
        failures = [float(t) for t in re.findall(r"rank \d fails at (\d+\.\d+)", out)]
        if len(failures) != 2:
            fail(f"--min-np {min_np}: expected both ranks to fail, saw {len(failures)}", out)
        if code != 4:
            fail(f"--min-np {min_np}: trainrun exited {code}, not 4 (the last failure's code)", out)
        if "trainrun: error: rank 1 on localhost exited with code 4; no rank was left (every rank " \
           "had failed), so the job was stopped" not in out:
            fail(f"--min-np {min_np}: no summary saying no rank was left", out)
        if "rank was left, fewer" in out or "ranks were left" in out:
            fail(f"--min-np {min_np}: the summary counts ranks that were not left", out)
        after = ended - max(failures)
        if after > 2:
            fail(f"--min-np {min_np}: ended {after:.2f} s after the last failure, not within 2 s",
                 out)
        print(f"--min-np {min_np}: ended {after:.2f} s after the last failure")


def blacklist_all(trainrun):
    rank_code = """
import os, sys, time
if os.environ["HOROVOD_RANK"] == "1":
    time.sleep(0.5)
    sys.exit(7)
time.sleep(20)
"""
    start = time.time()
    code, out, ended = run_ranks(
        trainrun, ["-np", "2", "--min-np", "1", "--host-discovery-script", "echo localhost:2"],
        rank_code)
    if code != 7:
        fail(f"trainrun exited {code}, not 7 (the failure that blacklisted the last host)", out)
    if "every host of the host discovery script's output is now blacklisted (localhost), so no " \
       "host is left to go on with: Horovod detected that one or more processes exited with " \
       "non-zero status, and the job was stopped" not in out:
        fail("no summary saying every host is blacklisted", out)
    if ended - start > 15:
        fail(f"the job ran {ended - start:.1f} s: the surviving rank was not stopped", out)
    print(f"failed after {ended - start:.1f} s with every host blacklisted")


def start_max_np(trainrun):
    rank_code = """
import os
print(f"started rank {os.environ['HOROVOD_RANK']} of {os.environ['HOROVOD_SIZE']}", flush=True)
"""
    code, out, _ = run_ranks(
        trainrun, ["-np", "2", "--min-np", "2", "--max-np", "4", "--host-discovery-script",
                   "echo localhost:4"], rank_code)
    if code != 0:
        fail(f"trainrun exited {code}, not 0", out)
    started = sorted(re.findall(r"started rank (\d) of (\d)", out))
    if started != [(str(r), "4") for r in range(4)]:
        fail(f"expected ranks 0-3 of 4 to start, saw {started}", out)
    print("started 4 ranks with -np 2 --max-np 4")


def main():
    trainrun, python, mode = sys.argv[1:4]
    if mode == "survive":
        survive(trainrun, python, "--tcp" in sys.argv[4:])
    elif mode == "second-loss":
        second_loss(trainrun, python, "--tcp" in sys.argv[4:])
    elif mode == "below-min":
        below_min(trainrun, python)
    elif mode == "discovery":
        discovery(trainrun, python)
    elif mode == "grow":
        grow(trainrun, python)
    elif mode == "blacklist":
        blacklist(trainrun, python)
    elif mode == "all-fail":
        all_fail(trainrun)
    elif mode == "blacklist-all":
        blacklist_all(trainrun)
    elif mode == "start-max-np":
        start_max_np(trainrun)
    else:
        sys.exit(f"unknown mode {mode!r}")
    print("elastic check ok")


if __name__ == "__main__":
    main()
