/*
 * srq_wait.c — a Send that arrives before any receive is posted to the receiver's SRQ is
 * delivered once one is posted, while the receiving application sleeps on a completion
 * channel (it never polls a CQ that could drive its QP).
 *
 * iWARP has no RNR NAK: uiw holds such a Send (TCP holds the sender back) for up to 5 s
 * waiting for a receive, then sends a "no buffer" Terminate. A receive posted to the QP's
 * own queue ended the wait at once; one posted to its SRQ did not (issue 13: fabtests'
 * fi_shared_ctx -e msg, whose server posts its shared receives only once every endpoint
 * is connected, failed with its receives flushed after the Terminate).
 *
 * One process, two RC QPs on the device connected to each other (ibv_modify_qp, GID 0):
 * A sends one message to B, whose receives come from an SRQ that is empty. A second later
 * (so that the Send has arrived and waits) the program posts one receive to the SRQ and
 * sleeps on B's completion channel. The receive must complete successfully with the
 * message; before the fix the Terminate came instead and B's CQ stayed empty.
 *
 * Then a second pair, A2 -> B2, B2 on the same SRQ: two receives are posted to the SRQ,
 * A sends one message to B, and once B has it, A2 sends one to B2. B2 must get the
 * second receive. Before the fix B, reading on after its Send, had taken that receive
 * ahead into its own queue, and B2's Send found the SRQ empty: "no buffer" Terminate
 * (fabtests' fi_shared_ctx -e msg: one Send per endpoint, as many shared receives).
 *
 *   srq_wait [-d DEV]
 *
 * Output is TAP-like ("ok - ..." / "not ok - ...", then "N passed, N failed"); exit status
 * 1 if any check failed.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "rc_pair.h"

int main(int argc, char **argv)
{
	struct ibv_device *dev;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *acq, *bcq, *ev_cq;
	struct ibv_srq *srq;
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_qp *a, *b, *a2, *b2;
	struct ibv_mr *mr;
	static char buf[4][64];
	struct ibv_sge sge;
	struct ibv_send_wr swr, *bad_s;
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_wc wc;
	struct pollfd p;
	void *ev_ctx;
	char detail[128];
	int i, n, got = 0;

	if (!pick_device(argc, argv, &dev))
		return 2;
	if (!dev)
		goto out;
	ctx = ibv_open_device(dev);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	ch = pd ? ibv_create_comp_channel(ctx) : NULL;
	acq = ch ? ibv_create_cq(ctx, 8, NULL, NULL, 0) : NULL;
	bcq = acq ? ibv_create_cq(ctx, 8, NULL, ch, 0) : NULL;
	srq = bcq ? ibv_create_srq(pd, &si) : NULL;
	mr = srq ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!check(mr && !ibv_query_gid(ctx, 1, 0, &gid), "device, PD, channel, CQs, SRQ, MR, GID 0",
		   strerror(errno)))
		goto out;
	if (!check(!connected_pair(pd, acq, bcq, srq, &a, &b), "two RC QPs connected, B's receives from the SRQ",
		   strerror(errno)))
		goto out;
	if (!check(!ibv_req_notify_cq(bcq, 0), "ibv_req_notify_cq on B's CQ", strerror(errno)))
		goto out;

	strcpy(buf[0], "hello, shared receive queue");
	sge.addr = (uintptr_t)buf[0];
	sge.length = sizeof(buf[0]);
	sge.lkey = mr->lkey;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 1;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	if (!check(!ibv_post_send(a, &swr, &bad_s), "A posts its Send, no receive anywhere yet", strerror(errno)))
		goto out;
	/* Set-up, not a measurement: the Send reaches B and waits for a receive. */
	sleep(1);

	sge.addr = (uintptr_t)buf[1];
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 2;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	if (!check(!ibv_post_srq_recv(srq, &rwr, &bad_r), "a receive posted to the SRQ", strerror(errno)))
		goto out;
	/* Sleep on the channel (bounded, so that a lost completion fails instead of hanging). */
	p.fd = ch->fd;
	p.events = POLLIN;
	p.revents = 0;
	if (poll(&p, 1, 30000) == 1 && !ibv_get_cq_event(ch, &ev_cq, &ev_ctx)) {
		ibv_ack_cq_events(ev_cq, 1);
		n = ibv_poll_cq(bcq, 1, &wc);
		got = n == 1;
	}
	snprintf(detail, sizeof(detail), "%s", got ? ibv_wc_status_str(wc.status) : "no completion");
	if (!check(got && wc.status == IBV_WC_SUCCESS && wc.wr_id == 2 && wc.opcode == IBV_WC_RECV &&
			   !strcmp(buf[1], buf[0]),
		   "B's SRQ receive completes with the message, woken through the channel", detail))
		goto out;

	/* Second part: no receive may stay with a QP that does not need it. */
	if (!check(!connected_pair(pd, acq, bcq, srq, &a2, &b2), "a second pair A2 -> B2, B2 on the same SRQ",
		   strerror(errno)))
		goto out;
	for (i = 0; i < 2; i++) {
		sge.addr = (uintptr_t)buf[2 + i];
		rwr.wr_id = 10 + i;
		if (!check(!ibv_post_srq_recv(srq, &rwr, &bad_r), "a receive posted to the SRQ", strerror(errno)))
			goto out;
	}
	for (i = 0; i < 2; i++) {
		sge.addr = (uintptr_t)buf[0];
		if (!check(!ibv_post_send(i ? a2 : a, &swr, &bad_s), i ? "A2 sends to B2" : "A sends to B",
			   strerror(errno)))
			goto out;
		/* The receive side's completion, by polling (bounded: a lost one fails). */
		for (got = 0, n = 0; !got && n < 30000; n++) {
			got = ibv_poll_cq(bcq, 1, &wc) == 1;
			if (!got)
				usleep(1000);
		}
		snprintf(detail, sizeof(detail), "%s", got ? ibv_wc_status_str(wc.status) : "no completion");
		if (!check(got && wc.status == IBV_WC_SUCCESS && wc.qp_num == (i ? b2 : b)->qp_num,
			   i ? "B2's Send finds the SRQ's second receive (B kept none)" : "B gets its Send",
			   detail))
			goto out;
	}
out:
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
