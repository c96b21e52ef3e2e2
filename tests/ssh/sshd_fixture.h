// Test fixtures for SSH: a real sshd (Debian's openssh-server) on a free loopback port, and a small
// cluster of network namespaces, each running its own sshd.
//
// Everything lives in a temporary directory the fixture creates: host keys, user keys, sshd_config,
// authorized_keys, the client's SSH directory (config, known_hosts). The machine's own sshd
// configuration and ~/.ssh are never read or written.
//
//   SshWorld world;                              // keys + client SSH dir + sshd on
//   127.0.0.1:<port> auto options = world.ClientOptions();        // SshOptions pointing at the
//   world's SSH dir auto target = ResolveSshTarget("root", "127.0.0.1", options);
//
//   NetnsCluster cluster(2);                     // namespaces: one client, two hosts
//   on 10.213.1.0/24 { ScopedNetns in(cluster.client_ns()); ... } // this thread's sockets now live
//   in the client ns cluster.RunInClient({"trainrun", ...});      // or run a program there
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ssh/ssh_config.h"

namespace trainrun::testing {

// TempDir makes a fresh directory under /tmp and removes it with everything inside.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// RunCommand runs argv to completion (at most `timeout_s`), returns its exit status (-1 when it
// could not run or was killed), and puts its stdout and stderr in *output when given.
int RunCommand(const std::vector<std::string>& argv, std::string* output = nullptr,
               int timeout_s = 60);

// ReadFileText returns a file's contents ("" when unreadable).
std::string ReadFileText(const std::string& path);

// WaitUntil polls `done` every 100 ms until it holds (true) or `timeout` has passed (false): for
// what the system does a moment after a job ends (processes gone from a host or a node).
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout);

// FreeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment ago.
int FreeLoopbackPort();

// Sshd is one sshd in the foreground (-D), in the current network namespace or in `netns`. The
// destructor kills it and every session process it started.
class Sshd {
 public:
  struct Options {
    std::string dir;              // where sshd_config, the pid file and the log go
    std::string host_key;         // private host key file
    std::string authorized_keys;  // AuthorizedKeysFile
    std::string listen_address = "127.0.0.1";
    int port = 0;       // 0: a free loopback port
    std::string netns;  // "" : the current namespace
    // Not "": sshd (and so every session) runs in a mount namespace of its own where this directory
    // is a fresh tmpfs: a host's files there are its own, as on a machine without a shared disk.
    std::string private_dir;
  };
  explicit Sshd(Options options);  // throws std::runtime_error when sshd does not come up in 10 s
  ~Sshd();
  Sshd(const Sshd&) = delete;
  Sshd& operator=(const Sshd&) = delete;

  int port() const { return options_.port; }
  pid_t pid() const { return pid_; }
  std::string Log() const;

 private:
  Options options_;
  pid_t pid_ = -1;
  std::string log_file_;
};

// SshWorld is a temporary directory with keys and a client SSH directory, and one sshd on loopback
// that accepts the `user_ed25519` and `user_rsa` keys for root (the user tests run as).
class SshWorld {
 public:
  SshWorld();
  const std::string& dir() const { return dir_.path(); }
  // The client's SSH directory: config, known_hosts (initially empty), no default keys.
  const std::string& ssh_dir() const { return ssh_dir_; }
  const std::string& user_ed25519() const { return user_ed25519_; }  // authorized
  const std::string& user_rsa() const { return user_rsa_; }          // authorized, but RSA
  const std::string& stranger() const { return stranger_; }          // not authorized
  const std::string& host_key() const { return host_key_; }
  Sshd& sshd() { return *sshd_; }
  // SshOptions with ssh_dir set, short timeouts, and no identity file.
  launcher::ssh::SshOptions ClientOptions() const;

 private:
  TempDir dir_;
  std::string ssh_dir_, user_ed25519_, user_rsa_, stranger_, host_key_, authorized_keys_;
  std::unique_ptr<Sshd> sshd_;
};

// MakeKey generates an unencrypted key of `type` ("ed25519", "rsa", "ecdsa") at `path`.
void MakeKey(const std::string& type, const std::string& path);

// NetnsCluster makes one client namespace holding a bridge at 10.213.1.1/24 and `hosts` host
// namespaces at 10.213.1.11, .12, ... joined to it by veth pairs; each host runs an sshd on port 22
// that accepts `authorized_keys`. Nothing is configured outside these namespaces. The destructor
// kills every process in them and deletes them.
class NetnsCluster {
 public:
  // `private_dir` not "": each host has its own empty tmpfs there (Sshd::Options::private_dir).
  NetnsCluster(int hosts, const std::string& dir, const std::string& authorized_keys,
               const std::string& private_dir = "");
  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  const std::string& client_ns() const { return client_ns_; }
  const std::string& host_ns(int i) const { return host_ns_[i]; }
  std::string host_address(int i) const;
  // Pids of the processes in host i's namespace, its sshd listener excepted.
  std::vector<pid_t> HostProcesses(int i) const;
  // Whether every host's HostProcesses is empty within `timeout` (an ending job takes a moment).
  bool HostsEmptyWithin(std::chrono::seconds timeout = std::chrono::seconds(5)) const;
  // Whether every host runs nothing but sshd within `timeout`: no agent, no rank. (An sshd session
  // whose client vanished from the network lingers until TCP gives up; it is sshd's.)
  bool OnlySshdLeftWithin(std::chrono::seconds timeout) const;
  // RunOnHost runs argv in host i's network and mount namespaces (what its sessions see), as
  // RunCommand does.
  int RunOnHost(int i, const std::vector<std::string>& argv, std::string* output = nullptr) const;
  // " pid:command line" for each of HostProcesses, every host: what a failed check left behind.
  std::string ProcessList() const;

 private:
  std::vector<std::string> all_ns_;
  std::string client_ns_;
  std::vector<std::string> host_ns_;
  std::vector<std::unique_ptr<Sshd>> sshds_;
};

// ScopedNetns moves the calling thread into a named network namespace, and back when destroyed.
// Sockets made meanwhile stay in that namespace.
class ScopedNetns {
 public:
  explicit ScopedNetns(const std::string& name);
  ~ScopedNetns();
  ScopedNetns(const ScopedNetns&) = delete;
  ScopedNetns& operator=(const ScopedNetns&) = delete;

 private:
  int original_ = -1;
};

// CanUseNetns says whether this process may make network namespaces (root, with iproute2).
bool CanUseNetns();

// InClient is the argv that runs `command` in `cluster`'s client namespace with the world's home
// (its SSH directory as ~/.ssh): `ip netns exec CLIENT env HOME=... command...`.
std::vector<std::string> InClient(const SshWorld& world, const NetnsCluster& cluster,
                                  const std::vector<std::string>& command);

// TrainrunInClient is InClient of `trainrun -i <the world's ed25519 key> --start-timeout
// START_TIMEOUT`, then `args`; `trainrun` is the binary's path.
std::vector<std::string> TrainrunInClient(const SshWorld& world, const NetnsCluster& cluster,
                                          const std::string& trainrun,
                                          const std::vector<std::string>& args,
                                          const std::string& start_timeout = "20");

}  // namespace trainrun::testing
