// StallInspector: Horovod's stall inspector for a job without a coordinator. Each rank publishes,
// through the rendezvous, a collective it has waited in for the warning time (env::kStallKeyPrefix,
// a rendezvous::StallReport: `allreduce "grad.fc1.weight" (#17)` and how long it had waited); the
// launcher feeds what it reads here once a second and gets back the warning
// to print (which ranks wait in which collective, which have not joined it) and, after the shutdown
// time, the ranks to name as stalled.
//
//   StallInspector inspector(size, warning, shutdown);
//   if (std::string line = inspector.Update(reports, now); !line.empty()) Logger().warn(line);
//   if (inspector.ShutdownDue(now)) supervisor.OnStall(inspector.Stalled(),
//   inspector.Describe(now));
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace trainrun::launcher {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  // `warning`: the ranks' warning time (how long a rank waited before it published, for reports
  // that do not say); `shutdown`: the wait after which the job is ended, 0 for never.
  StallInspector(int size, std::chrono::seconds warning, std::chrono::seconds shutdown);

  // Update takes the current reports (rank → an encoded StallReport; a rank absent or "" waits in
  // none) and returns a warning line when they changed and some rank waits, else "". A rank's wait
  // is what its report said when first seen, plus the time since.
  std::string Update(const std::map<int, std::string>& waiting, Clock::time_point now);

  // ShutdownDue: a shutdown time is set and the longest current wait has reached it.
  bool ShutdownDue(Clock::time_point now) const;

  // Stalled lists the ranks that wait in no collective (a rank waiting inside one waits for
  // others, and is never named); when every rank waits in one, those outside the collective the
  // most ranks wait in.
  std::vector<int> Stalled() const;
  // Describe says who waits where, for how long, and who has not joined: "ranks 1-2 have waited
  // 61 s in allreduce #3, which rank 0 has not joined".
  std::string Describe(Clock::time_point now) const;

 private:
  std::string Collective() const;  // the collective most waiting ranks are in
  std::chrono::seconds Waited(int rank, Clock::time_point now) const;

  int size_;
  std::chrono::seconds warning_;
  std::chrono::seconds shutdown_;
  std::map<int, std::string> waiting_;
  std::map<int, Clock::time_point> seen_;              // when each current report first appeared
  std::map<int, std::chrono::milliseconds> reported_;  // how long its rank had waited by then
};

}  // namespace trainrun::launcher
