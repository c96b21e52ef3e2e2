#include "sshd_fixture.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace trainrun::testing {
namespace {

std::string Join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

void RunOrThrow(const std::vector<std::string>& argv) {
  std::string output;
  if (RunCommand(argv, &output) != 0) {
    throw std::runtime_error("`" + Join(argv) + "` failed: " + output);
  }
}

pid_t ParentOf(pid_t pid) {
  std::string stat = ReadFileText("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  char state;
  pid_t ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

// Every live descendant of `root` (children, grandchildren, ...).
std::vector<pid_t> Descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> all;  // (pid, ppid)
  if (DIR* proc = opendir("/proc")) {
    while (dirent* entry = readdir(proc)) {
      pid_t pid = std::atoi(entry->d_name);
      if (pid > 0) all.emplace_back(pid, ParentOf(pid));
    }
    closedir(proc);
  }
  std::set<pid_t> found = {root};
  bool grew = true;
  while (grew) {
    grew = false;
    for (auto [pid, ppid] : all) {
      if (found.count(ppid) && !found.count(pid)) {
        found.insert(pid);
        grew = true;
      }
    }
  }
  found.erase(root);
  return {found.begin(), found.end()};
}

std::atomic<int> cluster_counter{0};

}  // namespace

TempDir::TempDir() {
  char name[] = "/tmp/trainrun-ssh-test.XXXXXX";
  if (mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = name;
}

TempDir::~TempDir() { RunCommand({"rm", "-rf", path_}); }

std::string ReadFileText(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int RunCommand(const std::vector<std::string>& argv, std::string* output, int timeout_s) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return -1;
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], 1);
    dup2(pipe_fds[1], 2);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  std::string text;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  char buf[4096];
  for (;;) {
    pollfd p{pipe_fds[0], POLLIN, 0};
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                  deadline - std::chrono::steady_clock::now())
                                  .count());
    if (ms <= 0 || poll(&p, 1, ms) <= 0) {
      kill(pid, SIGKILL);
      break;
    }
    ssize_t n = read(pipe_fds[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, n);
  }
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (output != nullptr) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

void MakeKey(const std::string& type, const std::string& path) {
  std::vector<std::string> argv = {
      "ssh-keygen", "-q", "-t", type, "-N", "", "-C", "trainrun-test-" + type, "-f", path};
  if (type == "rsa") argv.insert(argv.begin() + 4, {"-b", "2048"});
  RunOrThrow(argv);
}

Sshd::Sshd(Options options) : options_(std::move(options)) {
  // sshd insists on its privilege-separation directory; Debian's service unit makes it at boot,
  // a container may lack it. Creating an empty /run/sshd changes no configuration.
  mkdir("/run/sshd", 0755);
  if (options_.port == 0) options_.port = FreeLoopbackPort();
  std::string tag = options_.netns.empty() ? "lo" : options_.netns;
  std::string config = options_.dir + "/sshd_config." + tag;
  log_file_ = options_.dir + "/sshd." + tag + ".log";
  WriteFile(config, "Port " + std::to_string(options_.port) + "\n" + "ListenAddress " +
                        options_.listen_address + "\n" + "HostKey " + options_.host_key + "\n" +
                        "PidFile " + options_.dir + "/sshd." + tag + ".pid\n" +
                        "AuthorizedKeysFile " + options_.authorized_keys + "\n" +
                        "UsePAM no\n"
                        "StrictModes no\n"
                        "PermitRootLogin prohibit-password\n"
                        "PasswordAuthentication no\n"
                        "KbdInteractiveAuthentication no\n"
                        "PubkeyAuthentication yes\n"
                        "MaxStartups 100\n"
                        "MaxSessions 100\n"
                        "LogLevel VERBOSE\n");
  std::vector<std::string> argv = {"/usr/sbin/sshd", "-D", "-f", config, "-E", log_file_};
  if (!options_.private_dir.empty()) {
    // The shell execs sshd, so that pid_ stays sshd's.
    argv.insert(argv.begin(),
                {"unshare", "--mount", "--propagation", "private", "sh", "-c",
                 "mkdir -p \"$0\" && mount -t tmpfs trainrun-test \"$0\" && shift && exec \"$@\"",
                 options_.private_dir, "--"});
  }
  if (!options_.netns.empty()) argv.insert(argv.begin(), {"ip", "netns", "exec", options_.netns});
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    // sshd goes with the test even when the test dies (an ASan abort), and holds none of its
    // output pipes open (it logs to -E), so that ctest sees the test end instead of a timeout.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Log().find("Server listening on") != std::string::npos) return;
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("sshd exited at start: " + Log());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error("sshd did not start listening in 10 s: " + Log());
}

Sshd::~Sshd() {
  if (pid_ <= 0) return;
  for (pid_t child : Descendants(pid_)) kill(child, SIGKILL);
  kill(pid_, SIGKILL);
  int status;
  waitpid(pid_, &status, 0);
}

std::string Sshd::Log() const { return ReadFileText(log_file_); }

SshWorld::SshWorld() {
  ssh_dir_ = dir() + "/home/.ssh";
  RunOrThrow({"mkdir", "-p", ssh_dir_, dir() + "/keys"});
  host_key_ = dir() + "/keys/host_ed25519";
  user_ed25519_ = dir() + "/keys/user_ed25519";
  user_rsa_ = dir() + "/keys/user_rsa";
  stranger_ = dir() + "/keys/stranger_ed25519";
  MakeKey("ed25519", host_key_);
  MakeKey("ed25519", user_ed25519_);
  MakeKey("rsa", user_rsa_);
  MakeKey("ed25519", stranger_);
  authorized_keys_ = dir() + "/keys/authorized_keys";
  WriteFile(authorized_keys_,
            ReadFileText(user_ed25519_ + ".pub") + ReadFileText(user_rsa_ + ".pub"));
  WriteFile(ssh_dir_ + "/known_hosts", "");
  Sshd::Options options;
  options.dir = dir();
  options.host_key = host_key_;
  options.authorized_keys = authorized_keys_;
  sshd_ = std::make_unique<Sshd>(options);
}

launcher::ssh::SshOptions SshWorld::ClientOptions() const {
  launcher::ssh::SshOptions options;
  options.ssh_dir = ssh_dir_;
  options.connect_timeout = absl::Seconds(10);
  return options;
}

bool CanUseNetns() {
  if (geteuid() != 0) return false;
  return RunCommand({"ip", "-V"}) == 0;
}

std::vector<std::string> InClient(const SshWorld& world, const NetnsCluster& cluster,
                                  const std::vector<std::string>& command) {
  std::vector<std::string> argv = {
      "ip", "netns", "exec", cluster.client_ns(), "env", "HOME=" + world.dir() + "/home"};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::vector<std::string> TrainrunInClient(const SshWorld& world, const NetnsCluster& cluster,
                                          const std::string& trainrun,
                                          const std::vector<std::string>& args,
                                          const std::string& start_timeout) {
  std::vector<std::string> command = {trainrun, "-i", world.user_ed25519(), "--start-timeout",
                                      start_timeout};
  command.insert(command.end(), args.begin(), args.end());
  return InClient(world, cluster, command);
}

NetnsCluster::NetnsCluster(int hosts, const std::string& dir, const std::string& authorized_keys,
                           const std::string& private_dir) {
  std::string prefix =
      "trt" + std::to_string(getpid()) + "-" + std::to_string(cluster_counter.fetch_add(1));
  client_ns_ = prefix + "-c";
  RunOrThrow({"ip", "netns", "add", client_ns_});
  all_ns_.push_back(client_ns_);
  RunOrThrow({"ip", "-n", client_ns_, "link", "set", "lo", "up"});
  RunOrThrow({"ip", "-n", client_ns_, "link", "add", "br0", "type", "bridge"});
  RunOrThrow({"ip", "-n", client_ns_, "addr", "add", "10.213.1.1/24", "dev", "br0"});
  RunOrThrow({"ip", "-n", client_ns_, "link", "set", "br0", "up"});
  for (int i = 0; i < hosts; ++i) {
    std::string ns = prefix + "-h" + std::to_string(i + 1);
    RunOrThrow({"ip", "netns", "add", ns});
    all_ns_.push_back(ns);
    host_ns_.push_back(ns);
    std::string port = "vh" + std::to_string(i + 1);
    // The veth pair is made inside the client namespace with its peer placed straight into the
    // host's: no interface ever appears in the machine's own namespace.
    RunOrThrow({"ip", "-n", client_ns_, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns});
    RunOrThrow({"ip", "-n", client_ns_, "link", "set", port, "master", "br0", "up"});
    RunOrThrow({"ip", "-n", ns, "link", "set", "lo", "up"});
    RunOrThrow({"ip", "-n", ns, "addr", "add", host_address(i) + "/24", "dev", "eth0"});
    RunOrThrow({"ip", "-n", ns, "link", "set", "eth0", "up"});
    std::string host_key = dir + "/host_key." + ns;
    MakeKey("ed25519", host_key);
    Sshd::Options options;
    options.dir = dir;
    options.host_key = host_key;
    options.authorized_keys = authorized_keys;
    options.listen_address = "0.0.0.0";
    options.port = 22;
    options.netns = ns;
    options.private_dir = private_dir;
    sshds_.push_back(std::make_unique<Sshd>(options));
  }
}

std::string NetnsCluster::host_address(int i) const { return "10.213.1." + std::to_string(11 + i); }

int NetnsCluster::RunOnHost(int i, const std::vector<std::string>& argv,
                            std::string* output) const {
  std::vector<std::string> args = {"nsenter", "-t", std::to_string(sshds_[i]->pid()), "-m", "-n"};
  args.insert(args.end(), argv.begin(), argv.end());
  return RunCommand(args, output);
}

std::vector<pid_t> NetnsCluster::HostProcesses(int i) const {
  std::string output;
  RunCommand({"ip", "netns", "pids", host_ns_[i]}, &output);
  std::vector<pid_t> pids;
  std::istringstream in(output);
  pid_t pid;
  while (in >> pid) {
    if (pid != sshds_[i]->pid()) pids.push_back(pid);
  }
  return pids;
}

bool NetnsCluster::HostsEmptyWithin(std::chrono::seconds timeout) const {
  return WaitUntil(
      [&] {
        for (size_t i = 0; i < host_ns_.size(); ++i) {
          if (!HostProcesses(static_cast<int>(i)).empty()) return false;
        }
        return true;
      },
      timeout);
}

bool NetnsCluster::OnlySshdLeftWithin(std::chrono::seconds timeout) const {
  return WaitUntil(
      [&] {
        for (size_t i = 0; i < host_ns_.size(); ++i) {
          for (pid_t pid : HostProcesses(static_cast<int>(i))) {
            std::string cmdline = ReadFileText(absl::StrCat("/proc/", pid, "/cmdline"));
            if (!cmdline.empty() && cmdline.rfind("sshd", 0) != 0) return false;
          }
        }
        return true;
      },
      timeout);
}

std::string NetnsCluster::ProcessList() const {
  std::string list;
  for (size_t i = 0; i < host_ns_.size(); ++i) {
    for (pid_t pid : HostProcesses(static_cast<int>(i))) {
      std::string cmdline = ReadFileText(absl::StrCat("/proc/", pid, "/cmdline"));
      std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
      absl::StrAppend(&list, " ", pid, ":", cmdline);
    }
  }
  return list;
}

NetnsCluster::~NetnsCluster() {
  sshds_.clear();
  for (const std::string& ns : all_ns_) {
    std::string output;
    RunCommand({"ip", "netns", "pids", ns}, &output);
    std::istringstream in(output);
    pid_t pid;
    while (in >> pid) kill(pid, SIGKILL);
  }
  for (const std::string& ns : all_ns_) RunCommand({"ip", "netns", "del", ns});
}

ScopedNetns::ScopedNetns(const std::string& name) {
  original_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  int target = open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (original_ < 0 || target < 0 || setns(target, CLONE_NEWNET) != 0) {
    if (target >= 0) close(target);
    throw std::runtime_error("cannot enter network namespace " + name + ": " + strerror(errno));
  }
  close(target);
}

ScopedNetns::~ScopedNetns() {
  if (original_ >= 0) {
    setns(original_, CLONE_NEWNET);
    close(original_);
  }
}

}  // namespace trainrun::testing
