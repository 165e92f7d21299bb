/*
 * channel_wait.c — a thread blocked in ibv_get_cq_event behaves as it does on a kernel
 * provider, now that uiw serves the channel's QPs in that thread while it waits
 * (libuiw_preload.so hands the channel's read() to the provider, which sleeps in the shim's
 * poll() and serves the QPs whose streams woke it).
 *
 * One process, two RC QPs on the device connected to each other (ibv_modify_qp, GID 0); B's
 * CQ has a completion channel. A waiter thread calls ibv_get_cq_event on it, and:
 *   1. A's Send to B wakes it with B's CQ, whose receive holds the message;
 *   2. a signal whose handler has no SA_RESTART ends the wait with EINTR, as read(2) does;
 *   3. one whose handler has SA_RESTART does not: the wait goes on until the next Send;
 *   4. pthread_cancel ends it and the thread joins (the wait is a cancellation point, and
 *      nothing on the cancelled thread's stack may catch the unwinding: before the fix the
 *      process aborted with "FATAL: exception not rethrown");
 *   5. with O_NONBLOCK on the channel's fd and no event, ibv_get_cq_event fails with EAGAIN
 *      at once;
 *   6. B's 128 MiB of Sends to A go while the waiter sleeps holding B, and a signal without
 *      SA_RESTART then ends the wait with errno EINTR, not what handing B back left in it.
 *
 *   channel_wait [-d DEV]
 *
 * Output is TAP-like ("ok - ..." / "not ok - ...", then "N passed, N failed"); exit status
 * 1 if any check failed. Every wait is bounded (a lost wake-up fails, it does not hang).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "rc_pair.h"

static struct ibv_comp_channel *ch;

/* Step 6's messages: long enough to keep B's stream full for a while. */
#define BIG (32u << 20)

/* What the waiter's ibv_get_cq_event returned. */
struct waited {
	int ret, err;
	struct ibv_cq *cq;
};

static void *waiter(void *arg)
{
	struct waited *w = arg;
	void *ctx;

	w->ret = ibv_get_cq_event(ch, &w->cq, &ctx);
	w->err = errno;
	return NULL;
}

static void on_signal(int sig)
{
	(void)sig;
}

static void catch_usr1(int flags)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sa.sa_flags = flags;
	sigaction(SIGUSR1, &sa, NULL);
}

/* Joins t within `secs`; 0 if it ended, ETIMEDOUT if it is still waiting. */
static int join_within(pthread_t t, int secs, void **res)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += secs;
	return pthread_timedjoin_np(t, res, &ts);
}

static void pause_ms(int ms)
{
	/* Set-up, not a measurement: lets the waiter reach its sleep. */
	usleep(ms * 1000);
}

/* Starts a waiter thread reporting into *w, and lets it reach its sleep. */
static void start_waiter(pthread_t *t, struct waited *w)
{
	memset(w, 0, sizeof(*w));
	pthread_create(t, NULL, waiter, w);
	pause_ms(100);
}

int main(int argc, char **argv)
{
	struct ibv_device *dev;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *acq, *bcq;
	struct ibv_qp *a, *b;
	struct ibv_mr *mr;
	static char buf[2][64];
	struct ibv_sge ssge, rsge;
	struct ibv_send_wr swr, *bad_s;
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_wc wc;
	struct waited w;
	pthread_t t;
	void *res;
	char detail[160];
	int n, flags, i, waits = 0;
	char *big = NULL;
	struct ibv_mr *bigmr = NULL;

	if (!pick_device(argc, argv, &dev))
		return 2;
	if (!dev)
		goto out;
	ctx = ibv_open_device(dev);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	ch = pd ? ibv_create_comp_channel(ctx) : NULL;
	acq = ch ? ibv_create_cq(ctx, 8, NULL, NULL, 0) : NULL;
	bcq = acq ? ibv_create_cq(ctx, 8, NULL, ch, 0) : NULL;
	mr = bcq ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!check(mr && !ibv_query_gid(ctx, 1, 0, &gid), "device, PD, channel, CQs, MR, GID 0", strerror(errno)))
		goto out;
	if (!check(!connected_pair(pd, acq, bcq, NULL, &a, &b), "two RC QPs connected, B's CQ on the channel",
		   strerror(errno)))
		goto out;

	ssge.addr = (uintptr_t)buf[0];
	ssge.length = sizeof(buf[0]);
	ssge.lkey = mr->lkey;
	memset(&swr, 0, sizeof(swr));
	swr.sg_list = &ssge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	rsge = ssge;
	rsge.addr = (uintptr_t)buf[1];
	memset(&rwr, 0, sizeof(rwr));
	rwr.sg_list = &rsge;
	rwr.num_sge = 1;

	/* 1. A Send wakes the waiter. */
	rwr.wr_id = 1;
	if (!check(!ibv_post_recv(b, &rwr, &bad_r) && !ibv_req_notify_cq(bcq, 0), "B's receive posted, its CQ armed",
		   strerror(errno)))
		goto out;
	start_waiter(&t, &w);
	strcpy(buf[0], "wake the waiter");
	swr.wr_id = 1;
	if (!check(!ibv_post_send(a, &swr, &bad_s), "A sends to B", strerror(errno)))
		goto out;
	n = join_within(t, 30, &res);
	snprintf(detail, sizeof(detail), "join %d, ibv_get_cq_event %d (%s)", n, w.ret, strerror(w.err));
	if (!check(n == 0 && w.ret == 0 && w.cq == bcq, "the Send wakes ibv_get_cq_event with B's CQ", detail))
		goto out;
	ibv_ack_cq_events(bcq, 1);
	n = ibv_poll_cq(bcq, 1, &wc);
	snprintf(detail, sizeof(detail), "%d completions, %s", n, n == 1 ? ibv_wc_status_str(wc.status) : "-");
	check(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && !strcmp(buf[1], buf[0]),
	      "B's receive holds the message", detail);
	while (ibv_poll_cq(acq, 1, &wc) == 1)
		;

	/* 2. A signal without SA_RESTART ends the wait with EINTR. */
	catch_usr1(0);
	if (!check(!ibv_req_notify_cq(bcq, 0), "B's CQ armed again", strerror(errno)))
		goto out;
	start_waiter(&t, &w);
	pthread_kill(t, SIGUSR1);
	n = join_within(t, 10, &res);
	snprintf(detail, sizeof(detail), "join %d, ibv_get_cq_event %d (%s)", n, w.ret, strerror(w.err));
	check(n == 0 && w.ret == -1 && w.err == EINTR, "a signal handled without SA_RESTART: EINTR", detail);
	if (n != 0)
		goto out;

	/* 3. With SA_RESTART the wait goes on, until the next Send. */
	catch_usr1(SA_RESTART);
	start_waiter(&t, &w);
	pthread_kill(t, SIGUSR1);
	pause_ms(100);
	n = pthread_tryjoin_np(t, &res);
	check(n == EBUSY, "a signal handled with SA_RESTART: still waiting", n ? strerror(n) : "it returned");
	if (n == 0)
		goto out;
	rwr.wr_id = 2;
	swr.wr_id = 2;
	strcpy(buf[0], "after the signal");
	if (!check(!ibv_post_recv(b, &rwr, &bad_r) && !ibv_post_send(a, &swr, &bad_s), "A sends to B again",
		   strerror(errno)))
		goto out;
	n = join_within(t, 30, &res);
	snprintf(detail, sizeof(detail), "join %d, ibv_get_cq_event %d (%s)", n, w.ret, strerror(w.err));
	if (!check(n == 0 && w.ret == 0 && w.cq == bcq, "then the Send wakes it", detail))
		goto out;
	ibv_ack_cq_events(bcq, 1);
	n = ibv_poll_cq(bcq, 1, &wc);
	check(n == 1 && wc.status == IBV_WC_SUCCESS && !strcmp(buf[1], "after the signal"), "with the message", "");

	/* 4. pthread_cancel ends the wait. */
	if (!check(!ibv_req_notify_cq(bcq, 0), "B's CQ armed again", strerror(errno)))
		goto out;
	start_waiter(&t, &w);
	pthread_cancel(t);
	n = join_within(t, 10, &res);
	check(n == 0 && res == PTHREAD_CANCELED, "pthread_cancel of the waiting thread: cancelled and joined",
	      n ? strerror(n) : "not cancelled");

	/* 5. A non-blocking channel: EAGAIN at once. */
	flags = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK);
	memset(&w, 0, sizeof(w));
	waiter(&w);
	snprintf(detail, sizeof(detail), "ibv_get_cq_event %d (%s)", w.ret, strerror(w.err));
	check(w.ret == -1 && w.err == EAGAIN, "O_NONBLOCK channel, no event: EAGAIN", detail);
	fcntl(ch->fd, F_SETFL, flags);

	/* 6. B sends A 128 MiB while the waiter sleeps holding B: it all goes (B's stream is
	 *    full at times, and its room is watched for). Then a signal: EINTR — handing B back
	 *    to the progress thread as the waiter wakes must leave its errno alone (qperf's timed
	 *    tests end by an alarm and tell its EINTR from a failure by errno; it read EEXIST). */
	catch_usr1(0);
	check(!ibv_req_notify_cq(bcq, 0), "B's CQ armed again", strerror(errno));
	big = malloc(BIG);
	bigmr = big ? ibv_reg_mr(pd, big, BIG, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!check(bigmr != NULL, "a 32 MiB MR", strerror(errno)))
		goto out;
	ssge.addr = rsge.addr = (uintptr_t)big;
	ssge.length = rsge.length = BIG;
	ssge.lkey = rsge.lkey = bigmr->lkey;
	for (i = 0; i < 4; i++)
		if (!check(!ibv_post_recv(a, &rwr, &bad_r), "A's 32 MiB receive posted", strerror(errno)))
			goto out;
	start_waiter(&t, &w);
	/* Unsignaled: nothing of theirs reaches B's CQ, so only the signal ends the wait. */
	for (i = 0; i < 4; i++)
		if (!check(!ibv_post_send(b, &swr, &bad_s), "B sends 32 MiB to A", strerror(errno)))
			goto out;
	for (i = 0, n = 0; i < 4 && n >= 0;) {
		n = ibv_poll_cq(acq, 1, &wc);
		if (n == 1)
			i += wc.status == IBV_WC_SUCCESS && wc.byte_len == BIG;
		else if (++waits > 30000)
			break;
		else
			usleep(1000);
	}
	snprintf(detail, sizeof(detail), "%d of 4", i);
	check(i == 4, "A received B's four messages whole", detail);
	pthread_kill(t, SIGUSR1);
	n = join_within(t, 10, &res);
	snprintf(detail, sizeof(detail), "join %d, ibv_get_cq_event %d (%s)", n, w.ret, strerror(w.err));
	check(n == 0 && w.ret == -1 && w.err == EINTR, "then a signal: EINTR, errno untouched by the hand-back", detail);
out:
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
