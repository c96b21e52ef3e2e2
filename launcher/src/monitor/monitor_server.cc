#include "monitor/monitor_server.h"

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/version.hpp>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "monitor/page.h"

namespace trainrun::launcher::monitor {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr auto kIdleLimit = std::chrono::seconds(10);
constexpr size_t kRequestLimit = 16 * 1024;
constexpr uint64_t kTraceLimit = 512ull << 20;

bool SameToken(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// QueryValue returns `name`'s value in the target's query ("" when absent).
std::string QueryValue(absl::string_view target, absl::string_view name) {
  const size_t q = target.find('?');
  if (q == absl::string_view::npos) return "";
  for (absl::string_view pair : absl::StrSplit(target.substr(q + 1), '&')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (kv.first == name) return std::string(kv.second);
  }
  return "";
}

std::string CookieValue(absl::string_view cookies, absl::string_view name) {
  for (absl::string_view c : absl::StrSplit(cookies, ';')) {
    c = absl::StripAsciiWhitespace(c);
    if (absl::ConsumePrefix(&c, name) && absl::ConsumePrefix(&c, "=")) return std::string(c);
  }
  return "";
}

}  // namespace

class MonitorServer::Impl {
 public:
  Impl(std::string token, bool need_token, std::string trace_path, const JobView& view)
      : token_(std::move(token)),
        need_token_(need_token),
        trace_path_(std::move(trace_path)),
        view_(view),
        acceptor_(io_),
        retry_(io_) {}

  ~Impl() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Listen(const MonitorAddress& address) {
    boost::system::error_code ec;
    const asio::ip::address ip = asio::ip::make_address(address.host, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--monitor ", address.host, ":", address.port, ": '", address.host,
                       "' is not an IP address of this host; give one (or none, for 127.0.0.1)"));
    }
    const tcp::endpoint endpoint(ip, static_cast<unsigned short>(address.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("--monitor ", address.host, ":", address.port,
                                                 ": cannot listen there (", ec.message(), ")"));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  int port() const { return port_; }
  bool watched(int seconds) const {
    const int64_t last = last_state_.load();
    return last != 0 && Now() - last <= seconds * 1000;
  }

  // Answer is the response to one request.
  http::response<http::string_body> Answer(const http::request<http::string_body>& req) {
    http::response<http::string_body> res;
    res.version(req.version());
    res.keep_alive(req.keep_alive());
    res.set(http::field::server, "trainrun");
    res.set(http::field::cache_control, "no-store");
    res.set("X-Content-Type-Options", "nosniff");
    auto text = [&](http::status status, std::string body) {
      res.result(status);
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = std::move(body) + "\n";
      return res;
    };
    const absl::string_view target(req.target().data(), req.target().size());
    const absl::string_view path = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res.set(http::field::allow, "GET, HEAD");
      return text(http::status::method_not_allowed,
                  "trainrun's monitor answers GET only; this request was " +
                      std::string(req.method_string()));
    }
    const std::string query_token = QueryValue(target, "token");
    if (need_token_) {
      std::string given = query_token;
      if (given.empty()) {
        absl::string_view auth(req[http::field::authorization].data(),
                               req[http::field::authorization].size());
        if (absl::ConsumePrefix(&auth, "Bearer ")) given = std::string(auth);
      }
      if (given.empty()) {
        given = CookieValue(
            absl::string_view(req[http::field::cookie].data(), req[http::field::cookie].size()),
            "trainrun_token");
      }
      if (!SameToken(given, token_)) {
        return text(http::status::unauthorized,
                    given.empty() ? "this monitor needs the token trainrun printed with its "
                                    "address: add ?token=... to the address"
                                  : "this monitor's token is not the one given; use the address "
                                    "trainrun printed");
      }
      if (!query_token.empty()) {
        res.set(http::field::set_cookie,
                "trainrun_token=" + token_ + "; Path=/; HttpOnly; SameSite=Strict");
      }
    }
    if (path == "/" || path == "/index.html") {
      res.set(http::field::content_type, "text/html; charset=utf-8");
      // The page may run only its own script and talk only to this server.
      res.set("Content-Security-Policy",
              "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
              "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'");
      res.result(http::status::ok);
      res.body() = kPage;
      return res;
    }
    if (path == "/api/state") {
      last_state_.store(Now());
      res.result(http::status::ok);
      res.set(http::field::content_type, "application/json");
      res.body() = view_.Json();
      return res;
    }
    if (path == "/metrics") {
      res.result(http::status::ok);
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = view_.Metrics();
      return res;
    }
    if (path == "/top.txt") {
      int width = 120;
      if (!absl::SimpleAtoi(QueryValue(target, "width"), &width)) width = 120;
      res.result(http::status::ok);
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = view_.Text(width);
      return res;
    }
    if (path == "/trace.json") {
      if (trace_path_.empty()) {
        return text(http::status::not_found,
                    "no trace is being written: start trainrun with --timeline-filename FILE");
      }
      std::ifstream in(trace_path_, std::ios::binary);
      if (!in) {
        return text(http::status::not_found,
                    "the trace " + trace_path_ +
                        " is not on this host (rank 0 writes it where it runs) or not begun yet");
      }
      std::ostringstream body;
      body << in.rdbuf();
      if (body.tellp() > static_cast<std::streamoff>(kTraceLimit)) {
        return text(http::status::payload_too_large,
                    "the trace is over 512 MiB; open " + trace_path_ + " itself");
      }
      res.result(http::status::ok);
      res.set(http::field::content_type, "application/json");
      res.set(http::field::content_disposition, "attachment; filename=\"trainrun-trace.json\"");
      res.body() = body.str();
      return res;
    }
    return text(http::status::not_found,
                "trainrun's monitor has /, /api/state, /metrics, /top.txt and /trace.json; not " +
                    std::string(path.substr(0, 200)));
  }

  std::atomic<int> connections{0};

 private:
  static int64_t Now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void Accept();

  const std::string token_;
  const bool need_token_;
  const std::string trace_path_;
  const JobView& view_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int64_t> last_state_{0};
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, MonitorServer::Impl& server)
      : stream_(std::move(socket)), server_(server) {
    ++server_.connections;
  }
  ~Session() { --server_.connections; }

  void Read() {
    parser_.emplace();
    parser_->header_limit(kRequestLimit);
    parser_->body_limit(kRequestLimit);
    stream_.expires_after(kIdleLimit);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        ec == asio::error::eof) {
      Close();
      return;
    }
    if (ec) {  // not HTTP, or over the limits: say so once, then close
      response_ = {};
      response_.version(11);
      response_.result(ec == http::error::header_limit || ec == http::error::body_limit
                           ? http::status::payload_too_large
                           : http::status::bad_request);
      response_.set(http::field::content_type, "text/plain; charset=utf-8");
      response_.set(http::field::connection, "close");
      response_.body() = "trainrun's monitor could not read this request (" + ec.message() + ")\n";
      response_.keep_alive(false);
      Write();
      return;
    }
    response_ = server_.Answer(parser_->get());
    if (parser_->get().method() == http::verb::head) {
      response_.prepare_payload();
      response_.body().clear();
    }
    Write();
  }

  void Write() {
    response_.prepare_payload();
    stream_.expires_after(kIdleLimit);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec || !self->response_.keep_alive()) {
                          self->Close();
                          return;
                        }
                        self->Read();
                      });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
  MonitorServer::Impl& server_;
};

}  // namespace

void MonitorServer::Impl::Accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {  // out of descriptors, most likely: look again in a moment
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](beast::error_code e) {
        if (!e) Accept();
      });
      return;
    }
    if (connections.load() >= kMaxConnections) {
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      std::make_shared<Session>(std::move(socket), *this)->Read();
    }
    Accept();
  });
}

absl::StatusOr<MonitorAddress> ParseMonitorAddress(const std::string& text) {
  MonitorAddress address;
  absl::string_view port = text;
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    std::string host = text.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    address.host = host;
    port = absl::string_view(text).substr(colon + 1);
  }
  if (!absl::SimpleAtoi(port, &address.port) || address.port < 0 || address.port > 65535 ||
      address.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--monitor '", text, "' is not [ADDR:]PORT; give a port (0-65535), e.g. --monitor 8080"));
  }
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(address.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("--monitor '", text, "': '", address.host,
                                                   "' is not an IP address; give one, e.g. "
                                                   "--monitor 0.0.0.0:8080, or only a port"));
  }
  address.loopback = ip.is_loopback();
  return address;
}

MonitorServer::MonitorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MonitorServer::~MonitorServer() = default;

absl::StatusOr<std::unique_ptr<MonitorServer>> MonitorServer::Start(const MonitorAddress& address,
                                                                    std::string token,
                                                                    std::string trace_path,
                                                                    const JobView& view) {
  auto impl = std::make_unique<Impl>(token, !address.loopback, std::move(trace_path), view);
  if (absl::Status listening = impl->Listen(address); !listening.ok()) return listening;
  auto server = std::unique_ptr<MonitorServer>(new MonitorServer(std::move(impl)));
  server->host_ = address.host;
  server->token_ = address.loopback ? "" : std::move(token);
  return server;
}

std::string MonitorServer::url() const {
  const std::string host = host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_;
  return absl::StrCat("http://", host, ":", impl_->port(), "/",
                      token_.empty() ? "" : absl::StrCat("?token=", token_));
}

int MonitorServer::port() const { return impl_->port(); }
bool MonitorServer::watched(int seconds) const { return impl_->watched(seconds); }

}  // namespace trainrun::launcher::monitor
