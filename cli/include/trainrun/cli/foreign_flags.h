// The spellings other launchers' users type (mpirun, torchrun, horovodrun, MPICH's hydra), in one
// table: what each means to trainrun. The parse (ParseRunArgs) translates them before CLI11 sees
// the arguments, `trainrun --help` lists them (CompatibilityHelp) and the man page's
// COMPATIBILITY section is generated from that help.
//
//   absl::StatusOr<Translation> t = TranslateForeignFlags(app, {"-host", "a:2", "-np", "2", "x"},
//                                                         ProcessEnvironment());
//   // t->args == {"--hosts", "a:2", "--num-proc", "2", "x"}
//
// The same pass checks every word before the command: a word that is neither one of trainrun's
// flags nor a spelling of the table is one sentence naming it (never help, never a one-letter
// flag that swallows the rest of the word: `-host` is not `-h ost`).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace trainrun::cli {

// ForeignAction is what a foreign spelling does.
enum class ForeignAction {
  kRename,        // the same as trainrun's flag `target` (which may carry its value: --map-by=slot)
  kExport,        // sets the ranks' variable `target` to its value (-x NAME=VALUE)
  kNote,          // accepted; one note (`meaning`) says why it changes nothing
  kSilent,        // accepted; changes nothing and needs no note (trainrun does it anyway)
  kRefuse,        // one line: `meaning`
  kMca,           // Open MPI's MCA parameter KEY VALUE: a known key acts, others are a note
  kModule,        // torchrun's -m: the command's first word is a Python module
  kStandalone,    // torchrun's --standalone: a one-node job with its own rendezvous
  kNprocPerNode,  // torchrun's --nproc-per-node N|auto|gpu|cpu
};

// ForeignFlag is one row of the table.
struct ForeignFlag {
  absl::string_view spelling;  // as typed: "-host", "--standalone"
  absl::string_view tool;      // whose it is: "mpirun", "torchrun", "horovodrun", "MPICH"
  ForeignAction action;
  int values;                 // words it takes after it (kRename: -1, trainrun's flag decides)
  absl::string_view target;   // kRename: trainrun's flag; kExport: the variable
  absl::string_view meaning;  // one phrase for --help; kNote and kRefuse: the sentence shown
};

// ForeignFlags is the table.
absl::Span<const ForeignFlag> ForeignFlags();

// CompatibilityHelp is the table as `trainrun --help`'s "Compatibility:" block.
std::string CompatibilityHelp();

// Translation is the arguments with every foreign spelling replaced by trainrun's, and the notes
// its accepted-but-inert spellings produced.
struct Translation {
  std::vector<std::string> args;
  std::vector<std::string> notes;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// TranslateForeignFlags rewrites `args` (argv without argv[0]) for `app` (SetupRunOptions'), up
// to the worker command. `env` (may be empty) supplies flags from torchrun's PET_* variables, the
// Kubeflow training operator's MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK and Open MPI's
// OMPI_MCA_plm_rsh_agent and OMPI_MCA_orte_default_hostfile (an MPIJob's launcher), each only
// where the command line does not give that flag. Errors: InvalidArgument, one sentence naming
// the word.
absl::StatusOr<Translation> TranslateForeignFlags(const CLI::App& app,
                                                  std::vector<std::string> args,
                                                  const EnvLookup& env);

}  // namespace trainrun::cli
