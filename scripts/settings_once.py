#!/usr/bin/env python3
"""Each setting is read, defaulted and parsed in one place: its declaration.

For every variable rendezvous/include/trainrun/rendezvous/environment.h declares (the IntSetting and
StringSetting names, which carry their default and parser, and the plain `constexpr char k...[]`
names), this reads the source tree (C++, Python, shell; not build*/, docs/ or tests/) and sorts
each place that names it:

  C++      the name written as a string literal ("TRAINRUN_TIMEOUT") instead of the declaration's
           constant, or a setting's value given a default where it is read (`kX.name` beside
           `value_or(`): FAIL. Uses of the constant (env::kTimeoutSeconds.Get(), env::kRank) are
           the accessor: listed as where it is read.
  Python   os.environ.get(NAME, default), os.getenv(NAME, default), ...: a default written again:
           FAIL. A read without one (os.environ[NAME], .get(NAME), NAME in os.environ): FAIL.
           _core.int_setting(NAME) / _core.string_setting(NAME): the declaration's own accessor,
           through the binding. Setting it for a child (env[NAME] = ..., {NAME: ...}): listed.
  shell    ${NAME:-default}: FAIL; $NAME: FAIL; NAME=value: listed (a caller setting it).

The places that may read a variable anyway are EXCEPTIONS below, each with its reason; and the
variables other programs own (torch's RANK, Slurm's SLURM_JOB_ID, the system's PATH: the names
that start neither TRAINRUN_ nor HOROVOD_) may be read by Python and shell code acting as that
program's user (a torch script reads LOCAL_RANK as torchrun sets it), so only their C++ literals
fail. Prints one line per variable (where it is declared, who reads it), then the failures, and
exits 1 when there is one.

    scripts/settings_once.py            # from anywhere; registered as the CTest test settings_once
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = "rendezvous/include/trainrun/rendezvous/environment.h"
SELF = "scripts/settings_once.py"
# The declarations' own code: the parser and Get() of every IntSetting and StringSetting.
ACCESSOR = "rendezvous/src/environment.cc"
SKIP_DIRS = {".git", "docs", "tests", "__pycache__", "node_modules"}
CPP = (".cc", ".h", ".c", ".cu", ".cpp", ".hpp")
PYTHON = (".py",)
SHELL = (".sh", ".bash")

# (path, variable): why this place may read it. Keep each reason a sentence a reviewer can check.
EXCEPTIONS = {
    ("python/trainrun/_run_rank.py", "TRAINRUN_RANK"):
        "a rank started by trainrun.run reports its rank on the connection back before it joins "
        "the job (no communicator yet); trainrun always sets it, and int() of it is strict "
        "(no default)",
    ("python/trainrun/_run_rank.py", "TRAINRUN_RENDEZVOUS_ADDR"):
        "a rank started by trainrun.run connects back to the caller on the rendezvous host "
        "(only the host part is used; the C++ client parses the address itself); '' means no "
        "rendezvous address, so loopback",
    ("python/trainrun/_run_rank.py", "TRAINRUN_RUN_PORT"):
        "a Python-only variable: _launch.py writes it for the ranks it starts and _run_rank.py is "
        "its one reader and parser; environment.h declares the name so that the table lists it",
    ("python/trainrun/_run_rank.py", "TRAINRUN_RUN_TOKEN"):
        "a Python-only variable: _launch.py writes it, _run_rank.py is its one reader (and pops it "
        "so that the rank's own code never sees it)",
    ("python/trainrun/_launch.py", "TRAINRUN_BIN"):
        "a Python-only variable: trainrun.run's one lookup of the launcher (_find_trainrun); no "
        "C++ code reads it",
    ("python/trainrun/_launch.py", "TRAINRUN_RUN_TOKEN"):
        "the writer: trainrun.run exports it to the ranks with -x",
    ("python/trainrun/_launch.py", "TRAINRUN_RUN_PORT"):
        "the writer: trainrun.run exports it to the ranks with -x",
    ("examples/elastic_train.py", "TRAINRUN_HOSTNAME"):
        "a user's training script reads the host trainrun placed it on, as the usage guide says "
        "users may (no default, no parse)",
    ("examples/elastic_train.py", "TRAINRUN_ELASTIC_SLOT"):
        "a user's training script prints the slot it joined in (no default, no parse)",
    ("cli/src/dry_run.cc", "RANK"): "a column header of --dry-run's table, not the variable",
    ("cli/src/dry_run.cc", "LOCAL_RANK"): "a column header of --dry-run's table, not the variable",
    ("launcher/src/monitor/job_view.cc", "RANK"):
        "a column header of the --monitor view, not the variable",
    ("cli/src/run_options.cc", "PATH"):
        "CLI11's placeholder for a flag's value in --help, not the variable",
}


def declarations():
    """[(identifier, name, kind, default text or None, line)] from environment.h, in order."""
    text = open(os.path.join(ROOT, HEADER), encoding="utf-8").read()
    found = []
    for m in re.finditer(r'inline constexpr char (k\w+)\[\] = "([^"]+)";', text):
        found.append((m.start(), m.group(1), m.group(2), "name", None))
    setting = re.compile(r'inline constexpr (IntSetting|StringSetting) (k\w+)\{\s*"([^"]+)",\s*'
                         r'("[^"]*"|[^,]+),', re.S)
    for m in setting.finditer(text):
        found.append((m.start(), m.group(2), m.group(3), m.group(1), m.group(4).strip()))
    found.sort()
    return [(ident, name, kind, default, text.count("\n", 0, at) + 1)
            for at, ident, name, kind, default in found]


def sources():
    for top, dirs, files in os.walk(ROOT):
        rel_top = os.path.relpath(top, ROOT)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")
                         and not d.startswith(".") and not (rel_top == "." and d == "shared"))
        for name in sorted(files):
            if name.endswith(CPP + PYTHON + SHELL):
                path = os.path.normpath(os.path.join(rel_top, name))
                yield path, open(os.path.join(ROOT, path), encoding="utf-8", errors="replace")


def classify_python(line, q):
    if re.search(r"_core\.(int|string)_setting\(\s*" + q, line):
        return "accessor"
    fallback = r"(environ\.get|getenv|environ\.pop|environ\.setdefault)\(\s*"
    if re.search(fallback + q + r"\s*,", line):
        return "default"
    if re.search(r"(environ\.get|getenv|environ\.pop)\(\s*" + q + r"\s*\)", line) or \
            re.search(r"environ\[\s*" + q + r"\s*\](?!\s*=[^=])", line) or \
            re.search(q + r"\s+(not\s+)?in\s+os\.environ", line):
        return "read"
    if re.search(r"\[\s*" + q + r"\s*\]\s*=[^=]", line) or re.search(q + r"\s*:", line):
        return "set"
    return "named"


def classify_shell(line, name):
    if re.search(r"\$\{" + name + r":?[-=?+]", line):
        return "default"
    if re.search(r"\$\{?" + name + r"\b", line):
        return "read"
    if re.search(r"(^|[\s;(])(export\s+)?" + name + r"=", line):
        return "set"
    return None


def main():
    decls = declarations()
    by_name = {name: (ident, kind, default, line) for ident, name, kind, default, line in decls}
    places = {name: [] for name in by_name}  # (path, line number, kind)
    users = {name: set() for name in by_name}  # C++ files using the declaration's constant
    ident_re = {ident: re.compile(r"\b" + ident + r"\b") for ident, *_ in decls}
    # C++: string literals, skipping char literals ('"'), escapes included.
    cpp_literal_re = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\'(?:[^\'\\\n]|\\.)*\'')
    # Python: each quote kind on its own, so that 'X' inside an f"..." string is found too.
    py_literal_res = [re.compile(r'"((?:[^"\\\n]|\\.)*)"'), re.compile(r"'((?:[^'\\\n]|\\.)*)'")]
    shell_re = re.compile(r"\b(" + "|".join(re.escape(n) for n in by_name
                                            if re.fullmatch(r"[A-Za-z_]\w*", n)) + r")\b")
    for path, handle in sources():
        if path in (HEADER, SELF):
            continue
        lang = "cpp" if path.endswith(CPP) else "python" if path.endswith(PYTHON) else "shell"
        for number, line in enumerate(handle, 1):
            if lang == "cpp":
                stripped = line.split("//", 1)[0]
                for ident, name, kind, _, _ in decls:
                    if ident in stripped and ident_re[ident].search(stripped):
                        users[name].add(path)
                        if kind != "name" and "value_or(" in stripped and \
                                re.search(r"\b" + ident + r"\.name\b", stripped) and \
                                not re.search(r"value_or\(\s*(env::)?" + ident + r"\.default_value",
                                              stripped):
                            places[name].append((path, number, "default"))
                for m in cpp_literal_re.finditer(stripped):
                    if m.group(1) in by_name:
                        places[m.group(1)].append((path, number, "literal"))
            elif lang == "python":
                for literal_re in py_literal_res:
                    for m in literal_re.finditer(line):
                        if m.group(1) in by_name:
                            q = re.escape(m.group(0))
                            places[m.group(1)].append((path, number, classify_python(line, q)))
            else:
                code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
                for m in shell_re.finditer(code):
                    kind = classify_shell(code, m.group(1))
                    if kind:
                        places[m.group(1)].append((path, number, kind))

    failures = []
    for ident, name, kind, default, line in decls:
        own = name.startswith(("TRAINRUN_", "HOROVOD_"))
        readers = sorted(users[name] - {ACCESSOR})
        parts = [f"declared {HEADER}:{line} ({ident}"
                 + (f", {kind}, default {default}" if kind != "name" else "") + ")"]
        if kind != "name":
            parts.append(f"parsed and defaulted only by {ACCESSOR}")
        parts.append("C++ uses its constant in " + (", ".join(readers) if readers else "no file"))
        seen = set()
        for path, number, how in places[name]:
            if (path, number, how) in seen:
                continue
            seen.add((path, number, how))
            where = f"{path}:{number}"
            reason = EXCEPTIONS.get((path, name))
            if how in ("set", "named"):
                parts.append(f"{how} at {where}")
            elif how == "accessor":
                parts.append(f"read through the binding at {where}")
            elif reason:
                short = reason.split(";")[0].split("(")[0].strip()
                parts.append(f"{how} at {where} (allowed: {short})")
            elif not own and how in ("read", "default") and not path.endswith(CPP):
                parts.append(f"{how} at {where} (another program's variable)")
            else:
                parts.append(f"{how} at {where}")
                what = {"literal": "names it as a string literal, not the declaration's constant",
                        "default": "gives it a default of its own",
                        "read": "reads it by name, not through the declaration"}[how]
                failures.append(f"{name}: {where} {what}")
        print(f"{name}: " + "; ".join(parts))
    unused = sorted(set(EXCEPTIONS) - {(p, n) for n, ps in places.items() for p, _, _ in ps})
    for path, name in unused:
        failures.append(f"{name}: the exception for {path} matches nothing there any more; "
                        "remove it")
    if failures:
        print(f"\nsettings_once: {len(failures)} place(s) read or default a setting outside its "
              "declaration:", file=sys.stderr)
        for failure in failures:
            print("  " + failure, file=sys.stderr)
        return 1
    print(f"\nsettings once: {len(decls)} variables, each read and defaulted only through its "
          f"declaration (or one of {len(EXCEPTIONS)} listed exceptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
