// RankSetting: how the collectives read a setting (rendezvous/environment.h) outside a
// communicator's constructor, which checks them all first (Communicator::Impl::CheckRankSettings).
#pragma once

#include "trainrun/collectives/errors.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives {

// RankSetting returns `setting`'s value, or throws InvalidArgumentError with its sentence.
template <typename Setting>
auto RankSetting(const Setting& setting) {
  try {
    return setting.Get();
  } catch (const env::BadSetting& e) {
    throw InvalidArgumentError(e.what());
  }
}

}  // namespace trainrun::collectives
