// ShellQuote: words quoted for a POSIX shell, so that it splits them back the same way. Used for
// the agent's exec command (a remote login shell runs it) and for --dry-run's command column (cli),
// hence public.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace trainrun::launcher {

// ShellQuote returns `word` unchanged when it has only characters no shell treats specially
// (letters, digits, _-./=:@,+%), else in single quotes (a ' inside becomes '\''); "" becomes ''.
std::string ShellQuote(absl::string_view word);

// ShellJoin quotes each of `words` and joins them with spaces.
std::string ShellJoin(const std::vector<std::string>& words);

}  // namespace trainrun::launcher
