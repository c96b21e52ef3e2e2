#include "attribution.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gpu_usage.h"
#include "log.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::collectives::internal {
namespace {

// A sample about every millisecond of a rank's time: enough to name a straggler within a window
// of seconds, few enough that a sample's extra work (the records compared and read) stays far
// below a percent even at hundreds of thousands of small collectives a second.
constexpr uint64_t kSampleSpacingNs = 1000000;
constexpr uint32_t kMostSampleSpacing = 1u << 16;

uint64_t SteadyNs() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

// The tick rate, measured between the first use and now (two reads of each clock per conversion;
// conversions happen at samples and reports only).
struct TickOrigin {
  uint64_t ticks = Ticks();
  uint64_t ns = SteadyNs();
};
// Taken as the library loads, so that the first conversions (a communicator's first samples)
// already measure the rate over the rendezvous' milliseconds.
const TickOrigin kOrigin;
const TickOrigin& Origin() { return kOrigin; }

uint64_t CpuNs() {
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  auto ns = [](const timeval& t) {
    return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_usec) * 1000u;
  };
  return ns(usage.ru_utime) + ns(usage.ru_stime);
}

uint64_t RssBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// Reporter sends this process's counters to trainrun every env::kMonitorPeriodMs, from its own
// thread, through the first communicator's store; a last report goes out when the last
// communicator goes away. Counters of communicators gone are kept in `retired_`.
class Reporter {
 public:
  static Reporter& Instance() {
    static Reporter reporter;
    return reporter;
  }

  void Add(const std::shared_ptr<AttributionCounters>& counters,
           std::shared_ptr<rendezvous::Store> store, int job_rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.push_back(counters);
    if (store_ == nullptr) {
      store_ = std::move(store);
      key_ = trainrun::internal::MakeMessage(env::kMonitorKeyPrefix, job_rank);
    }
    if (!thread_.joinable()) {
      stop_ = false;
      thread_ = std::thread([this] { Run(); });
    }
  }

  void Remove(const std::shared_ptr<AttributionCounters>& counters) {
    std::unique_lock<std::mutex> lock(mutex_);
    live_.erase(std::remove(live_.begin(), live_.end(), counters), live_.end());
    Fold(*counters, retired_);
    if (!live_.empty()) return;
    stop_ = true;
    wake_.notify_all();
    std::thread thread = std::move(thread_);
    lock.unlock();
    if (thread.joinable()) thread.join();
    lock.lock();
    Send(lock);  // the totals as the communicators end
    store_.reset();
  }

  ~Reporter() {
    std::unique_lock<std::mutex> lock(mutex_);
    stop_ = true;
    wake_.notify_all();
    std::thread thread = std::move(thread_);
    lock.unlock();
    if (thread.joinable()) thread.join();
  }

 private:
  struct Totals {
    uint64_t collectives = 0, bytes = 0, busy_ticks = 0, samples = 0, last_samples = 0,
             last_gap_ns = 0, sampled_ns = 0, sampled_waited_ns = 0;
  };

  static void Fold(const AttributionCounters& c, Totals& t) {
    constexpr auto r = std::memory_order_relaxed;
    t.collectives += c.collectives.load(r);
    t.bytes += c.bytes.load(r);
    t.busy_ticks += c.busy_ticks.load(r);
    t.samples += c.samples.load(r);
    t.last_samples += c.last_samples.load(r);
    t.last_gap_ns += c.last_gap_ns.load(r);
    t.sampled_ns += c.sampled_ns.load(r);
    t.sampled_waited_ns += c.sampled_waited_ns.load(r);
  }

  void Run() {
    const auto period =
        std::chrono::milliseconds(std::max<int64_t>(100, env::kMonitorPeriodMs.Get()));
    std::unique_lock<std::mutex> lock(mutex_);
    // Reports go at moments of the host's monotonic clock that every rank of the host computes
    // alike, so that the host's relay sends them upstream as one batch (relay.h): the first at a
    // multiple of half a period at least half a period away (a straggler is named early in a job),
    // then at multiples of the period, 1 to 1.5 periods apart.
    auto next = AlignUp(std::chrono::steady_clock::now() + period / 2, period / 2);
    while (!wake_.wait_until(lock, next, [this] { return stop_; })) {
      Send(lock);
      next = AlignUp(next + period * 3 / 4, period);
    }
  }

  // AlignUp returns the first multiple of `step` on the steady clock at or after `t`.
  static std::chrono::steady_clock::time_point AlignUp(std::chrono::steady_clock::time_point t,
                                                       std::chrono::nanoseconds step) {
    const auto since = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch());
    const auto steps = (since.count() + step.count() - 1) / step.count();
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(step * steps));
  }

  // Send makes the report under the lock and sends it without it.
  void Send(std::unique_lock<std::mutex>& lock) {
    if (store_ == nullptr) return;
    Totals t = retired_;
    for (const auto& counters : live_) Fold(*counters, t);
    AttributionReport report;
    report.collectives = t.collectives;
    report.bytes = t.bytes;
    report.busy_ns = TicksToNs(t.busy_ticks);
    report.samples = t.samples;
    report.last_samples = t.last_samples;
    report.last_gap_ns = t.last_gap_ns;
    report.sampled_ns = t.sampled_ns;
    report.sampled_waited_ns = t.sampled_waited_ns;
    report.cpu_ns = CpuNs();
    report.rss_bytes = RssBytes();
    if (std::optional<GpuUsage> gpu = gpu_.Read()) {
      report.has_gpu = true;
      report.gpu_percent = gpu->percent;
      report.gpu_memory_bytes = gpu->memory_bytes;
    }
    std::shared_ptr<rendezvous::Store> store = store_;
    const std::string key = key_;
    lock.unlock();
    (void)store->Set(key, FormatReport(report));  // a lost report is made up by the next
    lock.lock();
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  bool stop_ = false;
  std::vector<std::shared_ptr<AttributionCounters>> live_;
  Totals retired_;
  std::shared_ptr<rendezvous::Store> store_;
  std::string key_;
  GpuUsageReader gpu_;
};

bool Reporting() { return env::kMonitorPeriodMs.Get() > 0; }

}  // namespace

uint64_t TicksToNs(uint64_t ticks) {
#if defined(__x86_64__)
  const TickOrigin& origin = Origin();
  const uint64_t now_ticks = Ticks();
  const uint64_t now_ns = SteadyNs();
  if (now_ticks <= origin.ticks || now_ns <= origin.ns) return ticks;
  const double ns_per_tick =
      static_cast<double>(now_ns - origin.ns) / static_cast<double>(now_ticks - origin.ticks);
  return static_cast<uint64_t>(static_cast<double>(ticks) * ns_per_tick);
#else
  return ticks;
#endif
}

std::string FormatReport(const AttributionReport& r) {
  char text[320];
  const int n = std::snprintf(
      text, sizeof(text), "%d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", r.has_gpu ? 2 : 1,
      static_cast<unsigned long long>(r.collectives), static_cast<unsigned long long>(r.bytes),
      static_cast<unsigned long long>(r.busy_ns), static_cast<unsigned long long>(r.samples),
      static_cast<unsigned long long>(r.last_samples),
      static_cast<unsigned long long>(r.last_gap_ns), static_cast<unsigned long long>(r.sampled_ns),
      static_cast<unsigned long long>(r.sampled_waited_ns),
      static_cast<unsigned long long>(r.cpu_ns), static_cast<unsigned long long>(r.rss_bytes));
  if (r.has_gpu && n > 0 && static_cast<size_t>(n) < sizeof(text)) {
    std::snprintf(text + n, sizeof(text) - static_cast<size_t>(n), " %u %llu", r.gpu_percent,
                  static_cast<unsigned long long>(r.gpu_memory_bytes));
  }
  return text;
}

Attribution::Attribution(std::shared_ptr<rendezvous::Store> store, int job_rank)
    : counters_(std::make_shared<AttributionCounters>()),
      fixed_spacing_(static_cast<uint32_t>(env::kStragglerSampleEvery.Get())) {
  (void)Origin();
  if (store != nullptr && Reporting())
    Reporter::Instance().Add(counters_, std::move(store), job_rank);
}

Attribution::~Attribution() {
  if (Reporting()) Reporter::Instance().Remove(counters_);
}

void Attribution::Stamp(CallRecord& record) {
  const uint64_t now = Ticks();
  const uint64_t since = sequence_ - last_sample_;
  if (fixed_spacing_ > 0) {
    proposal_ = fixed_spacing_;
  } else if (last_sample_at_ != 0 && since > 0 && now > last_sample_at_) {
    const uint64_t per_collective = TicksToNs((now - last_sample_at_) / since);
    const uint64_t spacing =
        per_collective == 0 ? kMostSampleSpacing : kSampleSpacingNs / per_collective;
    proposal_ = static_cast<uint32_t>(std::clamp<uint64_t>(spacing, 1, kMostSampleSpacing));
  }
  last_sample_at_ = now;
  record.sample_sequence = sequence_;
  record.sample_wait_ns = TicksToNs(last_ticks_);
  record.sample_spacing = proposal_;
}

void Attribution::Observe(const CallRecord* records, size_t n, int me) {
  last_sample_ = sequence_;
  uint64_t least = ~0ull, most = 0;
  uint32_t spacing = 1;
  int last = -1;
  for (size_t r = 0; r < n; ++r) {
    if (records[r].sample_sequence != sequence_) {
      next_sample_ = sequence_ + 1;  // the ranks count differently (a join): try the next one
      return;
    }
    const uint64_t w = records[r].sample_wait_ns;
    if (w < least) least = w, last = static_cast<int>(r);
    most = std::max(most, w);
    spacing = std::max(spacing, records[r].sample_spacing);
  }
  // The next sample comes after spacing/2 to 3·spacing/2 collectives, by a hash of this one's
  // number (the same on every rank): a fixed stride could keep meeting the same collective of a
  // periodic step, and so the same rank arriving last.
  spacing = std::min(spacing, kMostSampleSpacing);
  uint64_t h = sequence_ * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  next_sample_ = sequence_ + std::max<uint64_t>(1, spacing / 2 + h % spacing);
  const uint64_t mine = records[n < 2 ? 0 : me].sample_wait_ns;
  Bump(counters_->samples, 1);
  Bump(counters_->sampled_ns, mine);
  // Every rank spent as long: nobody waited for anybody. Each rank turns its ticks into ns by the
  // tick rate measured at that moment, so equal ticks can differ by a rounding: a difference under
  // 1/1024 of the longest is that, not a late arrival.
  if (n < 2 || most - least <= most / 1024) return;
  if (last == me) {
    Bump(counters_->last_samples, 1);
    Bump(counters_->last_gap_ns, most - mine);
  }
  Bump(counters_->sampled_waited_ns, mine - least);
}

}  // namespace trainrun::collectives::internal
