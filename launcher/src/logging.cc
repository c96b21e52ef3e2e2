#include "trainrun/launcher/logging.h"

#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace trainrun::launcher {

spdlog::logger& Logger() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(spdlog::color_mode::automatic);
    auto made = std::make_shared<spdlog::logger>("trainrun", std::move(sink));
    made->set_pattern("trainrun: %^%l%$: %v");
    made->set_level(spdlog::level::info);
    made->flush_on(spdlog::level::trace);
    return made;
  }();
  return *logger;
}

void SetLogLevel(spdlog::level::level_enum level) { Logger().set_level(level); }

}  // namespace trainrun::launcher
