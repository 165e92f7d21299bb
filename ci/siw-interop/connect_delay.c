/*
 * connect_delay.c — an LD_PRELOAD shim for ci/siw-interop.sh only (not part of uiw).
 *
 * perftest 4.5-0.17 (Debian 12) in rdma_cm mode (-R) makes two connections to the same port:
 * its server destroys the listener after accepting the first (the "data exchange" one) and
 * listens again only after it has allocated the measured QP's resources. A client that
 * connects in between is reset and does not recover (its retry loop destroys the event
 * channel it then reuses). Between two peers of similar speed the gap is never hit; with the
 * server in a TCG-emulated guest it is. This shim delays the second and later connect()
 * calls to the port named by SIW_INTEROP_DELAY_PORT by SIW_INTEROP_DELAY_MS (default 1500)
 * milliseconds, so that the guest's server is listening again. Nothing else changes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	static int (*real_connect)(int, const struct sockaddr *, socklen_t);
	static atomic_int seen;
	const char *port = getenv("SIW_INTEROP_DELAY_PORT");
	const char *ms = getenv("SIW_INTEROP_DELAY_MS");

	if (!real_connect)
		real_connect = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
	if (port && addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in) &&
	    ntohs(((const struct sockaddr_in *)addr)->sin_port) == atoi(port) &&
	    atomic_fetch_add(&seen, 1) > 0) {
		long d = ms ? atol(ms) : 1500;
		struct timespec ts = { d / 1000, (d % 1000) * 1000000L };

		nanosleep(&ts, NULL);
	}
	return real_connect(fd, addr, len);
}
