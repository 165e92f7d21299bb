/*
 * tcpbench: minimal raw-TCP loopback anchors (no library in between).
 *
 *   tcpbench bw -s MSGSIZE -t SECONDS [-n STREAMS] [-p PORT] [-a 127.0.0.1] [-l|-c]
 *       Forks a receiver process (N threads, one per stream) and runs N sender
 *       threads.  Each sender calls send() with MSGSIZE-byte buffers for
 *       SECONDS; each receiver recv()s into an MSGSIZE buffer.  Throughput is
 *       measured on the receiver side (first byte -> last byte, all streams
 *       summed) and printed as one line:
 *         RESULT bw streams=N msgsize=S bytes=B secs=T GBps=X Gbps=Y
 *
 *   tcpbench pp -s MSGSIZE -t SECONDS [-b] [-p PORT] [-a 127.0.0.1] [-l|-c]
 *       Forks an echo server; the client does blocking send/recv ping-pong of
 *       MSGSIZE bytes with TCP_NODELAY on both sides, timing every round trip
 *       with CLOCK_MONOTONIC (after 2000 warm-up round trips).  With -b both
 *       sides busy-poll recv(MSG_DONTWAIT) instead of sleeping in recv()
 *       (what a CQ-polling RDMA consumer does; needs one core per side).
 *       Prints:
 *         RESULT pp msgsize=S busypoll=0|1 samples=K half_rtt_us min=.. median=.. p99=.. mean=..
 *
 * Options for both modes: -B BYTES sets SO_SNDBUF/SO_RCVBUF (default: kernel
 * autotuning), -C NAME sets TCP_CONGESTION (default: the system's, bbr here).
 * All traffic is on the given address (default 127.0.0.1).
 *
 * Two hosts (network namespaces): -l runs only the listening half on -a ADDR
 * (bw: the receiver, which prints the RESULT; pp: the echo server) and exits
 * when its peer is done; -c runs only the connecting half to -a ADDR (bw: the
 * senders; pp: the timing client, which prints the RESULT).  -t and -s must
 * match on both; -n must match for bw.  Without -l/-c both halves run here,
 * the listener in a forked process.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static size_t msgsize = 65536;
static double seconds = 5.0;
static int streams = 1;
static int port = 39111;
static const char *addr = "127.0.0.1";
static int busypoll = 0; /* pp: spin on non-blocking recv instead of sleeping in recv() */
static int sockbuf = 0;   /* -B: SO_SNDBUF/SO_RCVBUF on every socket (0 = kernel autotuning) */
static const char *cc;    /* -C: TCP_CONGESTION on every socket (default: system default) */
static int role;          /* 'l': listening half only, 'c': connecting half only, 0: both */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	perror(what);
	exit(2);
}

static void tune(int fd)
{
	if (sockbuf) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
	}
	if (cc && setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc)))
		die("TCP_CONGESTION");
}

static int listen_on(int p)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(p) };
	if (fd < 0)
		die("socket");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	tune(fd); /* inherited by accepted sockets */
	inet_pton(AF_INET, addr, &sa.sin_addr);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)))
		die("bind");
	if (listen(fd, 64))
		die("listen");
	return fd;
}

static int connect_to(int p)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(p) };
	inet_pton(AF_INET, addr, &sa.sin_addr);
	for (int tries = 0; tries < 500; tries++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			die("socket");
		tune(fd);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		close(fd);
		usleep(10000);
	}
	die("connect");
	return -1;
}

static void nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int full_send(int fd, const char *b, size_t n)
{
	while (n) {
		ssize_t r = send(fd, b, n, MSG_NOSIGNAL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static int full_recv(int fd, char *b, size_t n)
{
	while (n) {
		ssize_t r = recv(fd, b, n, busypoll ? MSG_DONTWAIT : 0);
		if (r <= 0) {
			if (r < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			return -1;
		}
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

/* ---------------- bandwidth ---------------- */
struct rx_arg {
	int fd;
	uint64_t bytes;
	double t0, t1;
};

static void *rx_thread(void *p)
{
	struct rx_arg *a = p;
	char *buf = aligned_alloc(4096, (msgsize + 4095) / 4096 * 4096);
	memset(buf, 0, msgsize);
	a->t0 = 0;
	for (;;) {
		ssize_t r = recv(a->fd, buf, msgsize, 0);
		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			break;
		}
		if (!a->t0)
			a->t0 = now();
		a->bytes += (uint64_t)r;
		a->t1 = now();
	}
	free(buf);
	return NULL;
}

static void *tx_thread(void *p)
{
	int fd = *(int *)p;
	char *buf = aligned_alloc(4096, (msgsize + 4095) / 4096 * 4096);
	memset(buf, 0xa5, msgsize);
	double end = now() + seconds;
	while (now() < end)
		if (full_send(fd, buf, msgsize))
			die("send");
	shutdown(fd, SHUT_WR);
	free(buf);
	return NULL;
}

/* The receiving half: accepts the streams, prints the RESULT line. */
static int bw_receiver(int lfd)
{
	struct rx_arg a[64];
	pthread_t th[64];
	memset(a, 0, sizeof(a));
	for (int i = 0; i < streams; i++) {
		a[i].fd = accept(lfd, NULL, NULL);
		if (a[i].fd < 0)
			die("accept");
	}
	for (int i = 0; i < streams; i++)
		pthread_create(&th[i], NULL, rx_thread, &a[i]);
	uint64_t bytes = 0;
	double t0 = 1e300, t1 = 0;
	for (int i = 0; i < streams; i++) {
		pthread_join(th[i], NULL);
		bytes += a[i].bytes;
		if (a[i].t0 < t0)
			t0 = a[i].t0;
		if (a[i].t1 > t1)
			t1 = a[i].t1;
	}
	double secs = t1 - t0;
	if (!bytes || secs <= 0) {
		fprintf(stderr, "tcpbench: received nothing\n");
		return 2;
	}
	printf("RESULT bw streams=%d msgsize=%zu bytes=%llu secs=%.3f GBps=%.3f Gbps=%.2f\n",
	       streams, msgsize, (unsigned long long)bytes, secs,
	       bytes / secs / 1e9, bytes * 8 / secs / 1e9);
	fflush(stdout);
	return 0;
}

/* The sending half: connects the streams and sends for the duration. */
static void bw_sender(void)
{
	int fds[64];
	pthread_t th[64];
	for (int i = 0; i < streams; i++)
		fds[i] = connect_to(port);
	for (int i = 0; i < streams; i++)
		pthread_create(&th[i], NULL, tx_thread, &fds[i]);
	for (int i = 0; i < streams; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < streams; i++)
		close(fds[i]);
}

static int run_bw(void)
{
	if (role == 'c') {
		bw_sender();
		return 0;
	}
	int lfd = listen_on(port);
	if (role == 'l')
		return bw_receiver(lfd);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) /* receiver */
		_exit(bw_receiver(lfd));
	close(lfd);
	bw_sender();
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 3;
}

/* ---------------- ping-pong ---------------- */
static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The echo server: answers every message until the client closes. */
static void pp_echo(int lfd, char *buf)
{
	int fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		die("accept");
	nodelay(fd);
	while (full_recv(fd, buf, msgsize) == 0)
		if (full_send(fd, buf, msgsize))
			break;
	close(fd);
}

/* The timing client: ping-pong for the duration, then the RESULT line. */
static int pp_client(char *buf)
{
	int fd = connect_to(port);
	nodelay(fd);
	for (int i = 0; i < 2000; i++)
		if (full_send(fd, buf, msgsize) || full_recv(fd, buf, msgsize))
			die("warmup");
	size_t cap = 4000000, n = 0;
	double *s = malloc(cap * sizeof(double));
	double end = now() + seconds;
	for (;;) {
		double t0 = now();
		if (full_send(fd, buf, msgsize) || full_recv(fd, buf, msgsize))
			die("pingpong");
		double t1 = now();
		s[n++] = (t1 - t0) / 2 * 1e6;
		if (t1 >= end || n == cap)
			break;
	}
	close(fd);
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += s[i];
	qsort(s, n, sizeof(double), cmp_d);
	printf("RESULT pp msgsize=%zu busypoll=%d samples=%zu half_rtt_us min=%.2f median=%.2f p99=%.2f mean=%.2f\n",
	       msgsize, busypoll, n, s[0], s[n / 2], s[(size_t)(n * 0.99)], sum / n);
	fflush(stdout);
	free(s);
	return 0;
}

static int run_pp(void)
{
	char *buf = aligned_alloc(4096, (msgsize + 4095) / 4096 * 4096);
	memset(buf, 0x5a, msgsize);
	if (role == 'c')
		return pp_client(buf);
	int lfd = listen_on(port);
	if (role == 'l') {
		pp_echo(lfd, buf);
		return 0;
	}
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) { /* echo server */
		pp_echo(lfd, buf);
		_exit(0);
	}
	close(lfd);
	int r = pp_client(buf);
	int st;
	waitpid(pid, &st, 0);
	free(buf);
	return r;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s bw|pp [-s size] [-t secs] [-n streams] [-b] [-B sockbuf] [-C cc] [-p port] [-a addr] [-l|-c]\n", argv[0]);
		return 1;
	}
	const char *mode = argv[1];
	int c;
	optind = 2;
	while ((c = getopt(argc, argv, "s:t:n:p:a:bB:C:lc")) != -1) {
		switch (c) {
		case 'B': sockbuf = atoi(optarg); break;
		case 'C': cc = optarg; break;
		case 'b': busypoll = 1; break;
		case 's': msgsize = strtoull(optarg, NULL, 0); break;
		case 't': seconds = atof(optarg); break;
		case 'n': streams = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		case 'a': addr = optarg; break;
		case 'l': role = 'l'; break;
		case 'c': role = 'c'; break;
		default: return 1;
		}
	}
	if (streams < 1 || streams > 64 || msgsize < 1)
		return 1;
	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(mode, "bw"))
		return run_bw();
	if (!strcmp(mode, "pp"))
		return run_pp();
	fprintf(stderr, "unknown mode %s\n", mode);
	return 1;
}
