// Which Python runs a job's ranks, and which one trainrun's Python package is for: a `.py` command
// runs with the package's interpreter (cli), and a rank that fails with `ModuleNotFoundError: No
// module named 'trainrun'` (or 'torch', 'numpy') gets one line in the summary naming both
// interpreters (job_supervisor.h's SupervisorOptions::python_hint).
//
//   std::string python = PackagePython();  // "/usr/bin/python3", or "" when unknown
//   std::string line = PythonHint("trainrun", "/usr/local/bin:/usr/bin");
#pragma once

#include <string>

namespace trainrun::launcher {

// PackagePython is the interpreter trainrun's Python package is installed for: the python3 beside
// this trainrun (a virtual environment's bin/), else the one the build was made for, when that file
// exists; "" when neither is there.
std::string PackagePython();

// MissingPythonModule returns the module a rank's stderr says it could not import, when it is one
// of trainrun's own dependencies (trainrun, torch, numpy), else "".
std::string MissingPythonModule(const std::string& stderr_tail);

// PythonHint says, for a rank that could not import `module`, which python3 the ranks ran (the
// first on `path_var`, with its version) and which interpreter trainrun's package is for, and what
// to write instead: "python3 on the job's PATH is /usr/local/bin/python3 (Python 3.12.1), but
// trainrun's Python package is installed for /usr/bin/python3 (Python 3.11.2): run
// `/usr/bin/python3 train.py`".
std::string PythonHint(const std::string& module, const std::string& path_var);

}  // namespace trainrun::launcher
