/*
 * dereg_race.c — ibv_dereg_mr while a peer streams RDMA Writes into the region
 * and RDMA Reads out of it, and a Read Request for a region already gone.
 *
 * What a kernel provider guarantees and uiw must too (issue 9): once
 * ibv_dereg_mr returns, no transfer touches the region any more — nothing
 * lands in it, nothing is read from it — and a peer's Read Request for it is
 * answered with an RFC 5040 Terminate, so the reader gets an error completion
 * (IBV_WC_REM_ACCESS_ERR), never zeros with a success status.
 *
 * One process, two RC QPs on one device connected to each other (as
 * ibv_rc_pingpong connects two processes: GID index 0, the other's QPN). QP
 * "a" is the active side; QP "b" owns the target region and never polls: the
 * provider serves it on its own (a passive target). Each round:
 *   1. a keeps WINDOW RDMA Writes (pattern 0xab) in flight into the target,
 *      the target is deregistered mid-stream, then overwritten with 0x00 by
 *      the application (or freed, with -f, so that valgrind sees any access);
 *      a's QP must end in error (the later Writes draw a Terminate), and the
 *      target must still hold only zeros after a's last completion;
 *   2. the same with RDMA Reads from a target filled with 0xcd: every Read
 *      that completes successfully returns only 0xcd;
 *   3. a Read Request for a region deregistered before it was posted: the
 *      completion is IBV_WC_REM_ACCESS_ERR.
 *
 * Build and run:
 *     cc -O1 -g -Wall -Werror -o dereg_race dereg_race.c -libverbs
 *     uiw run -- ./dereg_race [-d DEVICE] [-r ROUNDS] [-f]
 *
 * Output is TAP-like ("ok - ..." / "not ok - ...", then "N passed, N
 * failed"); exit status 1 if any check failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define TARGET (256 * 1024)
#define CHUNK (16 * 1024)
#define WINDOW 16

static int n_passed, n_failed;

static int check(int cond, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int check(int cond, const char *name, const char *fmt, ...)
{
	if (cond) {
		printf("ok - %s\n", name);
		n_passed++;
	} else {
		va_list ap;
		printf("not ok - %s: ", name);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		printf("\n");
		n_failed++;
	}
	fflush(stdout);
	return cond;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static int make_side(struct side *s)
{
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;

	s->cq = ibv_create_cq(ctx, 4 * WINDOW, NULL, NULL, 0);
	if (!s->cq)
		return -1;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = s->cq;
	ia.recv_cq = s->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 2 * WINDOW;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(pd, &ia);
	if (!s->qp)
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct side *s, uint32_t peer_qpn)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qpn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	return ibv_modify_qp(s->qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct side *s)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	return ibv_modify_qp(s->qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

static int connect_pair(struct side *a, struct side *b)
{
	if (make_side(a) || make_side(b))
		return -1;
	if (to_rtr(a, b->qp->qp_num) || to_rtr(b, a->qp->qp_num))
		return -1;
	return to_rts(a) || to_rts(b) ? -1 : 0;
}

static void destroy_side(struct side *s)
{
	if (s->qp)
		ibv_destroy_qp(s->qp);
	if (s->cq)
		ibv_destroy_cq(s->cq);
	s->qp = NULL;
	s->cq = NULL;
}

static int post(struct side *s, enum ibv_wr_opcode op, struct ibv_mr *local, size_t loff, uint64_t raddr,
		uint32_t rkey, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local->addr + loff, .length = CHUNK, .lkey = local->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(s->qp, &wr, &bad);
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char v, size_t *at)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v) {
			*at = i;
			return 0;
		}
	return 1;
}

/* One round of phase 1 (writes, op = IBV_WR_RDMA_WRITE) or 2 (reads). */
static void stream_and_dereg(enum ibv_wr_opcode op, int round, int free_target)
{
	int reads = op == IBV_WR_RDMA_READ;
	struct side a = { 0 }, b = { 0 };
	unsigned char *target = malloc(TARGET), *local = malloc(WINDOW * CHUNK);
	struct ibv_mr *tmr = NULL, *lmr = NULL;
	char name[128];
	int posted = 0, done = 0, ok = 0, errors = 0, bad_data = 0, dereged = 0;
	uint64_t raddr;
	uint32_t rkey;
	double deadline;

	snprintf(name, sizeof(name), "%s round %d: setup", reads ? "reads" : "writes", round);
	memset(target, reads ? 0xcd : 0x00, TARGET);
	memset(local, reads ? 0x00 : 0xab, WINDOW * CHUNK);
	tmr = ibv_reg_mr(pd, target, TARGET, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	lmr = ibv_reg_mr(pd, local, WINDOW * CHUNK, IBV_ACCESS_LOCAL_WRITE);
	if (!check(target && local && tmr && lmr && connect_pair(&a, &b) == 0, name, "%s", strerror(errno)))
		goto out;
	raddr = (uintptr_t)target;
	rkey = tmr->rkey;
	deadline = now_s() + 20;
	/* Keep WINDOW in flight; deregister after a few windows completed (the
	 * round number varies the moment). */
	while (done < posted || !dereged) {
		struct ibv_wc wc[WINDOW];
		int n;

		while (!dereged && posted - done < WINDOW) {
			uint64_t slot = posted % WINDOW;
			if (post(&a, op, lmr, slot * CHUNK, raddr + (posted * CHUNK) % TARGET, rkey, posted))
				break;
			posted++;
		}
		if (!dereged && done >= 2 * WINDOW + round % WINDOW) {
			int ret = ibv_dereg_mr(tmr);
			if (!check(ret == 0, "ibv_dereg_mr with transfers in flight", "%s", strerror(ret)))
				goto out;
			tmr = NULL;
			dereged = 1;
			/* From here on, the region is the application's again. */
			if (free_target) {
				free(target);
				target = NULL;
			} else if (!reads) {
				memset(target, 0x00, TARGET);
			}
		}
		n = ibv_poll_cq(a.cq, WINDOW, wc);
		if (n < 0 || now_s() > deadline) {
			check(0, "completions", "%s after %d of %d", n < 0 ? "ibv_poll_cq failed" : "timed out", done,
			      posted);
			goto out;
		}
		for (int i = 0; i < n; i++) {
			done++;
			if (wc[i].status == IBV_WC_SUCCESS) {
				size_t at;
				ok++;
				if (reads && !all_bytes(local + (wc[i].wr_id % WINDOW) * CHUNK, CHUNK, 0xcd, &at))
					bad_data++;
				if (reads)
					memset(local + (wc[i].wr_id % WINDOW) * CHUNK, 0, CHUNK);
			} else {
				errors++;
			}
		}
		/* After the dereg, the QP may fail before all posted WRs complete; the
		 * rest are flushed. Keep posting nothing and drain. */
	}
	snprintf(name, sizeof(name), "%s round %d: transfers before the dereg succeeded", reads ? "reads" : "writes",
		 round);
	check(ok >= 2 * WINDOW, name, "%d of %d", ok, posted);
	if (reads) {
		snprintf(name, sizeof(name), "reads round %d: every successful Read returned the region's bytes",
			 round);
		check(bad_data == 0, name, "%d Reads completed successfully with other bytes (zeros?)", bad_data);
	} else if (!free_target) {
		size_t at = 0;
		/* a's last completion is in: whatever the QPs still do, the target
		 * must not change any more either. */
		usleep(20000);
		snprintf(name, sizeof(name), "writes round %d: nothing landed after ibv_dereg_mr returned", round);
		check(all_bytes(target, TARGET, 0x00, &at), name, "byte %zu is 0x%02x", at, target[at]);
	}
out:
	destroy_side(&a);
	destroy_side(&b);
	if (tmr)
		ibv_dereg_mr(tmr);
	if (lmr)
		ibv_dereg_mr(lmr);
	free(target);
	free(local);
}

/* Phase 3: a Read Request for a region deregistered before the Read was posted. */
static void read_gone_region(void)
{
	struct side a = { 0 }, b = { 0 };
	unsigned char *target = calloc(1, TARGET), *local = calloc(1, CHUNK);
	struct ibv_mr *tmr, *lmr;
	struct ibv_wc wc;
	uint64_t raddr;
	uint32_t rkey;
	double deadline;
	int n = 0;

	tmr = ibv_reg_mr(pd, target, TARGET, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	lmr = ibv_reg_mr(pd, local, CHUNK, IBV_ACCESS_LOCAL_WRITE);
	if (!check(tmr && lmr && connect_pair(&a, &b) == 0, "gone region: setup", "%s", strerror(errno)))
		goto out;
	raddr = (uintptr_t)target;
	rkey = tmr->rkey;
	check(ibv_dereg_mr(tmr) == 0, "gone region: ibv_dereg_mr", "failed");
	if (!check(post(&a, IBV_WR_RDMA_READ, lmr, 0, raddr, rkey, 7) == 0, "gone region: post the Read", "failed"))
		goto out;
	deadline = now_s() + 20;
	while ((n = ibv_poll_cq(a.cq, 1, &wc)) == 0 && now_s() < deadline)
		;
	if (check(n == 1, "gone region: the Read completes", "n = %d", n))
		check(wc.wr_id == 7 && wc.status == IBV_WC_REM_ACCESS_ERR,
		      "gone region: the Read Request draws a Terminate (IBV_WC_REM_ACCESS_ERR)", "wr_id %llu status %s",
		      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
out:
	destroy_side(&a);
	destroy_side(&b);
	if (lmr)
		ibv_dereg_mr(lmr);
	free(target);
	free(local);
}

int main(int argc, char **argv)
{
	const char *dev_name = getenv("UIW_DEVICE");
	struct ibv_device **list;
	int rounds = 4, free_target = 0, opt, num;

	while ((opt = getopt(argc, argv, "d:r:f")) != -1) {
		switch (opt) {
		case 'd':
			dev_name = optarg;
			break;
		case 'r':
			rounds = atoi(optarg);
			break;
		case 'f':
			free_target = 1;
			break;
		default:
			fprintf(stderr, "usage: dereg_race [-d DEVICE] [-r ROUNDS] [-f]\n");
			return 2;
		}
	}
	list = ibv_get_device_list(&num);
	if (!list || num == 0) {
		fprintf(stderr, "dereg_race: no RDMA device\n");
		return 2;
	}
	for (int i = 0; i < num && !ctx; i++)
		if (!dev_name || strcmp(ibv_get_device_name(list[i]), dev_name) == 0)
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx || ibv_query_gid(ctx, 1, 0, &gid) || !(pd = ibv_alloc_pd(ctx))) {
		fprintf(stderr, "dereg_race: cannot open %s\n", dev_name ? dev_name : "a device");
		return 2;
	}
	for (int r = 0; r < rounds; r++) {
		stream_and_dereg(IBV_WR_RDMA_WRITE, r, free_target);
		stream_and_dereg(IBV_WR_RDMA_READ, r, free_target);
	}
	read_gone_region();
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	printf("%d passed, %d failed\n", n_passed, n_failed);
	return n_failed ? 1 : 0;
}
