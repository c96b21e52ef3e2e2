#!/usr/bin/env bash
# The generated reference (cmake/gen_reference.py): `man -l` renders trainrun(1) without a
# warning and with every flag `trainrun --help` lists and the README's sections; bash completion
# offers flags, flag values and commands; zsh completion loads (sourced, and autoloaded from
# $fpath).
# Usage: reference_test.sh TRAINRUN MAN_PAGE BASH_COMPLETION ZSH_COMPLETION
source "$(dirname "$0")/common.sh"
trainrun=$1 page=$2 bash_completion=$3 zsh_completion=$4
scratch reference
help=$("$trainrun" --help)
# The long flags of the option lines (indented, starting with a dash: "  -n,--num-proc N  ...").
mapfile -t flags < <(grep -E '^ +-' <<<"$help" | awk '{print $1}' | tr ',' '\n' |
                     sed 's/{.*//' | grep -E '^--[a-z]' | sort -u)
((${#flags[@]} > 10)) || fail "found only ${#flags[@]} flags in trainrun --help"

step "man -l $page"
MANWIDTH=100 man --warnings -E UTF-8 -l "$page" >"$work/page.txt" 2>"$work/warnings.txt" ||
  fail "man -l exited $?: $(cat "$work/warnings.txt")"
[[ ! -s $work/warnings.txt ]] || fail "man -l warned: $(cat "$work/warnings.txt")"
rendered=$(cat "$work/page.txt")
for section in NAME SYNOPSIS DESCRIPTION OPTIONS EXAMPLES OUTPUT FAILURES ENVIRONMENT "EXIT STATUS"; do
  expect_in "$rendered" "^$section\$" "section $section"
done
for flag in "${flags[@]}"; do
  expect_in "$rendered" "(^|[ ,])$flag( |,|$)" "the man page's entry for $flag"
done
expect_in "$rendered" 'TRAINRUN_RANK' "ENVIRONMENT names the worker variables"
echo "rendered $(wc -l <"$work/page.txt") lines, ${#flags[@]} flags, no warnings"

step "bash completion"
complete_bash() {  # complete_bash WORD...: what bash completion offers for the last word
  bash --norc --noprofile -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; _trainrun; printf "%s\n" "${COMPREPLY[@]}"' \
    _ "$bash_completion" "$@"
}
offered=$(complete_bash trainrun --)
for flag in "${flags[@]}"; do
  expect_in "$offered" "^$flag\$" "bash completion of '--' offers $flag"
done
expect_in "$(complete_bash trainrun -n)" '^-np$' "bash completion of -n offers -np"
expect_in "$(complete_bash trainrun --log-level w)" '^warning$' "--log-level's values"
expect_in "$(complete_bash trainrun --ssh-client o)" '^openssh$' "--ssh-client's values"
touch "$work/hosts.txt"
expect_in "$(cd "$work" && complete_bash trainrun --hostfile hos)" '^hosts\.txt$' "--hostfile takes a file"
expect_in "$(complete_bash trainrun -np 2 bas)" '^bash$' "the worker command is completed as a command"
if complete_bash trainrun -np 2 python3 --ver | grep -q -- --verbose; then
  fail "bash completion offered trainrun's flags inside the worker's arguments"
fi
echo "offers ${#flags[@]} flags, their values, and the worker command"

step "zsh completion"
command -v zsh >/dev/null || fail "zsh is not installed (scripts/setup.sh installs it)"
zsh -n "$zsh_completion" || fail "zsh -n: syntax error in $zsh_completion"
zsh -fc 'autoload -U compinit; compinit -u -d "$2/zcompdump1"; source "$1"
  [[ $_comps[trainrun] == _trainrun ]] || { print -u2 "not registered: ${_comps[trainrun]-none}"; exit 1 }' \
  _ "$zsh_completion" "$work" || fail "sourcing $zsh_completion after compinit did not register it"
mkdir "$work/fpath" && cp "$zsh_completion" "$work/fpath/_trainrun"
zsh -fc 'fpath=("$1" $fpath); autoload -U compinit; compinit -u -d "$2/zcompdump2"
  [[ $_comps[trainrun] == _trainrun ]] || exit 1' _ "$work/fpath" "$work" ||
  fail "compinit did not pick _trainrun up from \$fpath"
echo "loads sourced and from \$fpath"
echo "reference: all checks passed"
