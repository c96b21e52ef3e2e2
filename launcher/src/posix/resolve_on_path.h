// ResolveOnPath: what execvp would run for a command name, found before anything starts, so that a
// missing command is reported once (locally) and the agent execs a path (remotely).
#pragma once

#include <string>

namespace trainrun::launcher::posix {

// Executable is what execvp would run for a command name, or why it cannot.
struct Executable {
  std::string path;  // the file found; the name itself when none was
  int error = 0;     // the errno execvp would fail with; 0 when `path` can be executed
};

// kDefaultPath is the search path when the environment has no PATH (glibc's execvp default).
inline constexpr char kDefaultPath[] = "/bin:/usr/bin";

// ResolveOnPath searches `path_var` (PATH's value) for `name` as execvp does: a name with a '/' is
// taken as it is; an empty entry means the current directory; a directory or a file without execute
// permission is skipped, and EACCES is reported when that was all that was found, else ENOENT.
Executable ResolveOnPath(const std::string& name, const std::string& path_var);

}  // namespace trainrun::launcher::posix
