#!/usr/bin/env python3
"""Generates trainrun's reference from the program itself: the man page trainrun(1), and bash and
zsh completion, all from one parse of `trainrun --help` (CLI11's layout), plus the README's opening
(the man page's DESCRIPTION) and the user reference's (docs/usage.md) paragraphs on output, failures
and the environment. Run at build time
(cmake/TrainrunReference.cmake), so a flag added to the CLI appears everywhere without editing.

    gen_reference.py --trainrun build/bin/trainrun --readme README.md --reference docs/usage.md --version 0.1.0 \\
        --man out/trainrun.1 --bash out/trainrun --zsh out/_trainrun

Standard library only; writes ASCII roff (non-ASCII characters become roff escapes).
"""

import argparse
import gzip
import re
import subprocess
import sys
from dataclasses import dataclass, field


@dataclass
class Option:
    names: list          # every spelling: -n, --num-proc, and aliases such as -np
    metavar: str = ""    # the value's name (N, FILE, LEVEL); empty for a flag
    kind: str = ""       # the value's type from CLI11 (INT, FILE), when it gives one
    choices: list = field(default_factory=list)
    default: str = ""
    help: str = ""
    group: str = ""

    @property
    def takes_value(self):
        return bool(self.metavar)

    def value_kind(self):
        """What completes the value: choices, file, dir, host, variable, or nothing."""
        if self.choices:
            return "choices"
        word = (self.metavar + " " + self.kind).upper()
        if "DIR" in word.split() or self.metavar.upper() == "DIR":
            return "dir"
        if re.search(r"\b(FILE|PATH)\b", word):
            return "file"
        if self.metavar.upper() in ("LIST", "HOST", "HOSTS"):
            return "host"
        if self.metavar.upper().startswith("NAME"):
            return "variable"
        if self.metavar.upper() == "NIC" or self.metavar.upper().startswith("NIC"):
            return "interface"
        return "none"


@dataclass
class Help:
    summary: str = ""        # the first description line
    synopsis: list = field(default_factory=list)
    options: list = field(default_factory=list)
    footer: list = field(default_factory=list)  # (title, lines) blocks after the options


OPTION_LINE = re.compile(r"^(\s+)(-\S.*?)(?:\s{2,}(\S.*))?$")


def parse_spec(spec):
    """'-n,--num-proc N' or '--log-level LEVEL:{a,b}' or '--start-timeout SECONDS:INT in [1 - 9]=30'."""
    first, _, rest = spec.partition(" ")
    names = [re.sub(r"\{.*\}$", "", n) for n in first.split(",") if n]
    option = Option(names=names)
    # CLI11's notes on the spec line: "Excludes: --x", "Needs: --y", "REQUIRED", "(Env:VAR)".
    rest = re.sub(r"(^|\s+)(Excludes|Needs):.*$", "", rest)
    rest = re.sub(r"(^|\s+)(\(Env:\S+\)|REQUIRED\b)", "", rest).strip()
    if rest:
        default = re.search(r"=([^\s\]]+)$", rest)
        if default:
            option.default = default.group(1)
            rest = rest[: default.start()]
        choices = re.search(r"\{([^}]*)\}", rest)
        if choices:
            option.choices = choices.group(1).split(",")
            rest = rest[: choices.start()] + rest[choices.end():]
        metavar, _, kind = rest.partition(":")
        option.metavar = metavar.strip().rstrip(":")
        option.kind = kind.strip()
    return option


def parse_help(text):
    help = Help()
    lines = text.splitlines()
    i = 0
    description = []
    while i < len(lines) and not lines[i].startswith("Usage:"):
        description.append(lines[i])
        i += 1
    if i == len(lines):
        sys.exit("gen_reference: `trainrun --help` printed no 'Usage:' line; is this CLI11's help?")
    help.summary = description[0].strip().rstrip(":") if description else ""
    help.synopsis = [d.strip() for d in description[1:] if d.strip()]
    if not help.synopsis:
        help.synopsis = [lines[i][len("Usage:"):].strip()]
    i += 1

    group = ""
    current = None
    in_options = False
    while i < len(lines):
        line = lines[i]
        i += 1
        stripped = line.strip()
        if not stripped:
            current = None
            continue
        if stripped == "Options:":
            in_options = True
            current = None
            continue
        group_match = re.match(r"^\[Option Group: (.*)\]$", stripped)
        if group_match:
            group = group_match.group(1)
            in_options = True
            current = None
            continue
        if not line[0].isspace():
            i -= 1
            break
        if not in_options:
            continue
        match = OPTION_LINE.match(line)
        if match and (current is None or len(match.group(1)) <= current_indent):
            current = parse_spec(match.group(2))
            current_indent = len(match.group(1))
            current.help = match.group(3) or ""
            current.group = group
            help.options.append(current)
        elif current is not None:
            current.help = (current.help + " " + stripped).strip()

    # Aliases the description names: "(also -np)".
    for option in help.options:
        for alias in re.findall(r"\(also (-[\w-]+)\)", option.help):
            if alias not in option.names:
                option.names.append(alias)

    # The footer: blocks separated by blank lines; "Title:" opens a block.
    block = None
    for line in lines[i:]:
        title = re.match(r"^([A-Z][A-Za-z ]*):(.*)$", line)
        if title:
            block = (title.group(1), [title.group(2).strip()] if title.group(2).strip() else [])
            help.footer.append(block)
        elif block is not None:
            block[1].append(line)
        elif line.strip():
            block = ("", [line])
            help.footer.append(block)
    return help


# ---- README paragraphs ------------------------------------------------------------------------

def readme_paragraphs(text):
    """The README's paragraphs, code blocks (indented) left out."""
    paragraphs, current = [], []
    for line in text.splitlines():
        if not line.strip() or line.startswith("    ") or line.startswith("#"):
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(line.strip())
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def readme_intro(text):
    """The paragraphs between the title and the first section."""
    head = text.split("\n## ", 1)[0]
    return [p for p in readme_paragraphs(head)]


def readme_section(paragraphs, leads):
    """Paragraphs that open with a bold lead in `leads` ("**Output.** ..."); the lead goes when it
    is a heading ("Output." or "Failures:"), stays as words when it starts a sentence."""
    found = []
    for lead in leads:
        for p in paragraphs:
            m = re.match(r"^\*\*" + re.escape(lead) + r"(\.?)\*\*(:?)\s*(.*)$", p)
            if not m:
                continue
            text = m.group(3) if (m.group(1) or m.group(2)) else lead + " " + m.group(3)
            found.append(text[:1].upper() + text[1:])
    return found


# ---- roff ------------------------------------------------------------------------------------

ROFF_CHARS = {"\u2014": r"\(em", "\u2013": r"\(en", "\u2192": r"\(->", "\u2190": r"\(<-",
              "\u00d7": r"\(mu", "\u00b5": r"\(mc", "\u2026": "...", "\u2019": "'",
              "\u201c": r"\(lq", "\u201d": r"\(rq", "\u2265": r"\(>=", "\u2264": r"\(<="}


def roff_escape(text):
    text = text.replace("\\", r"\e").replace("-", r"\-")
    out = []
    for ch in text:
        if ord(ch) < 128:
            out.append(ch)
        else:
            out.append(ROFF_CHARS.get(ch, r"\[u%04X]" % ord(ch)))
    return "".join(out)


def roff_inline(markdown):
    """Markdown's `code` and **bold** to roff fonts; everything else escaped."""
    out = []
    for part in re.split(r"(`[^`]*`|\*\*[^*]+\*\*)", markdown):
        if part.startswith("`") and part.endswith("`") and len(part) >= 2:
            out.append(r"\fB" + roff_escape(part[1:-1]) + r"\fR")
        elif part.startswith("**") and part.endswith("**") and len(part) >= 4:
            out.append(r"\fB" + roff_escape(part[2:-2]) + r"\fR")
        else:
            out.append(roff_escape(part))
    return "".join(out)


def roff_text(text):
    """A filled paragraph: one sentence a line (roff's convention), none starting with a dot."""
    lines = []
    for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z`(*])", text.strip()):
        line = roff_inline(sentence)
        if line.startswith(".") or line.startswith("'"):
            line = r"\&" + line
        lines.append(line)
    return "\n".join(lines)


def option_heading(option):
    names = r", ".join(r"\fB" + roff_escape(n) + r"\fR" for n in option.names)
    if option.metavar:
        names += r" \fI" + roff_escape(option.metavar) + r"\fR"
    return names


def option_help(option):
    text = option.help
    if option.choices:
        text += " One of: " + ", ".join(option.choices) + "."
    if option.default and option.default not in ("false", "true"):
        text += " Default: " + option.default + "."
    return roff_text(text)


def man_page(help, readme, reference, version):
    paragraphs = readme_paragraphs(reference)
    out = [
        r'.\" trainrun(1), generated from `trainrun --help`, README.md and docs/usage.md by',
        r'.\" cmake/gen_reference.py. Do not edit: change the program or those files.',
        '.TH TRAINRUN 1 "" "trainrun %s" "User Commands"' % version,
        ".SH NAME",
        r"trainrun \- " + roff_escape(help.summary[:1].lower() + help.summary[1:]),
        ".SH SYNOPSIS",
    ]
    for line in help.synopsis:
        words = line.split()
        out.append(".B " + roff_escape(words[0]))
        if len(words) > 1:
            out.append(roff_escape(" ".join(words[1:])))
        out.append(".br")
    out.append(".SH DESCRIPTION")
    for i, p in enumerate(readme_intro(readme)):
        if i:
            out.append(".PP")
        out.append(roff_text(p))
    out.append(".SH OPTIONS")
    group = ""
    for option in help.options:
        if option.group != group:
            group = option.group
            out.append(".SS " + roff_escape(group))
        out += [".TP", option_heading(option), option_help(option)]
    for title, lines in help.footer:
        body = [l for l in lines]
        while body and not body[-1].strip():
            body.pop()
        if not body:
            continue
        out.append(".SH " + roff_escape(title.upper() or "NOTES"))
        if all(l.startswith("  ") or not l.strip() for l in body):  # a block of commands
            out.append(".nf")
            out += [roff_escape(l.strip()) if l.strip() else "" for l in body]
            out.append(".fi")
        else:
            text = " ".join(l.strip() for l in body)
            out.append(roff_text(text))
    sections = [("OUTPUT", ["Output"]), ("FAILURES", ["Failures"]),
                ("ENVIRONMENT", ["What a worker sees", "Tunables"]),
                ("COMPATIBILITY", ["Placement", "Per-rank log files", "Config files"])]
    for title, leads in sections:
        found = readme_section(paragraphs, leads)
        if not found:
            print(f"gen_reference: docs/usage.md has no paragraph opening with **{leads[0]}**; "
                  f"the man page has no {title} section", file=sys.stderr)
            continue
        out.append(".SH " + title)
        for i, p in enumerate(found):
            if i:
                out.append(".PP")
            out.append(roff_text(p))
    out += [".SH EXIT STATUS",
            "The exit code of the rank that failed first (128+N for signal N), 0 when every rank "
            "succeeded, 2 for bad flags, hosts or hostfiles, 127 when the command cannot be "
            "executed.",
            ".SH SEE ALSO",
            r"\fBssh\fR(1), \fBssh_config\fR(5); the README and python/README.md of trainrun's "
            "sources."]
    return "\n".join(out) + "\n"


# ---- bash --------------------------------------------------------------------------------------

def bash_completion(help):
    value_names = sorted({n for o in help.options if o.takes_value for n in o.names})
    all_names = sorted({n for o in help.options for n in o.names})
    cases = []
    for o in help.options:
        if not o.takes_value:
            continue
        kind = o.value_kind()
        action = {
            "choices": 'COMPREPLY=($(compgen -W "%s" -- "$cur"))' % " ".join(o.choices),
            "file": 'COMPREPLY=($(compgen -f -- "$cur"))',
            "dir": 'COMPREPLY=($(compgen -d -- "$cur"))',
            "host": 'COMPREPLY=($(compgen -A hostname -- "$cur"))',
            "variable": 'COMPREPLY=($(compgen -A variable -- "$cur"))',
            "interface": 'COMPREPLY=($(compgen -W "$(ls /sys/class/net 2>/dev/null)" -- "$cur"))',
            "none": "COMPREPLY=()",
        }[kind]
        cases.append("      %s) %s; return ;;" % ("|".join(o.names), action))
    return """# bash completion for trainrun(1); generated from `trainrun --help` by cmake/gen_reference.py.
# trainrun's flags, their values (choices, files, hosts), then the worker command and its arguments.

_trainrun() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  local i=1 dashdash=0
  # i: where the worker command starts, the first word that is neither a flag nor a flag's value.
  while ((i < COMP_CWORD)); do
    case ${COMP_WORDS[i]} in
      --) ((i++)); dashdash=1; break ;;
      %(value_names)s) ((i += 2)) ;;
      -*) ((i++)) ;;
      *) break ;;
    esac
  done
  if ((i < COMP_CWORD)); then
    # In the worker command's arguments: complete as for that command when bash-completion is
    # loaded, else file names.
    if declare -F _command_offset >/dev/null; then
      _command_offset "$i"
    else
      COMPREPLY=($(compgen -f -- "$cur"))
    fi
    return
  fi
  if ((i > COMP_CWORD)); then
    # The value of the flag before the cursor.
    case $prev in
%(cases)s
    esac
  fi
  if ((dashdash)) || [[ $cur != -* ]]; then
    COMPREPLY=($(compgen -c -- "$cur"))
    return
  fi
  COMPREPLY=($(compgen -W "%(names)s" -- "$cur"))
}
complete -F _trainrun trainrun
""" % {"value_names": "|".join(value_names), "cases": "\n".join(cases),
       "names": " ".join(all_names)}


# ---- zsh ---------------------------------------------------------------------------------------

def zsh_quote(text):
    return text.replace("'", "'\\''")


def zsh_completion(help):
    specs = []
    for o in help.options:
        sentence = re.split(r"(?<=\.)\s", o.help, maxsplit=1)[0].rstrip(".")
        desc = re.sub(r"([\[\]:\\])", r"\\\1", sentence)
        action = ""
        if o.takes_value:
            metavar = re.sub(r"[:\\]", "", o.metavar) or "value"
            kind = o.value_kind()
            action = ":%s:%s" % (metavar, {
                "choices": "(" + " ".join(o.choices) + ")",
                "file": "_files", "dir": "_files -/", "host": "_hosts",
                "variable": "_parameters", "interface": "_net_interfaces", "none": " ",
            }[kind])
        repeatable = "*" if "repeatable" in o.help else ""
        exclusive = "" if repeatable else "(%s)" % " ".join(o.names)
        names = o.names[0] if len(o.names) == 1 else "{" + ",".join(o.names) + "}"
        specs.append("    '%s%s'%s'[%s]%s'" % (exclusive, repeatable, names, zsh_quote(desc),
                                                 zsh_quote(action))
                     if len(o.names) > 1 else
                     "    '%s%s%s[%s]%s'" % (exclusive, repeatable, o.names[0], zsh_quote(desc),
                                             zsh_quote(action)))
    return """#compdef trainrun
# zsh completion for trainrun(1); generated from `trainrun --help` by cmake/gen_reference.py.
# Autoloaded from $fpath (as _trainrun), or sourced after compinit.

_trainrun() {
  _arguments -S \\
%s \\
    '(-)*::worker command:_normal'
}

if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
  _trainrun "$@"
else
  compdef _trainrun trainrun
fi
""" % " \\\n".join(specs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainrun", required=True, help="the trainrun executable")
    parser.add_argument("--readme", required=True, help="README.md: its opening is DESCRIPTION")
    parser.add_argument("--reference", required=True,
                        help="docs/usage.md: OUTPUT, FAILURES, ENVIRONMENT, COMPATIBILITY")
    parser.add_argument("--version", required=True)
    parser.add_argument("--man", help="write the man page here (and FILE.gz)")
    parser.add_argument("--bash", help="write bash completion here")
    parser.add_argument("--zsh", help="write zsh completion here")
    args = parser.parse_args()

    result = subprocess.run([args.trainrun, "--help"], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"gen_reference: `{args.trainrun} --help` exited {result.returncode}: "
                 f"{result.stderr.strip()}")
    help = parse_help(result.stdout)
    if len(help.options) < 2:
        sys.exit(f"gen_reference: found only {len(help.options)} options in `trainrun --help`")
    with open(args.readme, encoding="utf-8") as f:
        readme = f.read()
    with open(args.reference, encoding="utf-8") as f:
        reference = f.read()

    if args.man:
        page = man_page(help, readme, reference, args.version)
        with open(args.man, "w", encoding="ascii") as f:
            f.write(page)
        with open(args.man + ".gz", "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
                f.write(page.encode("ascii"))
    if args.bash:
        with open(args.bash, "w", encoding="utf-8") as f:
            f.write(bash_completion(help))
    if args.zsh:
        with open(args.zsh, "w", encoding="utf-8") as f:
            f.write(zsh_completion(help))


if __name__ == "__main__":
    main()
