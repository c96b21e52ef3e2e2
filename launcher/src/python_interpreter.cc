#include "trainrun/launcher/python_interpreter.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "posix/resolve_on_path.h"

namespace trainrun::launcher {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

// Version runs `python --version` ("Python 3.11.2"), "" when it cannot.
std::string Version(const std::string& python) {
  std::string command = absl::StrCat("'", python, "' --version 2>&1");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::array<char, 256> buffer{};
  std::string out;
  for (size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0;)
    out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  if (status != 0) return "";
  return std::string(absl::StripAsciiWhitespace(out));
}

std::string Described(const std::string& python) {
  std::string version = Version(python);
  return version.empty() ? python : absl::StrCat(python, " (", version, ")");
}

}  // namespace

std::string PackagePython() {
  std::error_code error;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::string beside = (self.parent_path() / "python3").string();
    // A virtual environment's bin/ holds trainrun and its python3 (pip install ./python).
    if (IsExecutableFile(beside) &&
        std::filesystem::exists(self.parent_path().parent_path() / "pyvenv.cfg", error)) {
      return beside;
    }
  }
  const std::string built_for = TRAINRUN_PACKAGE_PYTHON;
  return IsExecutableFile(built_for) ? built_for : "";
}

std::string MissingPythonModule(const std::string& stderr_tail) {
  for (const char* module : {"trainrun", "torch", "numpy"}) {
    if (stderr_tail.find(absl::StrCat("No module named '", module, "'")) != std::string::npos) {
      return module;
    }
  }
  return "";
}

std::string PythonHint(const std::string& module, const std::string& path_var) {
  const std::string package = PackagePython();
  const posix::Executable found = posix::ResolveOnPath("python3", path_var);
  const std::string ran = found.error == 0 ? found.path : "";
  std::string line =
      absl::StrCat("python3 on the job's PATH is ", ran.empty() ? "not found" : Described(ran));
  if (package.empty()) {
    return absl::StrCat(line, ", which cannot import '", module,
                        "'; install trainrun's Python package for it (see python/README.md)");
  }
  std::error_code error;
  if (!ran.empty() && std::filesystem::equivalent(ran, package, error)) {
    return absl::StrCat(line, ", the interpreter trainrun's Python package is installed for; '",
                        module, "' is missing there (",
                        module == "trainrun" ? "set PYTHONPATH to "
                                               "the package's folder"
                                             : absl::StrCat("install ", module, " for it"),
                        ")");
  }
  return absl::StrCat(line, ", but trainrun's Python package is installed for ", Described(package),
                      ": name that interpreter in the command (`trainrun ... ", package,
                      " train.py`)");
}

}  // namespace trainrun::launcher
