#include "trainrun/cli/per_node_options.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "trainrun/hostfile/slot_plan.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::cli {
namespace {

absl::Status Bad(std::string sentence) { return absl::InvalidArgumentError(std::move(sentence)); }

// ParseEndpoint reads HOST, HOST:PORT or [IPV6]:PORT (torchrun's --rdzv-endpoint).
absl::Status ParseEndpoint(const std::string& text, launcher::PerNodeSpec& spec) {
  std::string host = text;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) {
      return Bad(absl::StrCat("--rdzv-endpoint '", text, "': an IPv6 address needs its ']'"));
    }
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        return Bad(absl::StrCat("--rdzv-endpoint '", text, "': write [ADDRESS]:PORT"));
      }
      port = text.substr(close + 2);
    }
  } else if (size_t colon = text.rfind(':'); colon != std::string::npos) {
    if (text.find(':') != colon) {
      return Bad(absl::StrCat("--rdzv-endpoint '", text,
                              "': write an IPv6 address in brackets, [ADDRESS]:PORT"));
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) {
    return Bad(absl::StrCat("--rdzv-endpoint '", text, "' names no host; write HOST:PORT"));
  }
  spec.endpoint_host = host;
  if (!port.empty() || text.back() == ':') {
    int value = 0;
    if (!absl::SimpleAtoi(port, &value) || value < 1 || value > 65535) {
      return Bad(
          absl::StrCat("--rdzv-endpoint '", text, "': the port must be a number from 1 to 65535"));
    }
    spec.endpoint_port = value;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Bad(absl::StrCat("--rdzv-token-file ", path, ": cannot read it"));
  std::stringstream text;
  text << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.empty()) return Bad(absl::StrCat("--rdzv-token-file ", path, " is empty"));
  return token;
}

absl::StatusOr<std::string> ResolveToken(const PerNodeOptions& options, const PerNodeFacts& facts) {
  if (options.rdzv_token && options.rdzv_token_file) {
    return Bad("give either --rdzv-token or --rdzv-token-file, not both");
  }
  if (options.rdzv_token) {
    if (options.rdzv_token->empty()) return Bad("--rdzv-token is empty; give a secret or drop it");
    return *options.rdzv_token;
  }
  if (options.rdzv_token_file) return ReadTokenFile(*options.rdzv_token_file);
  if (facts.env) {
    if (std::optional<std::string> token = facts.env(env::kRdzvToken); token && !token->empty()) {
      return *token;
    }
  }
  return std::string();
}

}  // namespace

void SetupPerNodeOptions(CLI::App& app, PerNodeOptions& options) {
  CLI::Option_group* group = app.add_option_group(
      "Per-node mode",
      "trainrun started once on each node, as torchrun: node 0 serves the rendezvous at "
      "--rdzv-endpoint, the others join it.");
  group
      ->add_option("--nnodes", options.nnodes,
                   "Number of nodes of the job, or MIN:MAX: start once MIN have joined and "
                   "--rdzv-last-call has passed (at once when MAX have).")
      ->type_name("N|RANGE");
  group->add_option("--node-rank,--node_rank", options.node_rank, "This node's index, 0 to N-1.")
      ->type_name("K");
  group
      ->add_option("--rdzv-last-call,--rdzv_last_call", options.rdzv_last_call,
                   "With --nnodes MIN:MAX: seconds node 0 waits for more nodes once MIN have "
                   "joined (torchrun's last_call_timeout; default 30).")
      ->type_name("SECONDS")
      ->check(CLI::Range(0, 86400));
  group
      ->add_option("--nproc-per-node,--nproc_per_node", options.nproc_per_node,
                   "Ranks on this node (without --nnodes: as -np on this host).")
      ->type_name("N");
  group
      ->add_option("--rdzv-endpoint,--rdzv_endpoint", options.rdzv_endpoint,
                   "Node 0's HOST:PORT: node 0 listens there, the others dial it (port default "
                   "29400).")
      ->type_name("HOST:PORT");
  group
      ->add_option("--rdzv-id,--rdzv_id", options.rdzv_id,
                   "The job's id; every node must give the same (default: none).")
      ->type_name("ID");
  group
      ->add_option("--rdzv-token,--rdzv_token", options.rdzv_token,
                   "Shared secret a node must give to join (also TRAINRUN_RDZV_TOKEN). Without "
                   "one, any node that reaches the endpoint may join, as with torchrun.")
      ->type_name("SECRET");
  group
      ->add_option("--rdzv-token-file,--rdzv_token_file", options.rdzv_token_file,
                   "File holding the shared secret (its first line).")
      ->type_name("FILE");
  group
      ->add_option("--rdzv-backend,--rdzv_backend", options.rdzv_backend,
                   "Accepted for torchrun compatibility: c10d or static (trainrun's own "
                   "rendezvous either way).")
      ->type_name("NAME");
  group
      ->add_option("--master-addr,--master_addr", options.master_addr,
                   "Node 0's address (with --master-port: instead of --rdzv-endpoint).")
      ->type_name("HOST");
  group
      ->add_option("--master-port,--master_port", options.master_port,
                   "Node 0's port, with --master-addr.")
      ->type_name("PORT")
      ->check(CLI::Range(1, 65535));
}

absl::StatusOr<PerNodeResult> MakePerNodeSpec(const PerNodeOptions& options,
                                              const PerNodeFacts& facts) {
  PerNodeResult result;
  result.num_proc = facts.num_proc;
  if (options.rdzv_backend && *options.rdzv_backend != "c10d" &&
      *options.rdzv_backend != "static") {
    return Bad(
        absl::StrCat("--rdzv-backend ", *options.rdzv_backend,
                     ": trainrun serves its own rendezvous; give c10d or static, or drop it"));
  }
  if (!options.nnodes) {
    // Flags that only mean something with --nnodes.
    const std::pair<bool, const char*> needs_nnodes[] = {
        {options.node_rank.has_value(), "--node-rank"},
        {options.rdzv_endpoint.has_value(), "--rdzv-endpoint"},
        {options.rdzv_id.has_value(), "--rdzv-id"},
        {options.rdzv_token.has_value(), "--rdzv-token"},
        {options.rdzv_token_file.has_value(), "--rdzv-token-file"},
        {options.rdzv_last_call.has_value(), "--rdzv-last-call"},
        {options.master_addr.has_value(), "--master-addr"},
        {options.master_port.has_value(), "--master-port"},
    };
    for (const auto& [given, flag] : needs_nnodes) {
      if (given) {
        return Bad(absl::StrCat(flag,
                                " is for per-node mode; give --nnodes too (the job's number "
                                "of nodes)"));
      }
    }
    if (options.nproc_per_node) {
      if (facts.num_proc && *facts.num_proc != *options.nproc_per_node) {
        return Bad(absl::StrCat("-np ", *facts.num_proc, " and --nproc-per-node ",
                                *options.nproc_per_node, " disagree; give one of them"));
      }
      result.num_proc = *options.nproc_per_node;
    }
    return result;
  }

  launcher::PerNodeSpec spec;
  // torchrun's elastic range MIN:MAX (a PyTorchJob's PET_NNODES is "2:2" when it has an elastic
  // policy): MAX is the job's nodes (node ranks 0 to MAX-1), MIN how many it starts with.
  std::string nnodes = *options.nnodes;
  if (size_t colon = nnodes.find(':'); colon != std::string::npos) {
    int low = 0, high = 0;
    if (!absl::SimpleAtoi(nnodes.substr(0, colon), &low) ||
        !absl::SimpleAtoi(nnodes.substr(colon + 1), &high) || low < 1 || low > high ||
        high > 65536) {
      return Bad(absl::StrCat("--nnodes ", *options.nnodes,
                              ": give N, or MIN:MAX with 1 <= MIN <= MAX <= 65536"));
    }
    nnodes = nnodes.substr(colon + 1);
    if (low != high) spec.min_nnodes = low;
  }
  if (!absl::SimpleAtoi(nnodes, &spec.nnodes)) {
    return Bad(absl::StrCat("--nnodes ", *options.nnodes, ": give one number of nodes"));
  }
  if (spec.nnodes < 1 || spec.nnodes > 65536) {
    return Bad(absl::StrCat("--nnodes ", *options.nnodes, " must be from 1 to 65536"));
  }
  if (facts.hosts_given) {
    return Bad(
        "--nnodes starts this node's ranks here and -H/--hostfile name hosts for trainrun "
        "to reach: give one or the other");
  }
  if (facts.rendezvous_given) {
    return Bad(
        "--rendezvous-port and --rendezvous-addr are not used with --nnodes: the job's "
        "rendezvous is node 0's --rdzv-endpoint");
  }
  if (facts.launcher != "auto") {
    return Bad(absl::StrCat("--launcher ", facts.launcher,
                            " does not go with --nnodes: each node's trainrun starts its own "
                            "ranks"));
  }
  if (!options.nproc_per_node && !facts.num_proc) {
    return Bad(absl::StrCat("--nnodes ", spec.nnodes,
                            " needs --nproc-per-node (this node's ranks), or -np (the job's "
                            "total)"));
  }
  if (spec.min_nnodes > 0 && !options.nproc_per_node) {
    return Bad(absl::StrCat("--nnodes ", *options.nnodes,
                            " needs --nproc-per-node: with a range of nodes, -np (the job's "
                            "total) is not known before the nodes join"));
  }
  if (spec.min_nnodes > 0 && facts.num_proc) {
    return Bad(absl::StrCat("-np does not go with --nnodes ", *options.nnodes,
                            ": the job's total depends on how many nodes join; give "
                            "--nproc-per-node only"));
  }
  if (options.rdzv_last_call) {
    if (spec.min_nnodes == 0) {
      return Bad(
          absl::StrCat("--rdzv-last-call is for --nnodes MIN:MAX (a range of nodes); --nnodes ",
                       *options.nnodes, " waits for every node"));
    }
    spec.last_call = std::chrono::seconds(*options.rdzv_last_call);
  }
  if (options.nproc_per_node) {
    spec.nproc_per_node = *options.nproc_per_node;
  } else if (*facts.num_proc % spec.nnodes != 0) {
    return Bad(absl::StrCat("-np ", *facts.num_proc, " is not a multiple of --nnodes ", spec.nnodes,
                            "; give --nproc-per-node"));
  } else {
    spec.nproc_per_node = *facts.num_proc / spec.nnodes;
  }
  if (spec.nproc_per_node < 1 || spec.nproc_per_node > hostfile::kMaxSlotsPerHost) {
    return Bad(absl::StrCat("--nproc-per-node ", spec.nproc_per_node, " must be from 1 to ",
                            hostfile::kMaxSlotsPerHost));
  }
  const int total = spec.nnodes * spec.nproc_per_node;
  if (facts.num_proc && *facts.num_proc != total) {
    return Bad(absl::StrCat("-np ", *facts.num_proc, " is the job's total, but --nnodes ",
                            spec.nnodes, " x --nproc-per-node ", spec.nproc_per_node, " makes ",
                            total, "; fix one of them"));
  }
  result.num_proc = total;
  if (spec.nnodes == 1 && !options.rdzv_endpoint && !options.master_addr) {
    // One node: an ordinary job on this host.
    return result;
  }
  if (!options.node_rank) {
    return Bad(absl::StrCat("--nnodes ", spec.nnodes,
                            " needs --node-rank (this node's index, 0 to ", spec.nnodes - 1, ")"));
  }
  spec.node_rank = *options.node_rank;
  if (spec.node_rank < 0 || spec.node_rank >= spec.nnodes) {
    return Bad(absl::StrCat("--node-rank ", spec.node_rank, " is out of range for --nnodes ",
                            *options.nnodes, " (0 to ", spec.nnodes - 1, ")"));
  }
  if (options.rdzv_endpoint && (options.master_addr || options.master_port)) {
    return Bad("give either --rdzv-endpoint or --master-addr/--master-port, not both");
  }
  if (options.master_port && !options.master_addr) {
    return Bad("--master-port needs --master-addr (node 0's address)");
  }
  if (options.rdzv_endpoint) {
    if (absl::Status parsed = ParseEndpoint(*options.rdzv_endpoint, spec); !parsed.ok()) {
      return parsed;
    }
  } else if (options.master_addr) {
    if (options.master_addr->empty()) return Bad("--master-addr is empty; give node 0's address");
    spec.endpoint_host = *options.master_addr;
    if (options.master_port) spec.endpoint_port = spec.master_port = *options.master_port;
  } else {
    return Bad(absl::StrCat("--nnodes ", spec.nnodes,
                            " needs --rdzv-endpoint HOST:PORT (node 0's address; or --master-addr "
                            "and --master-port)"));
  }
  if (options.rdzv_id) {
    if (options.rdzv_id->empty() ||
        options.rdzv_id->find_first_of(" \t\r\n") != std::string::npos) {
      return Bad(absl::StrCat("--rdzv-id '", *options.rdzv_id,
                              "' must be one word, the same on every node"));
    }
    spec.rdzv_id = *options.rdzv_id;
  }
  absl::StatusOr<std::string> token = ResolveToken(options, facts);
  if (!token.ok()) return token.status();
  spec.token = *std::move(token);
  result.spec = std::move(spec);
  return result;
}

absl::StatusOr<hostfile::SlotPlan> PerNodePlan(const launcher::PerNodeSpec& spec) {
  return launcher::PerNodeSlotPlan(spec, std::vector<int>(spec.nnodes, spec.nproc_per_node));
}

}  // namespace trainrun::cli
