// MonitorServer: trainrun's live page (--monitor [ADDR:]PORT), served with Boost.Beast on a thread
// of its own, from a JobView.
//
//   GET /            the page (one self-contained HTML file: no request leaves this server)
//   GET /api/state   the JobView as JSON, which the page polls every second
//   GET /metrics     Prometheus' text format
//   GET /top.txt     the terminal view (`trainrun top`), ?width=N columns
//   GET /trace.json  the Chrome/Perfetto trace --timeline-filename writes, when it is on this host
//
// Bound to loopback (the default) anyone on this host may read it; bound elsewhere every request
// must carry the token (?token=, `Authorization: Bearer`, or the page's cookie), compared in
// constant time; without it the answer is 401 and one sentence. A malformed request gets 400, a
// connection that sends nothing for 10 s is closed, and past kMaxConnections new ones are closed
// as they arrive, so no client can hold the job up. Nothing of the ranks' environment is shown.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "monitor/job_view.h"

namespace trainrun::launcher::monitor {

struct MonitorAddress {
  std::string host = "127.0.0.1";
  int port = 0;
  bool loopback = true;
};
// ParseMonitorAddress reads --monitor's [ADDR:]PORT (ADDR may be [v6]); an InvalidArgument sentence
// names what is wrong.
absl::StatusOr<MonitorAddress> ParseMonitorAddress(const std::string& text);

class MonitorServer {
 public:
  static constexpr int kMaxConnections = 4096;
  // Start listens at `address` and serves `view` (which must outlive the server). `token` is
  // required unless the address is loopback; `trace_path` is the timeline file ("" for none).
  static absl::StatusOr<std::unique_ptr<MonitorServer>> Start(const MonitorAddress& address,
                                                              std::string token,
                                                              std::string trace_path,
                                                              const JobView& view);
  ~MonitorServer();
  MonitorServer(const MonitorServer&) = delete;
  MonitorServer& operator=(const MonitorServer&) = delete;

  // The address to give a browser ("http://127.0.0.1:8080/", with ?token= off loopback).
  std::string url() const;
  int port() const;
  // Whether /api/state was asked for in the last `seconds` (a page is watching).
  bool watched(int seconds) const;

  class Impl;

 private:
  explicit MonitorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string host_;
  std::string token_;  // "" on loopback
};

}  // namespace trainrun::launcher::monitor
