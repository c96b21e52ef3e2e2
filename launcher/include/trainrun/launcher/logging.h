// trainrun's own messages: spdlog to stderr, "trainrun: error: ...", apart from worker output
// (which is tagged "[rank]<stdout>:" and goes through OutputForwarder).
//
//   trainrun::launcher::Logger().error("rank {} was killed by {}", rank, name);
//   trainrun::launcher::SetLogLevel(spdlog::level::debug);  // --verbose
#pragma once

#include <spdlog/spdlog.h>

namespace trainrun::launcher {

// Logger returns the process-wide "trainrun" logger (created on first use), which writes to
// stderr — in color when stderr is a terminal — flushing every message.
spdlog::logger& Logger();

// SetLogLevel sets the least severe level Logger() prints; the default is info.
void SetLogLevel(spdlog::level::level_enum level);

}  // namespace trainrun::launcher
