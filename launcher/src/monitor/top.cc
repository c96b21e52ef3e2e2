// `trainrun top [ADDR:]PORT`: the --monitor page's terminal view (/top.txt), redrawn in place once
// a second (cursor home, each line cleared to its end, the rest of the screen cleared).
#include <sys/ioctl.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "monitor/monitor_server.h"
#include "trainrun/launcher/monitor.h"
#include "trainrun/rendezvous/environment.h"

namespace trainrun::launcher {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct Fetched {
  bool reached = false;
  int status = 0;
  std::string body;
  std::string error;
};

Fetched Fetch(const monitor::MonitorAddress& address, const std::string& target,
              const std::string& token) {
  Fetched out;
  try {
    asio::io_context io;
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(5));
    stream.connect(tcp::endpoint(asio::ip::make_address(address.host),
                                 static_cast<unsigned short>(address.port)));
    out.reached = true;
    http::request<http::empty_body> req(http::verb::get, target, 11);
    req.set(http::field::host, address.host);
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(4 << 20);
    http::read(stream, buffer, parser);
    out.status = static_cast<int>(parser.get().result_int());
    out.body = parser.get().body();
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

int Columns() {
  winsize size{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 120;
}

}  // namespace

bool IsTopCommand(const std::vector<std::string>& args) {
  if (args.size() < 2 || args[0] != "top") return false;
  return monitor::ParseMonitorAddress(args[1]).ok();
}

int RunTop(const std::vector<std::string>& args) {
  absl::StatusOr<monitor::MonitorAddress> address = monitor::ParseMonitorAddress(args[1]);
  bool once = false;
  std::string token = env::kMonitorToken.Get();
  for (size_t i = 2; i < args.size(); ++i) {
    if (args[i] == "--once") {
      once = true;
    } else if (args[i] == "--token" && i + 1 < args.size()) {
      token = args[++i];
    } else {
      std::fprintf(stderr,
                   "trainrun top: error: '%s' is not an option of trainrun top; it takes "
                   "[ADDR:]PORT, --once and --token TOKEN\n",
                   args[i].c_str());
      return 2;
    }
  }
  const std::string where = absl::StrCat(address->host, ":", address->port);
  const bool terminal = ::isatty(STDOUT_FILENO) != 0;
  for (int shown = 0;; ++shown) {
    Fetched got = Fetch(*address, absl::StrCat("/top.txt?width=", Columns()), token);
    if (!got.reached || !got.error.empty()) {
      if (shown == 0) {
        std::fprintf(stderr,
                     "trainrun top: error: no trainrun --monitor answers at %s (%s); start the "
                     "job with --monitor %d, or give its address\n",
                     where.c_str(), got.error.c_str(), address->port);
        return 1;
      }
      std::printf("\ntrainrun at %s is gone: the job has ended\n", where.c_str());
      return 0;
    }
    if (got.status != 200) {
      std::fprintf(stderr, "trainrun top: error: %s answered %d: %s", where.c_str(), got.status,
                   got.body.c_str());
      return 1;
    }
    if (terminal && !once) {
      // Home, each line cleared to its end, then the rest of the screen: no flicker.
      std::string frame = absl::StrReplaceAll(got.body, {{"\n", "\033[K\n"}});
      std::printf("\033[H%s\033[J", frame.c_str());
    } else {
      std::printf("%s", got.body.c_str());
    }
    std::fflush(stdout);
    if (once) return 0;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace trainrun::launcher
