/* Added latency for network-namespace hosts on a kernel without tc's netem: every packet sent to
   netfilter queue QUEUE (an iptables NFQUEUE rule in the router namespace, which forwards every
   packet between hosts) is held DELAY_US microseconds after it arrived, then accepted. All packets
   get the same delay, so they leave in arrival order: one batch verdict ("accept every packet up
   to id N") releases all that are due. Packets are queued as metadata only (the payload stays in
   the kernel), and GSO packets are queued whole (NFQA_CFG_F_GSO), so a 64 KiB TCP segment is one
   entry; if the queue overflows the kernel accepts the packet undelayed (NFQA_CFG_F_FAIL_OPEN)
   rather than dropping it.

     nfq_delay QUEUE DELAY_US

   Runs until SIGTERM or SIGINT (then unbinds the queue, so the rule's packets are not left
   waiting) and prints, when it ends, how many packets it delayed and how late past DELAY_US the
   median and 99th-percentile packet left. The wait for the next due packet is a timed poll() with
   the timer slack at 1 ns; the last 30 µs are spun, so the delay is DELAY_US within a few µs
   rather than DELAY_US plus a scheduler tick. Plain netlink, no libnetfilter_queue. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int fd;
static uint16_t queue_num;
static uint32_t seq;

/* Appends attribute TYPE with LEN bytes of DATA to the message at BUF (whose nlmsg_len grows). */
static void put_attr(struct nlmsghdr* nlh, uint16_t type, const void* data, uint16_t len) {
  struct nlattr* a = (struct nlattr*)((char*)nlh + NLMSG_ALIGN(nlh->nlmsg_len));
  a->nla_type = type;
  a->nla_len = NLA_HDRLEN + len;
  memcpy((char*)a + NLA_HDRLEN, data, len);
  nlh->nlmsg_len = NLMSG_ALIGN(nlh->nlmsg_len) + NLA_ALIGN(a->nla_len);
}

static struct nlmsghdr* start_msg(char* buf, uint16_t type, uint16_t flags) {
  memset(buf, 0, 256);
  struct nlmsghdr* nlh = (struct nlmsghdr*)buf;
  nlh->nlmsg_len = NLMSG_LENGTH(sizeof(struct nfgenmsg));
  nlh->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | type;
  nlh->nlmsg_flags = NLM_F_REQUEST | flags;
  nlh->nlmsg_seq = ++seq;
  struct nfgenmsg* g = NLMSG_DATA(nlh);
  g->nfgen_family = AF_UNSPEC;
  g->version = NFNETLINK_V0;
  g->res_id = htons(queue_num);
  return nlh;
}

static void send_msg(struct nlmsghdr* nlh, const char* what) {
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  if (sendto(fd, nlh, nlh->nlmsg_len, 0, (struct sockaddr*)&kernel, sizeof kernel) < 0) {
    fprintf(stderr, "nfq_delay: %s: %s\n", what, strerror(errno));
    exit(1);
  }
}

/* Sends a config message and reads the kernel's acknowledgement, exiting with its error. */
static void configure(struct nlmsghdr* nlh, const char* what) {
  nlh->nlmsg_flags |= NLM_F_ACK;
  send_msg(nlh, what);
  char buf[8192];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0) {
      fprintf(stderr, "nfq_delay: %s: %s\n", what, strerror(errno));
      exit(1);
    }
    for (struct nlmsghdr* h = (struct nlmsghdr*)buf; NLMSG_OK(h, (unsigned)n);
         h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_ERROR && h->nlmsg_seq == nlh->nlmsg_seq) {
        int err = ((struct nlmsgerr*)NLMSG_DATA(h))->error;
        if (err != 0) {
          fprintf(stderr, "nfq_delay: %s: %s\n", what, strerror(-err));
          exit(1);
        }
        return;
      }
    }
  }
}

static void verdict_upto(uint32_t id) {
  char buf[256];
  struct nlmsghdr* nlh = start_msg(buf, NFQNL_MSG_VERDICT_BATCH, 0);
  struct nfqnl_msg_verdict_hdr v = {.verdict = htonl(NF_ACCEPT), .id = htonl(id)};
  put_attr(nlh, NFQA_VERDICT_HDR, &v, sizeof v);
  send_msg(nlh, "accepting packets");
}

static int cmp_i64(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return (x > y) - (x < y);
}

#define RING (1u << 20)
static uint32_t ids[RING];
static int64_t due[RING];
#define LATE_SAMPLES 100000
static int64_t late[LATE_SAMPLES];

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: nfq_delay QUEUE DELAY_US\n");
    return 2;
  }
  queue_num = (uint16_t)atoi(argv[1]);
  const int64_t delay = (int64_t)atoll(argv[2]) * 1000;
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);

  fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
  if (fd < 0) {
    fprintf(stderr, "nfq_delay: netlink socket: %s\n", strerror(errno));
    return 1;
  }
  int rcvbuf = 64 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
  struct sockaddr_nl local = {.nl_family = AF_NETLINK};
  if (bind(fd, (struct sockaddr*)&local, sizeof local) < 0) {
    fprintf(stderr, "nfq_delay: bind: %s\n", strerror(errno));
    return 1;
  }
  char buf[256];
  struct nlmsghdr* nlh = start_msg(buf, NFQNL_MSG_CONFIG, 0);
  struct nfqnl_msg_config_cmd cmd = {.command = NFQNL_CFG_CMD_BIND, .pf = htons(AF_INET)};
  put_attr(nlh, NFQA_CFG_CMD, &cmd, sizeof cmd);
  configure(nlh, "binding the queue (is another nfq_delay bound to it?)");
  nlh = start_msg(buf, NFQNL_MSG_CONFIG, 0);
  struct nfqnl_msg_config_params params = {.copy_range = 0, .copy_mode = NFQNL_COPY_META};
  put_attr(nlh, NFQA_CFG_PARAMS, &params, sizeof params);
  uint32_t maxlen = htonl(RING / 2);
  put_attr(nlh, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
  uint32_t flags = htonl(NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN);
  put_attr(nlh, NFQA_CFG_FLAGS, &flags, sizeof flags);
  put_attr(nlh, NFQA_CFG_MASK, &flags, sizeof flags);
  configure(nlh, "configuring the queue");
  fprintf(stderr, "nfq_delay: queue %u, %lld us\n", queue_num, (long long)(delay / 1000));

  uint32_t head = 0, tail = 0; /* ring of packets held: [head, tail) */
  uint64_t packets = 0;
  static char rbuf[1 << 16];
  while (!stop) {
    int64_t t = now_ns();
    if (head != tail && due[head % RING] <= t) {
      uint32_t last = head;
      while (last + 1 != tail && due[(last + 1) % RING] <= t) ++last;
      for (uint32_t i = head; i <= last; ++i) {
        if (packets < LATE_SAMPLES) late[packets] = t - due[i % RING];
        ++packets;
      }
      verdict_upto(ids[last % RING]);
      head = last + 1;
      continue;
    }
    /* Nothing held: block until a packet comes. Else poll until 30 us before the next is due,
       and spin (recv without waiting) the rest. */
    const int64_t spin = 30000;
    const int64_t left = head != tail ? due[head % RING] - t : -1;
    if (head == tail || left > spin) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      struct timespec ts = {(left - spin) / 1000000000, (left - spin) % 1000000000};
      if (ppoll(&p, 1, head != tail ? &ts : NULL, NULL) < 0 && errno != EINTR) {
        fprintf(stderr, "nfq_delay: poll: %s\n", strerror(errno));
        break;
      }
    }
    ssize_t n = recv(fd, rbuf, sizeof rbuf, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      if (errno == ENOBUFS) continue; /* the kernel dropped messages: their packets fail open */
      fprintf(stderr, "nfq_delay: recv: %s\n", strerror(errno));
      break;
    }
    const int64_t arrived = now_ns();
    for (struct nlmsghdr* h = (struct nlmsghdr*)rbuf; NLMSG_OK(h, (unsigned)n);
         h = NLMSG_NEXT(h, n)) {
      if ((h->nlmsg_type & 0xff) != NFQNL_MSG_PACKET) continue;
      int len = h->nlmsg_len - NLMSG_LENGTH(sizeof(struct nfgenmsg));
      struct nlattr* a =
          (struct nlattr*)((char*)NLMSG_DATA(h) + NLMSG_ALIGN(sizeof(struct nfgenmsg)));
      for (; len >= NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= len;
           len -= NLA_ALIGN(a->nla_len), a = (struct nlattr*)((char*)a + NLA_ALIGN(a->nla_len))) {
        if ((a->nla_type & NLA_TYPE_MASK) != NFQA_PACKET_HDR) continue;
        struct nfqnl_msg_packet_hdr* ph = (struct nfqnl_msg_packet_hdr*)((char*)a + NLA_HDRLEN);
        if (tail - head == RING) { /* full: release the oldest now */
          verdict_upto(ids[head % RING]);
          ++head;
        }
        ids[tail % RING] = ntohl(ph->packet_id);
        due[tail % RING] = arrived + delay;
        ++tail;
        break;
      }
    }
  }
  if (head != tail) verdict_upto(ids[(tail - 1) % RING]);
  nlh = start_msg(buf, NFQNL_MSG_CONFIG, 0);
  cmd.command = NFQNL_CFG_CMD_UNBIND;
  put_attr(nlh, NFQA_CFG_CMD, &cmd, sizeof cmd);
  send_msg(nlh, "unbinding the queue");
  uint64_t m = packets < LATE_SAMPLES ? packets : LATE_SAMPLES;
  if (m > 0) {
    qsort(late, m, sizeof late[0], cmp_i64);
    fprintf(stderr,
            "nfq_delay: %llu packets delayed; late past %lld us: median %.1f us, p99 %.1f us\n",
            (unsigned long long)packets, (long long)(delay / 1000), late[m / 2] / 1e3,
            late[m * 99 / 100] / 1e3);
  } else {
    fprintf(stderr, "nfq_delay: no packets\n");
  }
  return 0;
}
