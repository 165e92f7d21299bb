/*
 * target.c — an RC QP driven line by line from stdin, for tests that play its peer
 * themselves (a scripted, possibly hostile peer speaking raw MPA/DDP/RDMAP over TCP).
 *
 *   target [-d DEV] [-g IDX] [-n NRECV]
 *
 * It opens DEV (default uiw_lo, or $UIW_DEVICE), creates a PD, one CQ, an RC QP and
 * two memory regions, each in the middle of a larger allocation whose guard pages
 * (before and after) are filled with 0xA5 and never registered:
 *   data  4096 bytes, REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC | LOCAL_WRITE, zeroed
 *   recv  4096 bytes, LOCAL_WRITE: NRECV (default 4) receives of 64 bytes each are posted
 *         from it once the QP is in RTS
 * and prints
 *   READY qpn=0xQPN psn=PSN rkey=0xRKEY addr=0xADDR len=4096 gid=A.B.C.D
 * (psn is what it will pass as sq_psn; gid is the IPv4 of its GID index). Then it reads
 * commands, one per line, and answers each:
 *   PEER A.B.C.D QPN PSN   moves the QP to RTR towards that peer (dgid ::ffff:A.B.C.D,
 *                          dest_qp_num QPN, rq_psn PSN, sq_psn = its own psn) and RTS;
 *                          prints "RTS" or "ERROR modify <errno>"
 *   WRITE RKEY ADDR LEN    posts a signaled RDMA Write of LEN bytes of the data region
 *   READ RKEY ADDR LEN     posts a signaled RDMA Read into the data region
 *   SEND LEN               posts a signaled Send of LEN bytes of the data region
 *   WAIT MS                polls the CQ and the async fd for MS milliseconds, printing
 *                            WC wr_id=N status=S opcode=O len=L
 *                            EVENT type=T
 *   STATE                  prints "STATE n" (ibv_query_qp)
 *   DUMP OFF LEN           prints "DATA <hex>" of the data region
 *   CHECK                  prints "GUARDS ok" or "GUARDS bad <which> <offset>"
 *   QUIT                   destroys everything and exits 0
 * Every line it prints is flushed at once. Posted WRs use wr_id 1, 2, ... (receives
 * 1001, 1002, ...).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define GUARD 0xA5

struct region {
	unsigned char *base; /* guard | PAGE | guard */
	unsigned char *buf;
	struct ibv_mr *mr;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct region data, recvr;
static uint32_t my_psn;
static int gid_idx;
static uint64_t next_wr = 1;

static void region_init(struct region *r, int access)
{
	r->base = aligned_alloc(PAGE, 3 * PAGE);
	if (!r->base) {
		perror("aligned_alloc");
		exit(2);
	}
	memset(r->base, GUARD, 3 * PAGE);
	r->buf = r->base + PAGE;
	memset(r->buf, 0, PAGE);
	r->mr = ibv_reg_mr(pd, r->buf, PAGE, access);
	if (!r->mr) {
		perror("ibv_reg_mr");
		exit(2);
	}
}

static int guards_ok(const struct region *r, const char *name)
{
	for (int i = 0; i < PAGE; i++) {
		if (r->base[i] != GUARD) {
			printf("GUARDS bad %s-before %d\n", name, i);
			return 0;
		}
		if (r->base[2 * PAGE + i] != GUARD) {
			printf("GUARDS bad %s-after %d\n", name, i);
			return 0;
		}
	}
	return 1;
}

static void to_rts(const char *ip, uint32_t qpn, uint32_t psn)
{
	struct ibv_qp_attr a;
	union ibv_gid gid;

	memset(&gid, 0, sizeof gid);
	gid.raw[10] = 0xff;
	gid.raw[11] = 0xff;
	if (inet_pton(AF_INET, ip, &gid.raw[12]) != 1) {
		printf("ERROR address %s\n", ip);
		return;
	}
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qpn;
	a.rq_psn = psn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = (uint8_t)gid_idx;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	errno = ibv_modify_qp(qp, &a,
			      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (errno) {
		printf("ERROR modify %d\n", errno);
		return;
	}
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = my_psn;
	a.max_rd_atomic = 4;
	errno = ibv_modify_qp(qp, &a,
			      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				      IBV_QP_MAX_QP_RD_ATOMIC);
	if (errno) {
		printf("ERROR modify %d\n", errno);
		return;
	}
	printf("RTS\n");
}

static void post_recvs(int n)
{
	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)recvr.buf + 64 * (uint64_t)i, .length = 64, .lkey = recvr.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 1001 + (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if ((errno = ibv_post_recv(qp, &wr, &bad)))
			printf("ERROR post_recv %d\n", errno);
	}
}

static void post_send(enum ibv_wr_opcode op, uint32_t rkey, uint64_t raddr, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)data.buf, .length = len, .lkey = data.mr->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof wr);
	wr.wr_id = next_wr++;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.rkey = rkey;
	wr.wr.rdma.remote_addr = raddr;
	if ((errno = ibv_post_send(qp, &wr, &bad)))
		printf("ERROR post_send %d\n", errno);
	else
		printf("POSTED wr_id=%" PRIu64 "\n", wr.wr_id);
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void wait_ms(int ms)
{
	double end = now_ms() + ms;
	struct ibv_wc wc[8];

	while (now_ms() < end) {
		int n = ibv_poll_cq(cq, 8, wc);
		for (int i = 0; i < n; i++)
			printf("WC wr_id=%" PRIu64 " status=%d opcode=%d len=%u\n", wc[i].wr_id, wc[i].status,
			       wc[i].opcode, wc[i].byte_len);
		struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
		if (poll(&p, 1, n > 0 ? 0 : 1) > 0) {
			struct ibv_async_event ev;
			if (ibv_get_async_event(ctx, &ev) == 0) {
				printf("EVENT type=%d\n", ev.event_type);
				ibv_ack_async_event(&ev);
			}
		}
		fflush(stdout);
	}
}

int main(int argc, char **argv)
{
	const char *dev = getenv("UIW_DEVICE") ? getenv("UIW_DEVICE") : "uiw_lo";
	int nrecv = 4, opt;
	struct ibv_device **list;
	union ibv_gid gid;
	char line[256];

	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((opt = getopt(argc, argv, "d:g:n:h")) != -1) {
		switch (opt) {
		case 'd': dev = optarg; break;
		case 'g': gid_idx = atoi(optarg); break;
		case 'n': nrecv = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: target [-d DEV] [-g IDX] [-n NRECV]  (commands on stdin, see the source)\n");
			return opt == 'h' ? 0 : 2;
		}
	}
	list = ibv_get_device_list(NULL);
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev))
			ctx = ibv_open_device(list[i]);
	if (!ctx) {
		fprintf(stderr, "target: cannot open %s\n", dev);
		return 2;
	}
	ibv_free_device_list(list);
	int fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !cq) {
		perror("pd/cq");
		return 2;
	}
	region_init(&data, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC);
	region_init(&recvr, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qp = ibv_create_qp(pd, &qa);
	if (!qp) {
		perror("ibv_create_qp");
		return 2;
	}
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	if ((errno = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))) {
		perror("INIT");
		return 2;
	}
	if (ibv_query_gid(ctx, 1, gid_idx, &gid)) {
		perror("ibv_query_gid");
		return 2;
	}
	srand48(getpid() ^ time(NULL));
	my_psn = lrand48() & 0xffffff;
	char ip[INET_ADDRSTRLEN] = "0.0.0.0";
	inet_ntop(AF_INET, &gid.raw[12], ip, sizeof ip);
	printf("READY qpn=0x%06x psn=%u rkey=0x%08x addr=0x%" PRIx64 " len=%d gid=%s\n", qp->qp_num, my_psn,
	       data.mr->rkey, (uint64_t)(uintptr_t)data.buf, PAGE, ip);

	while (fgets(line, sizeof line, stdin)) {
		char cmd[16] = "", ipb[64];
		uint64_t x = 0, y = 0, z = 0;
		if (sscanf(line, "%15s", cmd) != 1)
			continue;
		if (!strcmp(cmd, "PEER") && sscanf(line, "%*s %63s %" SCNi64 " %" SCNi64, ipb, &x, &y) == 3) {
			to_rts(ipb, (uint32_t)x, (uint32_t)y);
			post_recvs(nrecv);
		} else if (!strcmp(cmd, "WRITE") && sscanf(line, "%*s %" SCNi64 " %" SCNi64 " %" SCNi64, &x, &y, &z) == 3) {
			post_send(IBV_WR_RDMA_WRITE, (uint32_t)x, y, (uint32_t)z);
		} else if (!strcmp(cmd, "READ") && sscanf(line, "%*s %" SCNi64 " %" SCNi64 " %" SCNi64, &x, &y, &z) == 3) {
			post_send(IBV_WR_RDMA_READ, (uint32_t)x, y, (uint32_t)z);
		} else if (!strcmp(cmd, "SEND") && sscanf(line, "%*s %" SCNi64, &z) == 1) {
			post_send(IBV_WR_SEND, 0, 0, (uint32_t)z);
		} else if (!strcmp(cmd, "WAIT") && sscanf(line, "%*s %" SCNi64, &x) == 1) {
			wait_ms((int)x);
			printf("WAITED\n");
		} else if (!strcmp(cmd, "STATE")) {
			struct ibv_qp_attr qa2;
			struct ibv_qp_init_attr ia;
			if (ibv_query_qp(qp, &qa2, IBV_QP_STATE, &ia) == 0)
				printf("STATE %d\n", qa2.qp_state);
			else
				printf("ERROR query_qp %d\n", errno);
		} else if (!strcmp(cmd, "DUMP") && sscanf(line, "%*s %" SCNi64 " %" SCNi64, &x, &y) == 2 && x + y <= PAGE) {
			printf("DATA ");
			for (uint64_t i = 0; i < y; i++)
				printf("%02x", data.buf[x + i]);
			printf("\n");
		} else if (!strcmp(cmd, "CHECK")) {
			if (guards_ok(&data, "data") && guards_ok(&recvr, "recv"))
				printf("GUARDS ok\n");
		} else if (!strcmp(cmd, "QUIT")) {
			break;
		} else {
			printf("ERROR command %s", line);
		}
		fflush(stdout);
	}
	ibv_destroy_qp(qp);
	ibv_dereg_mr(data.mr);
	ibv_dereg_mr(recvr.mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	free(data.base);
	free(recvr.base);
	return 0;
}
