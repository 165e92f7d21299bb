/*
 * fork.c — rdma-core's fork rules on an RC device: a process that uses verbs forks; the child
 * must get a clean, usable library (it opens the device anew and moves data over QPs of its
 * own), and the parent's connections must carry on as if nothing happened (the child neither
 * reads from nor closes the parent's streams).
 *
 *   fork [-d DEV] [-g IDX]
 *
 * Each side (parent before and after the fork, child) connects two RC QPs of its own to each
 * other over the GID (ibv_rc_pingpong's way: RTR with the other's QPN and PSN), RDMA Writes a
 * pattern from one to the other and checks that it landed. Output: "ok - ..." / "not ok - ...",
 * then "N passed, N failed"; exit status 1 if anything failed. Links only against -libverbs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SIZE 4096

static int passed, failed;
static const char *who = "parent";

static void check(int cond, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s %s - ", cond ? "ok" : "not ok", who);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	if (cond)
		passed++;
	else
		failed++;
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp[2];
	struct ibv_mr *mr[2];
	unsigned char *buf[2];
	uint32_t psn[2];
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int open_side(struct side *s, const char *dev, int gid_idx)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	union ibv_gid gid;

	memset(s, 0, sizeof *s);
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev))
			s->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!s->ctx)
		return -1;
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
	if (!s->pd || !s->cq || ibv_query_gid(s->ctx, 1, gid_idx, &gid))
		return -1;
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr qa = {
			.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		s->buf[i] = calloc(1, SIZE);
		s->mr[i] = ibv_reg_mr(s->pd, s->buf[i], SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		s->qp[i] = ibv_create_qp(s->pd, &qa);
		s->psn[i] = (uint32_t)(lrand48() & 0xffffff);
		if (!s->buf[i] || !s->mr[i] || !s->qp[i])
			return -1;
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
					 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
		if (ibv_modify_qp(s->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
			return -1;
	}
	for (int i = 0; i < 2; i++) {
		int o = 1 - i;
		struct ibv_qp_attr a;
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = s->qp[o]->qp_num;
		a.rq_psn = s->psn[o];
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 12;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.sgid_index = (uint8_t)gid_idx;
		a.ah_attr.grh.hop_limit = 1;
		a.ah_attr.port_num = 1;
		if (ibv_modify_qp(s->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
							   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
			return -1;
	}
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr a;
		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_RTS;
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.sq_psn = s->psn[i];
		a.max_rd_atomic = 1;
		if (ibv_modify_qp(s->qp[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
							   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			return -1;
	}
	return 0;
}

/* QP 0 Writes `seed`'s pattern into QP 1's buffer; 0 when it completed and landed. */
static int write_pattern(struct side *s, unsigned seed, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf[0], .length = 256, .lkey = s->mr[0]->lkey };
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	double end = now() + 10;
	int n;

	for (int i = 0; i < 256; i++)
		s->buf[0][i] = (unsigned char)(seed * 31 + i * 7);
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.rkey = s->mr[1]->rkey;
	wr.wr.rdma.remote_addr = (uintptr_t)s->buf[1];
	if ((errno = ibv_post_send(s->qp[0], &wr, &bad)))
		return -1;
	while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0 && now() < end)
		;
	if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id)
		return -2;
	/* A Write completes once sent: wait for it to land. */
	while (now() < end) {
		if (!memcmp(s->buf[0], s->buf[1], 256))
			return 0;
		ibv_poll_cq(s->cq, 1, &wc);
	}
	return -3;
}

static void close_side(struct side *s)
{
	for (int i = 0; i < 2; i++) {
		ibv_destroy_qp(s->qp[i]);
		ibv_dereg_mr(s->mr[i]);
		free(s->buf[i]);
	}
	ibv_destroy_cq(s->cq);
	ibv_dealloc_pd(s->pd);
	ibv_close_device(s->ctx);
}

int main(int argc, char **argv)
{
	const char *dev = getenv("UIW_DEVICE") ? getenv("UIW_DEVICE") : "uiw_lo";
	int gid_idx = 0, opt, status = 0;
	struct side p, c;
	pid_t pid;

	while ((opt = getopt(argc, argv, "d:g:")) != -1) {
		switch (opt) {
		case 'd': dev = optarg; break;
		case 'g': gid_idx = atoi(optarg); break;
		default: fprintf(stderr, "usage: fork [-d DEV] [-g IDX]\n"); return 2;
		}
	}
	srand48(getpid());
	check(open_side(&p, dev, gid_idx) == 0, "two connected QPs on %s", dev);
	check(write_pattern(&p, 1, 1) == 0, "RDMA Write lands before the fork");
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		check(0, "fork: %s", strerror(errno));
	} else if (pid == 0) {
		who = "child";
		passed = failed = 0; /* the child's own checks */
		srand48(getpid());
		check(open_side(&c, dev, gid_idx) == 0, "opens %s anew and connects two QPs of its own", dev);
		check(write_pattern(&c, 2, 7) == 0, "RDMA Write lands in the child");
		close_side(&c);
		printf("child: %d passed, %d failed\n", passed, failed);
		fflush(stdout);
		_exit(failed ? 1 : 0);
	} else {
		for (int k = 0; k < 3; k++)
			check(write_pattern(&p, 10 + k, 2 + k) == 0, "the parent's QPs carry on after the fork (%d)", k);
		check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "the child exits 0 (status 0x%x)", status);
		check(write_pattern(&p, 20, 9) == 0, "the parent's QPs carry on after the child exited");
		close_side(&p);
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
