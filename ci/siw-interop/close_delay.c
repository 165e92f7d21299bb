/*
 * close_delay.c — an LD_PRELOAD shim for ci/siw-interop.sh only (not part of uiw).
 *
 * siw reports a Send it has already put on the wire as failed (IBV_WC_LOC_QP_OP_ERR, "Bad
 * wc status 2") when the peer's FIN arrives while its transmit path is still returning from
 * the last segment: siw_cm_llp_state_change() sets the QP's tx_suspend as soon as the socket
 * reaches CLOSE_WAIT, and siw_qp_sq_proc_tx() checks tx_suspend after a segment went out
 * before it looks whether that segment was the last (or, if the WQE was still queued,
 * siw_sq_flush() completes it with the same status). At the end of `ib_*_bw -R` the side
 * that receives the last data-exchange message closes at once; uiw at native speed does so
 * within a fraction of a millisecond, while the siw side in a TCG-emulated guest is still in
 * that window (the case then fails although every byte arrived and the capture is clean —
 * docs/siw-interop.md, "siw's close race").
 *
 * This shim delays shutdown() of a TCP socket whose local or peer port is
 * SIW_INTEROP_CLOSE_PORT by SIW_INTEROP_CLOSE_DELAY_MS (default 300) milliseconds, so that
 * uiw's FIN reaches the guest after siw has completed its last work request. Nothing else
 * changes: the bytes, their order and the FIN itself are what uiw sends.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

static int port_of(int fd, int peer)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int rc = peer ? getpeername(fd, (struct sockaddr *)&a, &len) : getsockname(fd, (struct sockaddr *)&a, &len);

	if (rc != 0 || a.sin_family != AF_INET)
		return -1;
	return ntohs(a.sin_port);
}

int shutdown(int fd, int how)
{
	static int (*real_shutdown)(int, int);
	const char *port = getenv("SIW_INTEROP_CLOSE_PORT");
	const char *ms = getenv("SIW_INTEROP_CLOSE_DELAY_MS");

	if (!real_shutdown)
		real_shutdown = (int (*)(int, int))dlsym(RTLD_NEXT, "shutdown");
	if (port && how != SHUT_RD && (port_of(fd, 0) == atoi(port) || port_of(fd, 1) == atoi(port))) {
		long d = ms ? atol(ms) : 300;
		struct timespec ts = { d / 1000, (d % 1000) * 1000000L };

		nanosleep(&ts, NULL);
	}
	return real_shutdown(fd, how);
}
