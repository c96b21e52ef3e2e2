#include "trainrun/rendezvous/environment.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainrun::env {
namespace {

// Accepted says which values a setting accepts, for its sentence ("NAME is 'x'; set it to ...").
std::string Accepted(const IntSetting& s) {
  if (s.max_value == kNoLimit) return absl::StrCat("an integer of ", s.min_value, " or more");
  if (s.min_value == 0 && s.max_value == 1) return "0 or 1";
  return absl::StrCat("an integer from ", s.min_value, " to ", s.max_value);
}

std::string Accepted(const StringSetting& s) {
  std::vector<std::string> choices = absl::StrSplit(s.choices, '|');
  std::string last = choices.back();
  choices.pop_back();
  return absl::StrCat(absl::StrJoin(choices, ", "), " or ", last);
}

absl::Status Refused(const char* name, absl::string_view text, const std::string& accepted) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, " is '", text, "'; set it to ", accepted, " (or unset it)"));
}

// ValueOf is the environment's value of a setting named `name` (or `old_name`, when `name` is
// unset), or nullopt when both are unset or empty; `*read` is the name it came from.
std::optional<std::string> ValueOf(const char* name, const char* old_name, const char** read) {
  *read = name;
  std::optional<std::string> value = Lookup(name);
  if ((!value || value->empty()) && old_name != nullptr) {
    value = Lookup(old_name);
    *read = old_name;
  }
  if (!value || value->empty()) return std::nullopt;
  return value;
}

}  // namespace

std::optional<std::string> Lookup(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

absl::StatusOr<int64_t> IntSetting::Parse(absl::string_view text) const {
  int64_t value = 0;
  const bool digits = !text.empty() && (text[0] == '-' || absl::ascii_isdigit(text[0]));
  if (!digits || !absl::SimpleAtoi(text, &value) || value < min_value || value > max_value) {
    return Refused(name, text, Accepted(*this));
  }
  return value;
}

int64_t IntSetting::Get() const {
  const char* read = name;
  std::optional<std::string> text = ValueOf(name, old_name, &read);
  if (!text) return default_value;
  absl::StatusOr<int64_t> value = Parse(*text);
  if (!value.ok()) {
    // Named as set: an old name's value is refused under the old name.
    IntSetting as_read = *this;
    as_read.name = read;
    throw BadSetting(std::string(as_read.Parse(*text).status().message()));
  }
  return *value;
}

absl::StatusOr<std::string> StringSetting::Parse(absl::string_view text) const {
  if (*choices == '\0') return std::string(text);
  for (absl::string_view choice : absl::StrSplit(choices, '|')) {
    if (choice == text) return std::string(text);
  }
  return Refused(name, text, Accepted(*this));
}

std::string StringSetting::Get() const {
  std::optional<std::string> text = Lookup(name);
  if (!text || text->empty()) return default_value;
  absl::StatusOr<std::string> value = Parse(*text);
  if (!value.ok()) throw BadSetting(std::string(value.status().message()));
  return *std::move(value);
}

std::string SettingRef::DefaultText() const {
  if (int_setting != nullptr) return absl::StrCat(int_setting->default_value);
  return string_setting->default_value;
}

absl::Status SettingRef::Check(absl::string_view text) const {
  if (int_setting != nullptr) return int_setting->Parse(text).status();
  return string_setting->Parse(text).status();
}

absl::Status SettingRef::CheckEnvironment() const {
  try {
    if (int_setting != nullptr) {
      (void)int_setting->Get();
    } else {
      (void)string_setting->Get();
    }
  } catch (const BadSetting& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

const SettingRef* FindSetting(absl::string_view name) {
  for (const SettingRef& setting : kSettings) {
    if (setting.name() == name) return &setting;
    if (setting.int_setting != nullptr && setting.int_setting->old_name != nullptr &&
        setting.int_setting->old_name == name) {
      return &setting;
    }
  }
  return nullptr;
}

}  // namespace trainrun::env
