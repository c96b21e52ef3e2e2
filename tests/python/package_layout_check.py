"""The Python package's layout: every module of the built package (PYTHONPATH's trainrun/) is one
concern under 500 lines, and the modules import one another without a cycle, counting imports made
inside functions too (a late import is how a cycle is usually hidden). Each module then imports on
its own in a fresh interpreter, first of the package, which a cycle that the import order happens to
hide would break. Prints "package layout ok"; any failure names the file."""

import ast
import os
import subprocess
import sys

import trainrun

MAX_LINES = 500


def _modules(root):
    """{module name: path} of every .py (and the extension, _core) under the package's folder."""
    found = {}
    base = os.path.dirname(root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py") or f.endswith(".so"):
                path = os.path.join(folder, f)
                parts = os.path.relpath(path, base).split(".")[0].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def _imports(name, path, modules):
    """The package's modules that `name` imports anywhere in its file."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                source = ".".join(anchor + ([source] if source else []))
            # `from a import b`: the module a.b when there is one, else a itself.
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                       for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


def _cycle(graph):
    """One import cycle as a list of module names, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def main():
    root = os.path.dirname(trainrun.__file__)
    modules = _modules(root)
    for must in ("trainrun.common.basics", "trainrun.common.process_sets", "trainrun.common.ops",
                 "trainrun.common.objects", "trainrun.torch.ops", "trainrun.torch.functions"):
        if must not in modules:
            sys.exit(f"package layout: {must} is missing from {root}")
    failures = []
    for name, path in sorted(modules.items()):
        if not path.endswith(".py"):
            continue
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines >= MAX_LINES:
            failures.append(f"{path} has {lines} lines (the limit is {MAX_LINES - 1})")
    graph = {name: _imports(name, path, modules) if path.endswith(".py") else set()
             for name, path in modules.items()}
    cycle = _cycle(graph)
    if cycle:
        failures.append("import cycle: " + " -> ".join(cycle))
    for name in sorted(modules):
        if name.endswith("__main__") or name.endswith("_run_rank"):
            continue  # scripts, not modules to import
        run = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                             text=True, check=False)
        if run.returncode != 0:
            failures.append(f"`import {name}` alone fails: {run.stderr.strip().splitlines()[-1]}")
    if failures:
        sys.exit("package layout:\n  " + "\n  ".join(failures))
    print(f"package layout ok: {len(modules)} modules, no import cycle, each under {MAX_LINES} "
          "lines")


if __name__ == "__main__":
    main()
