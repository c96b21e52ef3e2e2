#include "remote/trainrun_probe.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "trainrun/launcher/shell_quote.h"

namespace trainrun::launcher::remote {
namespace {

// ReadVersion reads what `<trainrun> --version` printed on `stream` until it ends, and turns it
// into the release or the reason there is none.
absl::StatusOr<std::string> ReadVersion(const std::string& name, const std::string& trainrun,
                                        channel::HostStream& stream, absl::Time deadline) {
  stream.CloseStdin();
  std::string printed;
  char buffer[1024];
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("host ", name, ": `", trainrun,
                       " --version` did not finish in time; raise --start-timeout"));
    }
    absl::StatusOr<size_t> n = stream.Read(buffer, sizeof buffer, left);
    if (!n.ok() && absl::IsDeadlineExceeded(n.status())) continue;
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    if (printed.size() < 4096) printed.append(buffer, *n);
  }
  absl::Status end = stream.EndStatus();
  if (!end.ok() && absl::StrContains(end.message(), "exited with status 127")) {
    return absl::NotFoundError(absl::StrCat("host ", name, ": trainrun not found at ", trainrun,
                                            "; install it there, or pass --remote-trainrun PATH"));
  }
  if (!end.ok()) return end;
  // `--gpu-probe` (a trainrun that has it) adds a line "gpu: ...", passed on after a newline.
  std::string gpu;
  if (size_t at = printed.find("\ngpu: "); at != std::string::npos) {
    gpu = printed.substr(at + 6);
    gpu = std::string(absl::StripAsciiWhitespace(gpu.substr(0, gpu.find('\n'))));
  }
  const std::string first_line = printed.substr(0, printed.find('\n'));
  absl::string_view line = absl::StripAsciiWhitespace(first_line);
  if (!absl::ConsumePrefix(&line, "trainrun ") || line.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("host ", name, ": ", trainrun, " is not trainrun (`--version` printed \"",
                     absl::CEscape(absl::StripAsciiWhitespace(first_line).substr(0, 80)), "\")"));
  }
  return gpu.empty() ? std::string(line) : absl::StrCat(line, "\n", gpu);
}

}  // namespace

std::vector<absl::StatusOr<std::string>> ProbeTrainrun(channel::HostChannel& channel,
                                                       const std::vector<hostfile::HostSpec>& hosts,
                                                       const std::string& trainrun,
                                                       absl::Time deadline) {
  // The channel's callbacks and the reading threads own what they share: a host that answers
  // after this call gave up on it finds its slot still there.
  struct Shared {
    std::mutex mu;
    std::condition_variable changed;
    std::vector<std::optional<absl::StatusOr<std::string>>> results;
    std::vector<std::thread> readers;
    bool collected = false;  // the readers were joined: a later one (past the deadline) detaches
    int running = 0;
  };
  auto shared = std::make_shared<Shared>();
  shared->results.resize(hosts.size());
  shared->running = static_cast<int>(hosts.size());
  auto finish = [shared](int i, absl::StatusOr<std::string> result) {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->results[i] = std::move(result);
    --shared->running;
    shared->changed.notify_all();
  };
  channel.Start(hosts,
                absl::StrCat(ShellQuote(trainrun), " --version && { ", ShellQuote(trainrun),
                             " --gpu-probe 2>/dev/null || true; }"),
                deadline,
                [shared, finish, hosts, trainrun, deadline](
                    int i, absl::StatusOr<std::unique_ptr<channel::HostStream>> stream) {
                  if (!stream.ok()) return finish(i, stream.status());
                  // The stream is closed before the result is told: a stream outliving the
                  // channel that made it (destroyed when this call returns) would use freed
                  // memory, as a detached reader once did at trainrun's exit.
                  std::thread reader([finish, i, name = hosts[i].host, trainrun, deadline,
                                      stream = *std::move(stream)]() mutable {
                    absl::StatusOr<std::string> result =
                        ReadVersion(name, trainrun, *stream, deadline);
                    stream.reset();
                    finish(i, std::move(result));
                  });
                  std::lock_guard<std::mutex> lock(shared->mu);
                  if (shared->collected) {
                    reader.detach();
                  } else {
                    shared->readers.push_back(std::move(reader));
                  }
                });
  std::unique_lock<std::mutex> lock(shared->mu);
  // Every attempt ends by the deadline; the margin covers its last read and EndStatus.
  shared->changed.wait_until(lock, absl::ToChronoTime(deadline + absl::Seconds(3)),
                             [&] { return shared->running == 0; });
  // The readers end by then (each read is bounded by the deadline): join them, so none runs on
  // after the channel is gone.
  std::vector<std::thread> readers = std::move(shared->readers);
  shared->readers.clear();
  shared->collected = true;
  lock.unlock();
  for (std::thread& reader : readers) reader.join();
  lock.lock();
  std::vector<absl::StatusOr<std::string>> results;
  for (size_t i = 0; i < hosts.size(); ++i) {
    results.push_back(shared->results[i] ? *shared->results[i]
                                         : absl::DeadlineExceededError(absl::StrCat(
                                               "host ", hosts[i].host,
                                               ": no answer in time; raise --start-timeout")));
  }
  return results;
}

}  // namespace trainrun::launcher::remote
