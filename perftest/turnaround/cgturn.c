/*
 * cgturn.c — LD_PRELOAD shim for callgrind (--collect-atstart=no): collects only the main
 * thread's turnarounds (see turn.c), from the recv that returns 1-255 bytes to the next
 * send, so that callgrind counts the instructions of that path alone. Every 1000 turnarounds
 * it dumps callgrind's counts (which starts them over): a dump holds 1000 whole turnarounds,
 * where the final counts also hold whatever a last, unanswered message's window collected
 * (perftest sorting its samples). Prints the number of turnarounds on stderr at exit.
 *
 *   gcc -O2 -shared -fPIC -o cgturn.so cgturn.c -ldl    (needs valgrind's callgrind.h)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

static int collecting;
static unsigned long turns;

static void received(ssize_t r)
{
	if (r > 0 && r < 256 && !collecting && gettid() == getpid()) {
		collecting = 1;
		CALLGRIND_TOGGLE_COLLECT;
	}
}

static void sending(void)
{
	if (collecting && gettid() == getpid()) {
		CALLGRIND_TOGGLE_COLLECT;
		collecting = 0;
		if (++turns % 1000 == 0)
			CALLGRIND_DUMP_STATS;
	}
}

#define REAL(name) static __typeof__(name) *real_##name; if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	REAL(recv);
	ssize_t r = real_recv(fd, buf, len, flags);
	received(r);
	return r;
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *a, socklen_t *al)
{
	REAL(recvfrom);
	ssize_t r = real_recvfrom(fd, buf, len, flags, a, al);
	received(r);
	return r;
}

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	REAL(send);
	sending();
	return real_send(fd, buf, len, flags);
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *a, socklen_t al)
{
	REAL(sendto);
	sending();
	return real_sendto(fd, buf, len, flags, a, al);
}

ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	REAL(sendmsg);
	sending();
	return real_sendmsg(fd, m, flags);
}

__attribute__((destructor)) static void report(void)
{
	fprintf(stderr, "cgturn: turns %lu\n", turns);
}
