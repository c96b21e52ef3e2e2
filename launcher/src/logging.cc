#include "trainrun/launcher/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <memory>
#include <mutex>

namespace trainrun::launcher {

spdlog::logger& Logger() {
  // One logger for all of trainrun: spdlog's default one, named "trainrun". The CLI may have
  // installed it already (with its --log-level); otherwise it is made here, once.
  static std::once_flag once;
  std::call_once(once, [] {
    if (spdlog::default_logger_raw()->name() == "trainrun") return;
    auto sink =
        std::make_shared<spdlog::sinks::stderr_color_sink_mt>(spdlog::color_mode::automatic);
    auto logger = std::make_shared<spdlog::logger>("trainrun", std::move(sink));
    logger->set_pattern("trainrun: %^%l%$: %v");
    logger->set_level(spdlog::default_logger_raw()->level());
    spdlog::set_default_logger(std::move(logger));
  });
  spdlog::logger& logger = *spdlog::default_logger_raw();
  logger.flush_on(spdlog::level::trace);
  return logger;
}

void SetLogLevel(spdlog::level::level_enum level) { Logger().set_level(level); }

}  // namespace trainrun::launcher
