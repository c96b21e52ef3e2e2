#include "posix/resolve_on_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainrun::launcher::posix {
namespace {

// The errno exec would give `candidate`, or 0 when it can be executed.
int ExecError(const std::string& candidate) {
  struct stat st {};
  if (::stat(candidate.c_str(), &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) return EACCES;
  return ::access(candidate.c_str(), X_OK) == 0 ? 0 : errno;
}

}  // namespace

Executable ResolveOnPath(const std::string& name, const std::string& path_var) {
  if (name.find('/') != std::string::npos) return {name, ExecError(name)};
  int error = ENOENT;
  for (absl::string_view dir : absl::StrSplit(path_var, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    int e = ExecError(candidate);
    if (e == 0) return {candidate, 0};
    if (e == EACCES) error = EACCES;
  }
  return {name, error};
}

}  // namespace trainrun::launcher::posix
