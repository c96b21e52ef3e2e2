#include "trainrun/rendezvous/environment.h"

#include <cerrno>
#include <cstdlib>

namespace trainrun::env {

std::optional<std::string> Lookup(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

int64_t EnvParam::Get() const {
  std::optional<std::string> value = Lookup(name);
  if (!value || value->empty()) return default_value;
  char* end = nullptr;
  errno = 0;
  long long parsed = std::strtoll(value->c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return default_value;
  return parsed;
}

std::string StringParam::Get() const {
  std::optional<std::string> value = Lookup(name);
  if (!value || value->empty()) return default_value;
  return *value;
}

}  // namespace trainrun::env
