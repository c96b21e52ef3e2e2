// trainrun's own messages: spdlog to stderr, "trainrun: error: ...", apart from worker output
// (which is tagged "[rank]<stdout>:" and goes through OutputForwarder).
//
//   trainrun::launcher::Logger().error("rank {} was killed by {}", rank, name);
//   trainrun::launcher::SetLogLevel(spdlog::level::debug);  // --verbose
#pragma once

#include <spdlog/spdlog.h>

namespace trainrun::launcher {

// Logger returns trainrun's one logger: spdlog's default logger, named "trainrun". If the default
// logger is not already named "trainrun" (as the CLI installs it), the first call installs one that
// writes to stderr, "trainrun: <level>: ...", in color on a terminal. Every message is flushed.
spdlog::logger& Logger();

// SetLogLevel sets the least severe level Logger() prints; the default is info.
void SetLogLevel(spdlog::level::level_enum level);

}  // namespace trainrun::launcher
