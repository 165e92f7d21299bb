/*
 * turn.c — LD_PRELOAD shim: a ping-pong's turnaround, timed.
 *
 * The turnaround is what a process does between the recv(2) that brings the peer's message
 * and the send(2) of its answer: for a TCP ping-pong a few instructions, for an RDMA latency
 * test over uiw the provider's receive path, the completion, the application's post and the
 * provider's transmit path. It adds to the half round trip as it is, so it is the part of a
 * latency ratio against TCP that uiw owns.
 *
 * Per thread, a recv/recvfrom that returns 1-255 bytes starts a turnaround and the next
 * send/sendto/sendmsg ends it. At exit the shim prints, on stderr, percentiles (ns) of the
 * turnarounds and of the send calls' and the data-bearing recv calls' own durations.
 *
 * Under callgrind (--collect-atstart=no) it also collects the main thread's turnarounds
 * only, so that callgrind counts the instructions of that path alone, and dumps the counts
 * every 1000 turnarounds (which starts them over): a dump holds 1000 whole turnarounds,
 * where the final counts also hold whatever a last, unanswered message's window collected
 * (perftest sorting its samples). It then prints the number of turnarounds at exit. The
 * windows of perftest's out-of-band exchanges (its TCP socket's small messages) are
 * counted too: the first dump's and the last dump's (run.sh leaves both out).
 *
 *   gcc -O2 -shared -fPIC -o turn.so turn.c -ldl
 *   LD_PRELOAD=./turn.so PROGRAM...   (under `uiw run`, LD_PRELOAD is appended to)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define RUNNING_ON_VALGRIND 0
#define CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_DUMP_STATS
#endif

#define MAX_SAMPLES (1 << 21)

static uint32_t turn[MAX_SAMPLES], sends[MAX_SAMPLES], recvs[MAX_SAMPLES];
static unsigned n_turn, n_send, n_recv;
static __thread uint64_t got_at;
/* Under callgrind: whether this thread's turnaround is being collected (only the main
 * thread's ever are), and how many were. */
static __thread int collecting;
static unsigned long collected;

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void note(uint32_t *v, unsigned *n, uint64_t x)
{
	if (*n < MAX_SAMPLES)
		v[(*n)++] = (uint32_t)(x > UINT32_MAX ? UINT32_MAX : x);
}

/* The thread whose turnarounds are collected: the main thread, or with TURN_ANY_THREAD set
 * whichever thread receives (a passive responder's: uiw's progress thread, which answers an
 * ib_read_lat requester's Read Requests while the server's main thread waits elsewhere). */
static int main_thread_under_callgrind(void)
{
	static int any = -1;

	if (any < 0)
		any = getenv("TURN_ANY_THREAD") != NULL;
	return RUNNING_ON_VALGRIND && (any || gettid() == getpid());
}

static void received(uint64_t start, ssize_t r)
{
	if (r > 0 && r < 256) {
		got_at = now_ns();
		note(recvs, &n_recv, got_at - start);
		if (!collecting && main_thread_under_callgrind()) {
			collecting = 1;
			CALLGRIND_TOGGLE_COLLECT;
		}
	}
}

static uint64_t sending(void)
{
	if (collecting) {
		CALLGRIND_TOGGLE_COLLECT;
		collecting = 0;
		if (++collected % 1000 == 0)
			CALLGRIND_DUMP_STATS;
	}
	uint64_t t = now_ns();

	if (got_at) {
		note(turn, &n_turn, t - got_at);
		got_at = 0;
	}
	return t;
}

#define REAL(name) static __typeof__(name) *real_##name; if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	REAL(recv);
	uint64_t t = now_ns();
	ssize_t r = real_recv(fd, buf, len, flags);
	received(t, r);
	return r;
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *a, socklen_t *al)
{
	REAL(recvfrom);
	uint64_t t = now_ns();
	ssize_t r = real_recvfrom(fd, buf, len, flags, a, al);
	received(t, r);
	return r;
}

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	REAL(send);
	uint64_t t = sending();
	ssize_t r = real_send(fd, buf, len, flags);
	note(sends, &n_send, now_ns() - t);
	return r;
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *a, socklen_t al)
{
	REAL(sendto);
	uint64_t t = sending();
	ssize_t r = real_sendto(fd, buf, len, flags, a, al);
	note(sends, &n_send, now_ns() - t);
	return r;
}

ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	REAL(sendmsg);
	uint64_t t = sending();
	ssize_t r = real_sendmsg(fd, m, flags);
	note(sends, &n_send, now_ns() - t);
	return r;
}

static int by_value(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static void show(const char *what, uint32_t *v, unsigned n)
{
	if (n < 100)
		return;
	qsort(v, n, sizeof(*v), by_value);
	fprintf(stderr, "turnaround: %s n=%u p10=%u p50=%u p90=%u ns\n", what, n, v[n / 10], v[n / 2], v[n * 9 / 10]);
}

__attribute__((destructor)) static void report(void)
{
	show("recv-to-send", turn, n_turn);
	show("send-call", sends, n_send);
	show("recv-call-with-data", recvs, n_recv);
	if (RUNNING_ON_VALGRIND)
		fprintf(stderr, "turnaround: collected %lu\n", collected);
}
