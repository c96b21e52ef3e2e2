#include "trainrun/rendezvous/environment.h"

#include <cerrno>
#include <cstdlib>

namespace trainrun::env {

int64_t EnvParam::Get() const {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return default_value;
  char* end = nullptr;
  errno = 0;
  long long parsed = std::strtoll(value, &end, 10);
  if (errno != 0 || *end != '\0') return default_value;
  return parsed;
}

std::string StringParam::Get() const {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return default_value;
  return value;
}

}  // namespace trainrun::env
