/*
 * rc_pair.h — what the one-process RC examples share: TAP-like checks ("ok - ..." /
 * "not ok - ...", counted for the closing "N passed, N failed" line) and the modify_qp steps
 * that connect two RC QPs of this process to each other (GID 0 of port 1, in `gid`).
 *
 * Header-only (static functions): each example is one C file built on its own
 * (uiw_examples::build_c_example); this one is found beside it.
 */
#ifndef UIW_EXAMPLES_RC_PAIR_H
#define UIW_EXAMPLES_RC_PAIR_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

static int passed, failed;

static int check(int cond, const char *what, const char *detail)
{
	if (cond) {
		passed++;
		printf("ok - %s\n", what);
	} else {
		failed++;
		printf("not ok - %s (%s)\n", what, detail ? detail : "");
	}
	fflush(stdout);
	return cond;
}

/* The device named by -d DEV (default: $UIW_DEVICE; neither: the last one listed) into *dev,
 * checked ("device found"; NULL if there is none). 0 after a usage error (printed). */
static int pick_device(int argc, char **argv, struct ibv_device **dev)
{
	const char *want = getenv("UIW_DEVICE");
	struct ibv_device **list;
	int opt, i;

	while ((opt = getopt(argc, argv, "d:")) != -1) {
		if (opt != 'd') {
			fprintf(stderr, "usage: %s [-d DEV]\n", argv[0]);
			return 0;
		}
		want = optarg;
	}
	*dev = NULL;
	list = ibv_get_device_list(NULL);
	for (i = 0; list && list[i]; i++)
		if (!want || !strcmp(ibv_get_device_name(list[i]), want))
			*dev = list[i];
	check(*dev != NULL, "device found", want ? want : "no device");
	return 1;
}

static union ibv_gid gid;

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, uint32_t peer)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Connects RC QPs a and b of this process to each other (INIT, RTR, RTS on both); 0 on success. */
static int connect_qps(struct ibv_qp *a, struct ibv_qp *b)
{
	return to_init(a) || to_init(b) || to_rtr(a, b->qp_num) || to_rtr(b, a->qp_num) || to_rts(a) || to_rts(b);
}

/* Creates RC QPs *a on CQ acq and *b on CQ bcq (receiving from srq unless it is NULL), 4 WRs
 * and 1 SGE each way, and connects them (connect_qps); 0 on success. A QP not created is NULL. */
static int connected_pair(struct ibv_pd *pd, struct ibv_cq *acq, struct ibv_cq *bcq, struct ibv_srq *srq,
			  struct ibv_qp **a, struct ibv_qp **b)
{
	struct ibv_qp_init_attr ia;

	memset(&ia, 0, sizeof(ia));
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.send_cq = acq;
	ia.recv_cq = acq;
	*a = ibv_create_qp(pd, &ia);
	ia.send_cq = bcq;
	ia.recv_cq = bcq;
	ia.srq = srq;
	*b = *a ? ibv_create_qp(pd, &ia) : NULL;
	return !*b || connect_qps(*a, *b);
}

#endif
