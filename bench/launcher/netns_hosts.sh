# Sourced by the launcher benchmarks (many_hosts.sh, sync_vs_rsync.sh): network-namespace hosts,
# each running its own sshd (as tests/ssh/sshd_fixture.h's NetnsCluster makes them), behind a
# bridge in a client namespace, on 10.213.1.0/24 inside them: nothing is configured in this
# machine's own namespace. The caller sets `dir` (a scratch folder), `prefix` (unique namespace
# names) and `client`, and declares `hosts=()`; netns_hosts_cleanup removes every namespace, its
# processes and the folder (trap it on EXIT before netns_hosts_start).
#
#   netns_hosts_start COUNT [MOUNTS]
#
# starts hosts $prefix-h1..hCOUNT at 10.213.1.11.. with sshds on port 22 that accept
# $dir/user_key, and waits until every one listens. MOUNTS, if given, is a shell command each
# sshd's private mount namespace runs first (with `&&`), e.g. a tmpfs as the host's own disk.
# Root's ~/.bashrc is hidden from the SSH sessions: bash sources it for every SSH command
# (Debian's SSH_SOURCE_BASHRC), and this machine's runs `pyenv init`, which cost ~5 s per session
# under load, the same for every launcher and none of theirs.

netns_hosts_cleanup() {
  local ns pid
  for ns in "${hosts[@]}" "$client"; do
    [[ -e /run/netns/$ns ]] || continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$dir"
}

netns_hosts_start() {
  local count=$1 mounts=${2:-} i ns
  [[ -n $mounts ]] && mounts="$mounts && "
  mkdir -p "$dir/home/.ssh" /run/sshd
  : >"$dir/empty_bashrc"
  ssh-keygen -q -t ed25519 -N "" -f "$dir/host_key"
  ssh-keygen -q -t ed25519 -N "" -f "$dir/user_key"
  ip netns add "$client"
  ip -n "$client" link set lo up
  ip -n "$client" link add br0 type bridge
  ip -n "$client" addr add 10.213.1.1/24 dev br0
  ip -n "$client" link set br0 up
  for ((i = 1; i <= count; i++)); do
    ns=$prefix-h$i
    ip netns add "$ns"
    hosts+=("$ns")
    ip -n "$client" link add "vh$i" type veth peer name eth0 netns "$ns"
    ip -n "$client" link set "vh$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "10.213.1.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    printf '%s\n' "Port 22" "ListenAddress 0.0.0.0" "HostKey $dir/host_key" "PidFile $dir/sshd.$i.pid" \
      "AuthorizedKeysFile $dir/user_key.pub" "UsePAM no" "StrictModes no" \
      "PermitRootLogin prohibit-password" "PasswordAuthentication no" "MaxStartups 200" \
      "MaxSessions 200" >"$dir/sshd_config.$i"
    ip netns exec "$ns" unshare -m --propagation private sh -c \
      "${mounts}mount --bind $dir/empty_bashrc \$HOME/.bashrc 2>/dev/null; exec /usr/sbin/sshd -f $dir/sshd_config.$i -E $dir/sshd.$i.log"
  done
  for ((i = 1; i <= count; i++)); do  # every sshd listening before the first round
    local tries
    for tries in $(seq 100); do
      grep -q "Server listening" "$dir/sshd.$i.log" 2>/dev/null && break
      sleep 0.05
    done
  done
}
