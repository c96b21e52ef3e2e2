// Monitor: JobRun's one seam to the live view. It holds the JobView, reads the ranks' attribution
// reports from the rendezvous server once a second (printing the straggler line when it changes),
// serves the page when --monitor asks for it, and prints the whole run's table at the end.
//
//   Monitor monitor(spec, plan, io);
//   monitor.Serve(server);                 // after the rendezvous server starts
//   monitor.OnStarted(rank); monitor.OnExit(rank, exit); monitor.OnOutput(rank, bytes);
//   monitor.OnStalls(waiting, inspector, warning);
//   monitor.Finish(summary);               // in Summarize
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "job_plan.h"
#include "monitor/job_view.h"
#include "monitor/monitor_server.h"
#include "trainrun/launcher/launch_spec.h"
#include "trainrun/launcher/stall_inspector.h"
#include "trainrun/rendezvous/server.h"

namespace trainrun::launcher::monitor {

class Monitor {
 public:
  Monitor(const LaunchSpec& spec, const JobPlan& plan, boost::asio::io_context& io);
  ~Monitor();

  // Serve starts reading reports from `server` (and the count of membership changes from
  // `membership_changes`) once a second.
  void Serve(const rendezvous::Server& server, std::function<int()> membership_changes);
  void OnStarted(int rank) { view_.OnStarted(rank); }
  void OnExit(int rank, const ExitInfo& exit) { view_.OnExit(rank, exit); }
  void OnOutput(int rank, std::string_view bytes) { view_.OnOutput(rank, bytes); }
  // OnStalls: the ranks' stall reports as StallInspector read them, and its warning when it gave
  // one; returns what to add to that warning (a pointer to the straggler line).
  std::string OnStalls(const std::map<int, std::string>& waiting, const StallInspector& inspector,
                       const std::string& warning);
  // Finish stops reading, prints the whole run's table when a straggler was named or --monitor
  // was given, and gives a watching page a moment to show the end.
  void Finish(const std::string& summary);

 private:
  void Tick();
  void ReadReports();

  const LaunchSpec& spec_;
  JobView view_;
  boost::asio::steady_timer timer_;
  const rendezvous::Server* server_ = nullptr;
  std::function<int()> membership_changes_;
  std::unique_ptr<MonitorServer> page_;
  std::string stall_;
  bool finished_ = false;
};

}  // namespace trainrun::launcher::monitor
