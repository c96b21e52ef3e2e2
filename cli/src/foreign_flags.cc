#include "trainrun/cli/foreign_flags.h"

#include <sched.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "trainrun/launcher/gpu_assignment.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::cli {
namespace {

using A = ForeignAction;

// Every foreign spelling trainrun reads. kRename rows take their values from trainrun's flag;
// the others say how many words follow them.
constexpr ForeignFlag kTable[] = {
    // mpirun (Open MPI): single-dash long options and the long ones trainrun names otherwise.
    {"-np", "mpirun", A::kRename, -1, "--num-proc", "the number of ranks"},
    {"--np", "mpirun", A::kRename, -1, "--num-proc", "the number of ranks"},
    {"-c", "mpirun", A::kRename, -1, "--num-proc", "the number of ranks"},
    {"-host", "mpirun", A::kRename, -1, "--hosts", "hosts and slots, as -H"},
    {"--host", "mpirun", A::kRename, -1, "--hosts", "hosts and slots, as -H"},
    {"-hosts", "MPICH", A::kRename, -1, "--hosts", "hosts and slots, as -H"},
    {"-hostfile", "mpirun", A::kRename, -1, "--hostfile", "the hostfile"},
    {"-machinefile", "mpirun", A::kRename, -1, "--hostfile", "the hostfile"},
    {"--machinefile", "mpirun", A::kRename, -1, "--hostfile", "the hostfile"},
    {"--default-hostfile", "mpirun", A::kRename, -1, "--hostfile", "the hostfile"},
    {"-tag-output", "mpirun", A::kRename, -1, "--tag-output", "prefix lines with the rank"},
    {"-timestamp-output", "mpirun", A::kRename, -1, "--timestamp-output",
     "prefix lines with the time"},
    {"-quiet", "mpirun", A::kRename, -1, "--quiet", "no start line and no notes"},
    {"-verbose", "mpirun", A::kRename, -1, "--verbose", "trainrun's debug lines"},
    {"-wdir", "mpirun", A::kRename, -1, "--wdir", "the ranks' working directory"},
    {"-wd", "mpirun", A::kRename, -1, "--wdir", "the ranks' working directory"},
    {"--wd", "mpirun", A::kRename, -1, "--wdir", "the ranks' working directory"},
    {"-bind-to", "mpirun", A::kRename, -1, "--bind-to", "pin ranks to cores or sockets"},
    {"-map-by", "mpirun", A::kRename, -1, "--map-by", "how ranks fill the slots"},
    {"-byslot", "mpirun", A::kRename, 0, "--map-by=slot", "as --map-by slot"},
    {"-report-bindings", "mpirun", A::kRename, -1, "--report-bindings", "one line per rank's CPUs"},
    {"-display-map", "mpirun", A::kRename, -1, "--display-map", "print the plan, then run"},
    {"-oversubscribe", "mpirun", A::kRename, -1, "--oversubscribe",
     "more ranks than cores is intended"},
    {"-output-filename", "mpirun", A::kRename, -1, "--output-filename",
     "each rank's output also to DIR"},
    {"--allow-run-as-root", "mpirun", A::kSilent, 0, "", "accepted: trainrun runs as root anyway"},
    {"-allow-run-as-root", "mpirun", A::kSilent, 0, "", "accepted: trainrun runs as root anyway"},
    {"-mca", "mpirun", A::kMca, 2, "",
     "KEY VALUE: plm_rsh_agent is --rsh-agent, btl_tcp_if_include and oob_tcp_if_include are "
     "--network-interface; other keys are noted and change nothing"},
    {"--mca", "mpirun", A::kMca, 2, "", "as -mca"},
    {"-gmca", "mpirun", A::kMca, 2, "", "as -mca"},
    {"--gmca", "mpirun", A::kMca, 2, "", "as -mca"},
    {"-npernode", "mpirun", A::kRefuse, 1, "",
     "-npernode is mpirun's; give each host's ranks as -H host1:N,host2:N (or a hostfile with "
     "slots=N), and -np for the total"},
    {"--npernode", "mpirun", A::kRefuse, 1, "",
     "--npernode is mpirun's; give each host's ranks as -H host1:N,host2:N (or a hostfile with "
     "slots=N), and -np for the total"},
    {"-N", "mpirun", A::kRefuse, 1, "",
     "-N (ranks per node) is mpirun's; give each host's ranks as -H host1:N,host2:N (or a "
     "hostfile with slots=N), and -np for the total"},
    {"-nolocal", "mpirun", A::kRefuse, 0, "",
     "-nolocal is mpirun's; trainrun runs ranks only on the hosts -H or the hostfile name, so "
     "leave this host out of them"},
    {"--nolocal", "mpirun", A::kRefuse, 0, "",
     "--nolocal is mpirun's; trainrun runs ranks only on the hosts -H or the hostfile name, so "
     "leave this host out of them"},
    {"-bynode", "mpirun", A::kRefuse, 0, "",
     "-bynode is mpirun's round-robin over hosts; trainrun fills each host's slots in order "
     "(--map-by slot): order the hosts, or give -H host1:1,host2:1,..."},
    {"-prefix", "mpirun", A::kRefuse, 1, "",
     "-prefix is Open MPI's install folder on the hosts; trainrun starts the same path as its "
     "own there: give --remote-trainrun PATH if it differs"},
    {"--prefix", "mpirun", A::kRefuse, 1, "",
     "--prefix is Open MPI's install folder on the hosts; trainrun starts the same path as its "
     "own there: give --remote-trainrun PATH if it differs"},

    // torchrun.
    {"--standalone", "torchrun", A::kStandalone, 0, "",
     "a one-node job with its own rendezvous (the default without --nnodes)"},
    {"-m", "torchrun", A::kModule, 0, "", "the command's first word is a module: python3 -m it"},
    {"--module", "torchrun", A::kModule, 0, "", "as -m"},
    {"--nproc-per-node", "torchrun", A::kNprocPerNode, 1, "",
     "N, or auto (the GPUs, else the CPUs), gpu, cpu"},
    {"--nproc_per_node", "torchrun", A::kNprocPerNode, 1, "", "as --nproc-per-node"},
    {"--rdzv-conf", "torchrun", A::kNote, 1, "",
     "--rdzv-conf is accepted for torchrun compatibility and changes nothing: trainrun's "
     "rendezvous has no options; --start-timeout bounds the joining"},
    {"--rdzv_conf", "torchrun", A::kNote, 1, "",
     "--rdzv_conf is accepted for torchrun compatibility and changes nothing: trainrun's "
     "rendezvous has no options; --start-timeout bounds the joining"},
    {"--monitor-interval", "torchrun", A::kNote, 1, "",
     "--monitor-interval is accepted for torchrun compatibility and changes nothing: trainrun "
     "learns of a rank's end at once, without polling"},
    {"--monitor_interval", "torchrun", A::kNote, 1, "",
     "--monitor_interval is accepted for torchrun compatibility and changes nothing: trainrun "
     "learns of a rank's end at once, without polling"},
    {"--start-method", "torchrun", A::kNote, 1, "",
     "--start-method is accepted for torchrun compatibility and changes nothing: every rank is "
     "a process of its own, started fresh"},
    {"--start_method", "torchrun", A::kNote, 1, "",
     "--start_method is accepted for torchrun compatibility and changes nothing: every rank is "
     "a process of its own, started fresh"},
    {"--role", "torchrun", A::kNote, 1, "",
     "--role is accepted for torchrun compatibility and changes nothing: a trainrun job has one "
     "role"},
    {"--local-addr", "torchrun", A::kNote, 1, "",
     "--local-addr is accepted for torchrun compatibility and changes nothing: a node reaches "
     "node 0 from the address its route gives"},
    {"--local_addr", "torchrun", A::kNote, 1, "",
     "--local_addr is accepted for torchrun compatibility and changes nothing: a node reaches "
     "node 0 from the address its route gives"},
    {"--run-path", "torchrun", A::kRefuse, 0, "",
     "--run-path runs the script inside torchrun's own interpreter; trainrun starts each rank as "
     "a process: drop it (a .py command runs with python3)"},
    {"--run_path", "torchrun", A::kRefuse, 0, "",
     "--run_path runs the script inside torchrun's own interpreter; trainrun starts each rank as "
     "a process: drop it (a .py command runs with python3)"},
    {"--local-ranks-filter", "torchrun", A::kRefuse, 1, "",
     "--local-ranks-filter is torchrun's; trainrun shows every rank's output: use --log-dir with "
     "--redirects 3 to keep it off the console"},

    // horovodrun: the flags trainrun has no knob for.
    {"--min-num-proc", "horovodrun", A::kRename, -1, "--min-np", "elastic: the fewest ranks"},
    {"--max-num-proc", "horovodrun", A::kRename, -1, "--max-np", "elastic: the most ranks"},
    {"--gloo-timeout-seconds", "horovodrun", A::kExport, 1, env::kTimeoutSeconds.name,
     "the ranks' TRAINRUN_TIMEOUT"},
    {"--stall-check", "horovodrun", A::kSilent, 0, "", "accepted: the stall check is on anyway"},
    {"-cb", "horovodrun", A::kRefuse, 0, "",
     "-cb (--check-build) is horovodrun's build report; trainrun has one build: trainrun "
     "--version, and `ctest -L gpu` for NCCL"},
    {"--check-build", "horovodrun", A::kRefuse, 0, "",
     "--check-build is horovodrun's build report; trainrun has one build: trainrun --version, "
     "and `ctest -L gpu` for NCCL"},
    {"--binding-args", "horovodrun", A::kRefuse, 1, "",
     "--binding-args passes arguments to mpirun, which trainrun does not use: give --bind-to "
     "core|socket instead"},
    {"--cycle-time-ms", "horovodrun", A::kNote, 1, "",
     "--cycle-time-ms is accepted for horovodrun compatibility and changes nothing: trainrun has "
     "no background cycle: each collective starts when every rank calls it"},
    {"--cache-capacity", "horovodrun", A::kNote, 1, "",
     "--cache-capacity is accepted for horovodrun compatibility and changes nothing: trainrun "
     "has no response cache: there is no coordinator"},
    {"--disable-cache", "horovodrun", A::kNote, 0, "",
     "--disable-cache is accepted for horovodrun compatibility and changes nothing: trainrun "
     "has no response cache: there is no coordinator"},
    {"--hierarchical-allreduce", "horovodrun", A::kNote, 0, "",
     "--hierarchical-allreduce is accepted for horovodrun compatibility and changes nothing: "
     "trainrun picks its allreduce algorithm by itself (shared memory within a host)"},
    {"--no-hierarchical-allreduce", "horovodrun", A::kNote, 0, "",
     "--no-hierarchical-allreduce is accepted for horovodrun compatibility and changes nothing: "
     "trainrun picks its allreduce algorithm by itself (shared memory within a host)"},
    {"--hierarchical-allgather", "horovodrun", A::kNote, 0, "",
     "--hierarchical-allgather is accepted for horovodrun compatibility and changes nothing: "
     "trainrun picks its allgather algorithm by itself (shared memory within a host)"},
    {"--no-hierarchical-allgather", "horovodrun", A::kNote, 0, "",
     "--no-hierarchical-allgather is accepted for horovodrun compatibility and changes nothing: "
     "trainrun picks its allgather algorithm by itself (shared memory within a host)"},
    {"--autotune", "horovodrun", A::kNote, 0, "",
     "--autotune is accepted for horovodrun compatibility and changes nothing: trainrun has no "
     "autotuner (set --fusion-threshold-mb by hand)"},
    {"--no-autotune", "horovodrun", A::kSilent, 0, "", "accepted: trainrun has no autotuner"},
    {"--autotune-log-file", "horovodrun", A::kNote, 1, "",
     "--autotune-log-file is accepted for horovodrun compatibility and changes nothing: trainrun "
     "has no autotuner"},
    {"--autotune-warmup-samples", "horovodrun", A::kNote, 1, "",
     "--autotune-warmup-samples is accepted for horovodrun compatibility and changes nothing: "
     "trainrun has no autotuner"},
    {"--autotune-steps-per-sample", "horovodrun", A::kNote, 1, "",
     "--autotune-steps-per-sample is accepted for horovodrun compatibility and changes nothing: "
     "trainrun has no autotuner"},
    {"--autotune-bayes-opt-max-samples", "horovodrun", A::kNote, 1, "",
     "--autotune-bayes-opt-max-samples is accepted for horovodrun compatibility and changes "
     "nothing: trainrun has no autotuner"},
    {"--autotune-gaussian-process-noise", "horovodrun", A::kNote, 1, "",
     "--autotune-gaussian-process-noise is accepted for horovodrun compatibility and changes "
     "nothing: trainrun has no autotuner"},
    {"--timeline-mark-cycles", "horovodrun", A::kNote, 0, "",
     "--timeline-mark-cycles is accepted for horovodrun compatibility and changes nothing: "
     "trainrun has no background cycles to mark"},
    {"--no-timeline-mark-cycles", "horovodrun", A::kSilent, 0, "",
     "accepted: trainrun has no cycles to mark"},
    {"--mpi-threads-disable", "horovodrun", A::kNote, 0, "",
     "--mpi-threads-disable is accepted for horovodrun compatibility and changes nothing: "
     "trainrun uses no MPI"},
    {"--no-mpi-threads-disable", "horovodrun", A::kSilent, 0, "", "accepted: trainrun uses no MPI"},
    {"--num-nccl-streams", "horovodrun", A::kNote, 1, "",
     "--num-nccl-streams is accepted for horovodrun compatibility and changes nothing: trainrun "
     "uses one NCCL stream per communicator"},
    {"--thread-affinity", "horovodrun", A::kNote, 1, "",
     "--thread-affinity is accepted for horovodrun compatibility and changes nothing: pin ranks "
     "with --bind-to instead"},
    {"--log-hide-timestamp", "horovodrun", A::kNote, 0, "",
     "--log-hide-timestamp is accepted for horovodrun compatibility and changes nothing: "
     "trainrun's own log lines carry no timestamp"},
    {"--no-log-hide-timestamp", "horovodrun", A::kSilent, 0, "", "accepted"},
    {"--log-without-timestamp", "horovodrun", A::kNote, 0, "",
     "--log-without-timestamp is accepted for horovodrun compatibility and changes nothing: "
     "trainrun's own log lines carry no timestamp"},
    {"--log-with-timestamp", "horovodrun", A::kSilent, 0, "", "accepted"},
    {"--mpi", "horovodrun", A::kRefuse, 0, "",
     "--mpi: trainrun needs no MPI or jsrun; it starts the ranks itself (over SSH for other "
     "hosts): drop the flag, and give mpirun's -H, -x or --bind-to to trainrun directly"},
    {"--jsrun", "horovodrun", A::kRefuse, 0, "",
     "--jsrun: trainrun needs no MPI or jsrun; it starts the ranks itself (over SSH for other "
     "hosts): drop the flag, and give mpirun's -H, -x or --bind-to to trainrun directly"},
    {"--mpi-args", "horovodrun", A::kRefuse, 1, "",
     "--mpi-args: trainrun needs no MPI or jsrun; it starts the ranks itself (over SSH for other "
     "hosts): drop the flag, and give mpirun's -H, -x or --bind-to to trainrun directly"},
    {"--gloo", "horovodrun", A::kSilent, 0, "", "accepted: trainrun never uses MPI"},
    {"-prefix-timestamp", "horovodrun", A::kRename, -1, "--prefix-timestamp",
     "prefix lines with the time"},
};

// torchrun flags that may come from PET_<NAME>: the flag, and whether it takes a value.
struct PetFlag {
  const char* name;  // torchrun's, with underscores: PET_ + its capitals
  const char* flag;  // what trainrun reads
  bool takes_value;
};
constexpr PetFlag kPetFlags[] = {
    {"nnodes", "--nnodes", true},
    {"nproc_per_node", "--nproc-per-node", true},
    {"node_rank", "--node-rank", true},
    {"master_addr", "--master-addr", true},
    {"master_port", "--master-port", true},
    {"rdzv_endpoint", "--rdzv-endpoint", true},
    {"rdzv_backend", "--rdzv-backend", true},
    {"rdzv_id", "--rdzv-id", true},
    {"rdzv_conf", "--rdzv-conf", true},
    {"standalone", "--standalone", false},
    {"max_restarts", "--max-restarts", true},
    {"monitor_interval", "--monitor-interval", true},
    {"start_method", "--start-method", true},
    {"role", "--role", true},
    {"module", "--module", false},
    {"no_python", "--no-python", false},
    {"log_dir", "--log-dir", true},
    {"redirects", "--redirects", true},
    {"tee", "--tee", true},
};

absl::Status Bad(std::string sentence) { return absl::InvalidArgumentError(std::move(sentence)); }

const ForeignFlag* Find(absl::string_view spelling) {
  for (const ForeignFlag& row : kTable) {
    if (row.spelling == spelling) return &row;
  }
  return nullptr;
}

// Canonical: a long flag's name with underscores as dashes (torchrun accepts both).
std::string Canonical(absl::string_view flag) { return absl::StrReplaceAll(flag, {{"_", "-"}}); }

int UsableCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

// NprocValue is torchrun's --nproc-per-node value as a number: N, auto (the GPUs, else the CPUs),
// gpu, cpu.
absl::StatusOr<std::string> NprocValue(const std::string& flag, const std::string& value,
                                       std::vector<std::string>& notes) {
  const std::string word = absl::AsciiStrToLower(value);
  if (word == "cpu") {
    notes.push_back(absl::StrCat(flag, " cpu: ", UsableCpus(), " (the CPUs trainrun may use)"));
    return absl::StrCat(UsableCpus());
  }
  if (word == "gpu" || word == "auto") {
    const int gpus = launcher::CountHostGpus();
    if (gpus > 0) {
      notes.push_back(absl::StrCat(flag, " ", word, ": ", gpus, " (the GPUs of this host)"));
      return absl::StrCat(gpus);
    }
    if (word == "gpu") {
      return Bad(absl::StrCat(flag, " gpu: this host has no NVIDIA GPU; give a number, or cpu"));
    }
    notes.push_back(
        absl::StrCat(flag, " auto: ", UsableCpus(), " (no GPU here: the CPUs trainrun may use)"));
    return absl::StrCat(UsableCpus());
  }
  return value;  // a number, checked by the flag itself
}

// The nearest of trainrun's long flags and the table's spellings to `word`, for "did you mean".
std::string Nearest(const CLI::App& app, const std::string& word) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
        diagonal = up;
      }
    }
    return row[b.size()];
  };
  std::string stem = word.substr(word.find_first_not_of('-'));
  std::string best;
  size_t best_distance = std::max<size_t>(2, stem.size() / 4) + 1;
  auto consider = [&](const std::string& name) {
    std::string candidate_stem = name.substr(name.find_first_not_of('-'));
    size_t d = distance(stem, candidate_stem);
    if (d < best_distance) {
      best_distance = d;
      best = name;
    }
  };
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) consider("--" + name);
  }
  for (const ForeignFlag& row : kTable) consider(std::string(row.spelling));
  return best;
}

// Parse state while walking the words before the command.
struct Walk {
  const CLI::App& app;
  std::vector<std::string> in;
  size_t i = 0;
  std::vector<std::string> out;
  std::vector<std::string> notes;
  bool module = false;
  bool standalone = false;
};

// TakeValues moves `count` words after the flag at in[i] into out; one sentence when missing.
absl::Status TakeValues(Walk& w, const std::string& flag, int count) {
  for (int k = 0; k < count; ++k) {
    if (w.i + 1 >= w.in.size()) {
      return Bad(absl::StrCat(flag, " needs ",
                              count == 1 ? "a value" : absl::StrCat(count, " values"),
                              "; see trainrun --help"));
    }
    w.out.push_back(w.in[++w.i]);
  }
  return absl::OkStatus();
}

int ExpectedValues(const CLI::Option* option) {
  int n = option->get_expected_min();
  return n < 0 ? 0 : n;
}

absl::Status Mca(Walk& w, const std::string& flag) {
  if (w.i + 2 >= w.in.size()) {
    return Bad(absl::StrCat(flag, " needs KEY VALUE (e.g. ", flag, " plm_rsh_agent ssh)"));
  }
  const std::string key = w.in[w.i + 1];
  const std::string value = w.in[w.i + 2];
  w.i += 2;
  if (key == "plm_rsh_agent" || key == "orte_rsh_agent" || key == "pls_rsh_agent") {
    w.out.insert(w.out.end(), {"--rsh-agent", value});
  } else if (key == "btl_tcp_if_include" || key == "oob_tcp_if_include") {
    w.out.insert(w.out.end(), {"--network-interface", value});
  } else if (key == "orte_default_hostfile") {
    w.out.insert(w.out.end(), {"--hostfile", value});
  } else {
    w.notes.push_back(absl::StrCat(flag, " ", key, " ", value,
                                   ": Open MPI's parameter changes nothing in trainrun, which "
                                   "uses no MPI (known: plm_rsh_agent, btl_tcp_if_include, "
                                   "oob_tcp_if_include, orte_default_hostfile)"));
  }
  return absl::OkStatus();
}

// Foreign handles the table's row for in[i] (`value` set when it was written FLAG=VALUE).
absl::Status Foreign(Walk& w, const ForeignFlag& row, const std::string& flag,
                     const std::optional<std::string>& value) {
  if (value && row.values != 1 && row.action != A::kRename) {
    return Bad(absl::StrCat("'", flag, "=", *value, "': ", flag, " takes ",
                            row.values == 0 ? "no value" : "its values after a space"));
  }
  switch (row.action) {
    case A::kRename: {
      if (value) {
        w.out.push_back(absl::StrCat(row.target, "=", *value));
        return absl::OkStatus();
      }
      w.out.emplace_back(row.target);
      if (row.values == 0) return absl::OkStatus();
      const CLI::Option* option = w.app.get_option_no_throw(std::string(row.target));
      return TakeValues(w, absl::StrCat(flag, " (", row.target, ")"),
                        option == nullptr ? 0 : ExpectedValues(option));
    }
    case A::kExport: {
      std::string v;
      if (value) {
        v = *value;
      } else {
        if (w.i + 1 >= w.in.size()) return Bad(absl::StrCat(flag, " needs a value"));
        v = w.in[++w.i];
      }
      w.out.insert(w.out.end(), {"-x", absl::StrCat(row.target, "=", v)});
      return absl::OkStatus();
    }
    case A::kNote:
    case A::kSilent: {
      if (row.action == A::kNote) w.notes.emplace_back(row.meaning);
      if (value) return absl::OkStatus();
      w.i += row.values;
      if (w.i >= w.in.size()) return Bad(absl::StrCat(flag, " needs a value"));
      return absl::OkStatus();
    }
    case A::kRefuse:
      return Bad(std::string(row.meaning));
    case A::kMca:
      return Mca(w, flag);
    case A::kModule:
      w.module = true;
      return absl::OkStatus();
    case A::kStandalone:
      w.standalone = true;
      return absl::OkStatus();
    case A::kNprocPerNode: {
      std::string v;
      if (value) {
        v = *value;
      } else {
        if (w.i + 1 >= w.in.size()) return Bad(absl::StrCat(flag, " needs a value"));
        v = w.in[++w.i];
      }
      absl::StatusOr<std::string> n = NprocValue(flag, v, w.notes);
      if (!n.ok()) return n.status();
      w.out.insert(w.out.end(), {"--nproc-per-node", *n});
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// Word handles in[i], a word that starts with '-' before the command.
absl::Status Word(Walk& w) {
  const std::string arg = w.in[w.i];
  std::string flag = arg;
  std::optional<std::string> value;
  if (size_t eq = arg.find('='); eq != std::string::npos) {
    flag = arg.substr(0, eq);
    value = arg.substr(eq + 1);
  }
  if (const ForeignFlag* row = Find(flag)) return Foreign(w, *row, flag, value);

  const bool long_flag = absl::StartsWith(flag, "--");
  // A multi-letter single-dash word is Open MPI's spelling of a long option: -verbose is
  // --verbose. Never one-letter flags bundled or with a value attached (-host is not -h ost).
  std::string name = long_flag || flag.size() == 2 ? flag : absl::StrCat("-", flag);
  const CLI::Option* option = w.app.get_option_no_throw(name);
  if (option == nullptr && long_flag) {
    // torchrun's underscores (--node_rank) where trainrun declares only dashes.
    const std::string dashed = Canonical(name);
    if (dashed != name) {
      option = w.app.get_option_no_throw(dashed);
      if (option != nullptr) name = dashed;
    }
  }
  if (option == nullptr) {
    if (flag.size() > 3 && absl::StartsWith(flag, "-np") &&
        std::all_of(flag.begin() + 3, flag.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return Bad(
          absl::StrCat("'", arg, "': write -np ", flag.substr(3), " (the number after a space)"));
    }
    std::string message = absl::StrCat("unknown flag '", flag, "'");
    if (std::string near = Nearest(w.app, flag); !near.empty()) {
      absl::StrAppend(&message, " (did you mean ", near, "?)");
    } else if (!long_flag && flag.size() > 2) {
      absl::StrAppend(&message,
                      " (trainrun's one-letter flags stand alone, with their value after a "
                      "space: -n 4, -q)");
    }
    absl::StrAppend(&message,
                    "; see trainrun --help (a worker command that starts with '-' goes after --)");
    return Bad(message);
  }
  w.out.push_back(value ? absl::StrCat(name, "=", *value) : name);
  if (value) return absl::OkStatus();
  return TakeValues(w, flag, ExpectedValues(option));
}

// Given: whether the words before the command give `flag` (or its underscore spelling).
bool Given(const std::vector<std::string>& words, absl::string_view flag) {
  for (const std::string& word : words) {
    if (word == "--") return false;
    std::string name = word.substr(0, word.find('='));
    if (Canonical(name) == Canonical(flag)) return true;
  }
  return false;
}

// FromEnvironment: the flags the environment gives that `args` does not (PET_*, the training
// operator's variables, Open MPI's MCA variables), to go before the command line's own.
std::vector<std::string> FromEnvironment(const std::vector<std::string>& args,
                                         const EnvLookup& env) {
  std::vector<std::string> flags;
  if (!env) return flags;
  auto get = [&](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> v = env(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  };
  for (const PetFlag& pet : kPetFlags) {
    std::optional<std::string> v =
        get(absl::StrCat(env::kPetPrefix, absl::AsciiStrToUpper(pet.name)));
    if (!v || Given(args, pet.flag) || Given(flags, pet.flag)) continue;
    if (!pet.takes_value) {
      const std::string word = absl::AsciiStrToLower(*v);
      if (word == "1" || word == "true" || word == "yes") flags.emplace_back(pet.flag);
      continue;
    }
    flags.insert(flags.end(), {pet.flag, *v});
  }
  const bool hosts_given = Given(args, "--hosts") || Given(args, "-H") ||
                           Given(args, "--hostfile") || Given(args, "-hostfile") ||
                           Given(args, "-host") || Given(args, "--host");
  // The training operator's older contract: only in a pod, never in a rank of trainrun or
  // torchrun (which have LOCAL_RANK).
  std::optional<std::string> world = get(env::kTorchWorldSize);
  std::optional<std::string> rank = get(env::kTorchRank);
  std::optional<std::string> master = get(env::kTorchMasterAddr);
  if (world && rank && master && !get(env::kTorchLocalRank) && !hosts_given &&
      !Given(args, "--nnodes") && !Given(flags, "--nnodes")) {
    flags.insert(flags.end(), {"--nnodes", *world});
    if (!Given(args, "--node-rank")) flags.insert(flags.end(), {"--node-rank", *rank});
    if (!Given(args, "--master-addr") && !Given(args, "--rdzv-endpoint")) {
      flags.insert(flags.end(), {"--master-addr", *master});
      if (std::optional<std::string> port = get(env::kTorchMasterPort);
          port && !Given(args, "--master-port")) {
        flags.insert(flags.end(), {"--master-port", *port});
      }
    }
    if (!Given(args, "--nproc-per-node") && !Given(args, "-np") && !Given(args, "--num-proc") &&
        !Given(args, "-n") && !Given(flags, "--nproc-per-node")) {
      flags.insert(flags.end(), {"--nproc-per-node", "1"});
    }
  }
  // An MPIJob's launcher: mpirun's remote shell and hostfile from the environment.
  if (std::optional<std::string> agent = get(env::kOmpiMcaRshAgent);
      agent && !Given(args, "--rsh-agent") && !Given(args, "-mca") && !Given(args, "--mca")) {
    flags.insert(flags.end(), {"--rsh-agent", *agent});
  }
  if (std::optional<std::string> hostfile = get(env::kOmpiMcaHostfile);
      hostfile && !hosts_given && !Given(flags, "--nnodes") && !Given(args, "--nnodes")) {
    flags.insert(flags.end(), {"--hostfile", *hostfile});
  }
  return flags;
}

}  // namespace

absl::Span<const ForeignFlag> ForeignFlags() { return kTable; }

std::string CompatibilityHelp() {
  std::string text =
      "Compatibility: other launchers' spellings, read as trainrun's. Every long flag also takes "
      "one dash (-verbose is --verbose) and torchrun's underscores (--node_rank is --node-rank); "
      "torchrun's PET_* variables, the Kubeflow training operator's MASTER_ADDR, MASTER_PORT, "
      "WORLD_SIZE and RANK, and Open MPI's OMPI_MCA_plm_rsh_agent and "
      "OMPI_MCA_orte_default_hostfile give the flags the command line does not.\n";
  for (const ForeignFlag& row : kTable) {
    std::string what;
    switch (row.action) {
      case A::kRename:
        what = absl::StrCat("as ", row.target, ": ", row.meaning);
        break;
      case A::kExport:
        what = absl::StrCat("sets ", row.target, " for the ranks");
        break;
      case A::kNote:
        what = "accepted; changes nothing (says why)";
        break;
      case A::kRefuse:
        what = "refused, saying what to write instead";
        break;
      default:
        what = std::string(row.meaning);
        break;
    }
    // The tool first, so that no line starts with a dash: these are not trainrun's options.
    std::string left = absl::StrCat("  ", row.tool);
    left.resize(14, ' ');
    absl::StrAppend(&left, row.spelling);
    left.resize(std::max<size_t>(left.size() + 1, 48), ' ');
    absl::StrAppend(&text, left, what, "\n");
  }
  return text;
}

// WalkFlags translates the words of `w` up to the worker command, leaving w.i at its start.
absl::Status WalkFlags(Walk& w) {
  for (; w.i < w.in.size(); ++w.i) {
    const std::string& arg = w.in[w.i];
    if (arg == "--" || arg.size() < 2 || arg[0] != '-') break;  // the command starts here
    if (absl::Status status = Word(w); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<Translation> TranslateForeignFlags(const CLI::App& app,
                                                  std::vector<std::string> args,
                                                  const EnvLookup& env) {
  if (env) {
    // Which flags the command line gives: its words before the worker command (whose own -n or
    // --nnodes are not trainrun's).
    Walk flags_only{app, args};
    if (absl::Status status = WalkFlags(flags_only); !status.ok()) return status;
    std::vector<std::string> given(args.begin(),
                                   args.begin() + static_cast<std::ptrdiff_t>(flags_only.i));
    std::vector<std::string> from_env = FromEnvironment(given, env);
    args.insert(args.begin(), from_env.begin(), from_env.end());
  }
  Walk w{app, std::move(args)};
  if (absl::Status status = WalkFlags(w); !status.ok()) return status;
  std::vector<std::string> command(w.in.begin() + static_cast<std::ptrdiff_t>(w.i), w.in.end());
  if (w.standalone) {
    for (const char* flag :
         {"--nnodes", "--hosts", "--hostfile", "--rdzv-endpoint", "--master-addr"}) {
      if (Given(w.out, flag)) {
        auto it = std::find(w.out.begin(), w.out.end(), flag);
        const bool one_node = std::string(flag) == "--nnodes" && it != w.out.end() &&
                              it + 1 != w.out.end() && (*(it + 1) == "1" || *(it + 1) == "1:1");
        if (!one_node) {
          return Bad(absl::StrCat("--standalone is a one-node job with its own rendezvous; drop ",
                                  flag, " (or --standalone)"));
        }
      }
    }
  }
  if (w.module) {
    if (!command.empty() && command.front() == "--") command.erase(command.begin());
    if (command.empty()) return Bad("-m needs a module to run: trainrun -m pkg.train ARGS");
    w.out.emplace_back("--");
    w.out.insert(w.out.end(), {"python3", "-m"});
  }
  w.out.insert(w.out.end(), command.begin(), command.end());
  return Translation{std::move(w.out), std::move(w.notes)};
}

}  // namespace trainrun::cli
