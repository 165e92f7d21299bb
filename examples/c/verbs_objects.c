/*
 * verbs_objects.c — acceptance test and worked example for the uiw device.
 *
 * Walks through every verbs object an RDMA program creates before it moves
 * data (device, PD, MR, CQ, completion channel, QP, SRQ), using nothing but
 * the standard libibverbs API. It links only against -libverbs and knows
 * nothing about uiw: it runs unchanged against any iWARP device (siw, a
 * hardware RNIC) and checks that uiw behaves the way those do.
 *
 * Build and run:
 *     cc -O1 -g -Wall -Werror -o verbs_objects verbs_objects.c -libverbs
 *     uiw run -- ./verbs_objects             # device uiw_lo
 *     uiw run -- ./verbs_objects uiw_eth0    # another device (or UIW_DEVICE=...)
 *
 * Output is TAP-like: one line per check, "ok - <name>" or
 * "not ok - <name>: <details>", then "N passed, N failed". The exit status is
 * 1 if any check failed. Checks that cannot apply (for example a limit the
 * device does not have) print "ok - <name> # SKIP <reason>".
 *
 * Environment:
 *     UIW_DEVICE=<name>             device to open when no argument is given
 *     UIW_EXPECT_COMP_CHANNEL=1     ibv_create_comp_channel must succeed
 *                                   (`uiw run` provides it; a bare process
 *                                   may see it fail cleanly with NULL+errno)
 *
 * Where a call must fail, the expected errno is the one the Linux kernel's
 * verbs stack returns for a kernel provider (the references are given next
 * to each check), so a program written against siw or rxe sees the same
 * errors on uiw.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* ------------------------------------------------------------------------ */
/* Tiny TAP-like reporting                                                   */
/* ------------------------------------------------------------------------ */

static int n_passed, n_failed;

/* Record one check. `fmt` describes the failure and is only printed on one. */
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

static void skip(const char *name, const char *why)
{
	printf("ok - %s # SKIP %s\n", name, why);
	n_passed++;
	fflush(stdout);
}

/* A creation call (returning a pointer) that must fail with errno `want`. */
static int check_create_fails(const void *obj, int err, int want, const char *name)
{
	if (obj)
		return check(0, name, "succeeded, expected failure with %s",
			     strerror(want));
	return check(err == want, name, "errno %d (%s), expected %d (%s)", err,
		     strerror(err), want, strerror(want));
}

/* A call returning an errno value (0 = success) that must return `want`. */
static int check_ret(int ret, int want, const char *name)
{
	return check(ret == want, name, "returned %d (%s), expected %d (%s)", ret,
		     ret ? strerror(ret) : "success", want,
		     want ? strerror(want) : "success");
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

static const char *qp_state_str(enum ibv_qp_state s)
{
	static const char *names[] = { "RESET", "INIT", "RTR", "RTS",
				       "SQD", "SQE", "ERR" };
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * Poll `cq` until `want` completions arrived or `timeout_s` passed. Flushed
 * completions may be generated asynchronously by a provider's progress
 * engine, so one empty poll is not proof that none will come.
 */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int want, double timeout_s)
{
	double deadline = now_s() + timeout_s;
	int got = 0;

	while (got < want) {
		int n = ibv_poll_cq(cq, want - got, wc + got);

		if (n < 0)
			return n;
		got += n;
		if (got < want) {
			if (now_s() > deadline)
				break;
			usleep(1000);
		}
	}
	return got;
}

/* Move a QP to `state` setting only IBV_QP_STATE. Returns the errno value. */
static int move_qp(struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr = { .qp_state = state };

	return ibv_modify_qp(qp, &attr, IBV_QP_STATE);
}

/* RESET -> INIT with the attributes every RC QP needs for this transition. */
static int qp_to_init(struct ibv_qp *qp, int access)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = access,
	};

	return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					    IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* ------------------------------------------------------------------------ */
/* The device: list, open, query                                             */
/* ------------------------------------------------------------------------ */

/* Fills *attr_out; returns the opened context or NULL (then we stop). */
/*
 * What the kernel's ib_get_eth_speed() reports for an Ethernet/iWARP port
 * (siw's query_port uses it): the netdev's ethtool speed, in
 * /sys/class/net/<netdev>/speed, mapped to an IB speed and width; a netdev
 * without a speed (lo; EINVAL or -1 there) counts as 1000 Mb/s. Mainline's
 * table for a netdev that reports no lane count.
 */
/* ibv_port_attr.active_width/active_speed values (IBTA; verbs.h has no names). */
enum { WIDTH_1X = 1, WIDTH_4X = 2, WIDTH_2X = 16 };
enum { SPEED_SDR = 1, SPEED_DDR = 2, SPEED_FDR10 = 8, SPEED_EDR = 32,
       SPEED_HDR = 64, SPEED_NDR = 128 };

static void eth_speed(const char *netdev, uint8_t *speed, uint8_t *width,
		      long *mbps_out)
{
	char path[256];
	long mbps = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/net/%s/speed", netdev);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%ld", &mbps) != 1)
			mbps = -1;
		fclose(f);
	}
	*mbps_out = mbps;
	if (mbps <= 0)
		mbps = 1000;
	if (mbps <= 1000) {
		*width = WIDTH_1X; *speed = SPEED_SDR;
	} else if (mbps <= 10000) {
		*width = WIDTH_1X; *speed = SPEED_FDR10;
	} else if (mbps <= 20000) {
		*width = WIDTH_4X; *speed = SPEED_DDR;
	} else if (mbps <= 25000) {
		*width = WIDTH_1X; *speed = SPEED_EDR;
	} else if (mbps <= 40000) {
		*width = WIDTH_4X; *speed = SPEED_FDR10;
	} else if (mbps <= 50000) {
		*width = WIDTH_2X; *speed = SPEED_EDR;
	} else if (mbps <= 100000) {
		*width = WIDTH_4X; *speed = SPEED_EDR;
	} else if (mbps <= 200000) {
		*width = WIDTH_4X; *speed = SPEED_HDR;
	} else {
		*width = WIDTH_4X; *speed = SPEED_NDR;
	}
}

/* ib_mtu_int_to_enum(): the largest IB MTU not above the netdev's MTU. */
static int netdev_mtu_enum(const char *netdev)
{
	char path[256];
	long mtu = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/class/net/%s/mtu", netdev);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%ld", &mtu) != 1)
		mtu = -1;
	fclose(f);
	if (mtu < 0)
		return -1;
	return mtu >= 4096 ? IBV_MTU_4096 : mtu >= 2048 ? IBV_MTU_2048 :
	       mtu >= 1024 ? IBV_MTU_1024 : mtu >= 512 ? IBV_MTU_512 :
						 IBV_MTU_256;
}

static struct ibv_context *open_and_query(struct ibv_device **list, int num,
					  const char *want,
					  struct ibv_device_attr *attr_out)
{
	struct ibv_device *dev = NULL;
	struct ibv_context *ctx;
	struct ibv_device_attr attr;
	struct ibv_device_attr_ex attr_ex;
	struct ibv_port_attr port;
	union ibv_gid gid;
	uint16_t pkey;
	int i, ret;

	for (i = 0; i < num; i++)
		if (strcmp(ibv_get_device_name(list[i]), want) == 0)
			dev = list[i];
	if (!check(dev != NULL, "ibv_get_device_list lists the device",
		   "%s not among %d device(s)", want, num))
		return NULL;

	check(dev->node_type == IBV_NODE_RNIC, "device node type is RNIC",
	      "node_type %d (%s)", dev->node_type,
	      ibv_node_type_str(dev->node_type));
	check(dev->transport_type == IBV_TRANSPORT_IWARP,
	      "device transport is iWARP", "transport_type %d",
	      dev->transport_type);
	check(ibv_get_device_guid(dev) != 0, "ibv_get_device_guid is non-zero",
	      "guid 0");

	ctx = ibv_open_device(dev);
	if (!check(ctx != NULL, "ibv_open_device", "%s", strerror(errno)))
		return NULL;
	check(ctx->device == dev, "context points back at its device",
	      "ctx->device %p, device %p", (void *)ctx->device, (void *)dev);
	/* libibverbs reads async events from this fd: it must be a real one. */
	check(ctx->async_fd > 2 && fcntl(ctx->async_fd, F_GETFD) != -1,
	      "context async_fd is a valid fd > 2", "async_fd %d",
	      ctx->async_fd);

	ret = ibv_query_device(ctx, &attr);
	if (!check_ret(ret, 0, "ibv_query_device")) {
		ibv_close_device(ctx);
		return NULL;
	}
	*attr_out = attr;
	/* The minimums an RDMA application (perftest, MPI, SPDK, NVMe-oF) can
	 * count on from siw and the iWARP RNICs. */
	check(attr.max_qp_wr >= 4096, "max_qp_wr >= 4096", "max_qp_wr %d",
	      attr.max_qp_wr);
	check(attr.max_sge >= 6, "max_sge >= 6", "max_sge %d", attr.max_sge);
	check(attr.max_qp_rd_atom >= 16, "max_qp_rd_atom >= 16",
	      "max_qp_rd_atom %d", attr.max_qp_rd_atom);
	check(attr.max_qp_init_rd_atom >= 16, "max_qp_init_rd_atom >= 16",
	      "max_qp_init_rd_atom %d", attr.max_qp_init_rd_atom);
	check(attr.phys_port_cnt == 1, "one physical port", "phys_port_cnt %d",
	      attr.phys_port_cnt);
	check(attr.max_cqe > 0 && attr.max_qp > 0 && attr.max_pd > 0 &&
		      attr.max_mr > 0 && attr.max_srq > 0,
	      "device limits are non-zero",
	      "max_cqe %d max_qp %d max_pd %d max_mr %d max_srq %d",
	      attr.max_cqe, attr.max_qp, attr.max_pd, attr.max_mr,
	      attr.max_srq);

	memset(&attr_ex, 0, sizeof(attr_ex));
	ret = ibv_query_device_ex(ctx, NULL, &attr_ex);
	if (check_ret(ret, 0, "ibv_query_device_ex"))
		check(attr_ex.orig_attr.max_qp_wr == attr.max_qp_wr &&
			      attr_ex.orig_attr.max_sge == attr.max_sge &&
			      attr_ex.orig_attr.max_cqe == attr.max_cqe,
		      "ibv_query_device_ex agrees with ibv_query_device",
		      "max_qp_wr %d/%d max_sge %d/%d max_cqe %d/%d",
		      attr_ex.orig_attr.max_qp_wr, attr.max_qp_wr,
		      attr_ex.orig_attr.max_sge, attr.max_sge,
		      attr_ex.orig_attr.max_cqe, attr.max_cqe);
	/* libibverbs' own query fills phys_port_cnt_ex from the sysfs port
	 * count; rdma-core's tests (test_device.py) compare it with the ports. */
	if (ret == 0)
		check(attr_ex.phys_port_cnt_ex == 1,
		      "ibv_query_device_ex phys_port_cnt_ex is 1",
		      "phys_port_cnt_ex %u", attr_ex.phys_port_cnt_ex);

	ret = ibv_query_port(ctx, 1, &port);
	if (check_ret(ret, 0, "ibv_query_port(1)")) {
		check(port.state == IBV_PORT_ACTIVE, "port 1 is ACTIVE",
		      "state %s", ibv_port_state_str(port.state));
		check(port.link_layer == IBV_LINK_LAYER_ETHERNET,
		      "port 1 link layer is Ethernet", "link_layer %d",
		      port.link_layer);
		check(port.active_mtu >= IBV_MTU_256 &&
			      port.active_mtu <= IBV_MTU_4096 &&
			      port.active_mtu <= port.max_mtu,
		      "port 1 active_mtu is sane", "active_mtu %d max_mtu %d",
		      port.active_mtu, port.max_mtu);
		check(port.gid_tbl_len >= 1, "port 1 gid_tbl_len >= 1",
		      "gid_tbl_len %d", port.gid_tbl_len);
		check(port.pkey_tbl_len >= 1, "port 1 pkey_tbl_len >= 1",
		      "pkey_tbl_len %u", port.pkey_tbl_len);
		/* As siw: speed/width from the netdev (ib_get_eth_speed), active_mtu
		 * from its MTU (ib_mtu_int_to_enum). uiw_<netdev> names it. */
		if (strncmp(want, "uiw_", 4) == 0) {
			const char *nd = want + 4;
			uint8_t speed, width;
			long mbps;
			int mtu;

			eth_speed(nd, &speed, &width, &mbps);
			check(port.active_speed == speed &&
				      port.active_width == width,
			      "port 1 speed/width are the kernel's for the netdev's speed",
			      "%s speed %ld Mb/s: want speed %u width %u, got %u %u",
			      nd, mbps, speed, width, port.active_speed,
			      port.active_width);
			mtu = netdev_mtu_enum(nd);
			check(mtu > 0 && port.active_mtu == (enum ibv_mtu)mtu,
			      "port 1 active_mtu is the netdev MTU's (as siw)",
			      "%s: want %d, got %d", nd, mtu, port.active_mtu);
		} else {
			skip("port 1 speed/width are the kernel's for the netdev's speed",
			     "device name is not uiw_<netdev>");
		}
	}

	ret = ibv_query_gid(ctx, 1, 0, &gid);
	if (check_ret(ret, 0, "ibv_query_gid(1, 0)")) {
		/* uiw_lo is bound to 127.0.0.1; its GID is the IPv4-mapped
		 * address ::ffff:127.0.0.1, which perftest and ibv_rc_pingpong
		 * (-g 0) use to reach the peer. */
		static const uint8_t lo[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
						0xff, 0xff, 127, 0, 0, 1 };

		if (strcmp(want, "uiw_lo") == 0)
			check(memcmp(gid.raw, lo, 16) == 0,
			      "GID 0 of uiw_lo is ::ffff:127.0.0.1",
			      "got %02x%02x:...:%02x%02x:%u.%u.%u.%u",
			      gid.raw[0], gid.raw[1], gid.raw[10], gid.raw[11],
			      gid.raw[12], gid.raw[13], gid.raw[14],
			      gid.raw[15]);
		else
			skip("GID 0 is ::ffff:127.0.0.1", "not uiw_lo");
	}
	/* The GID type: siw's GID cache entries are IB_GID_TYPE_IB on an
	 * Ethernet-link-layer port, which ibv_devinfo prints as "RoCE v1" (its
	 * sysfs gid_attrs/types file reads "IB/RoCE v1"). Through the sysfs path
	 * libibverbs turns that file into IBV_GID_TYPE_ROCE_V1 on an Ethernet
	 * port, through the kernel's ioctl into IBV_GID_TYPE_IB; both are
	 * ibv_devinfo's "RoCE v1", never RoCE v2. */
	{
		struct ibv_gid_entry ge;

		memset(&ge, 0, sizeof(ge));
		ret = ibv_query_gid_ex(ctx, 1, 0, &ge, 0);
		if (check_ret(ret, 0, "ibv_query_gid_ex(1, 0)"))
			check((ge.gid_type == IBV_GID_TYPE_ROCE_V1 ||
			       ge.gid_type == IBV_GID_TYPE_IB) &&
				      memcmp(ge.gid.raw, gid.raw, 16) == 0 &&
				      ge.port_num == 1 && ge.gid_index == 0,
			      "GID 0 type is IB/RoCE v1 (ibv_devinfo: RoCE v1), as siw's",
			      "gid_type %u port %u index %u", ge.gid_type,
			      ge.port_num, ge.gid_index);
	}
	/* Out of range port: libibverbs or the provider must refuse it. */
	ret = ibv_query_port(ctx, 2, &port);
	check(ret != 0, "ibv_query_port(2) fails on a one-port device",
	      "returned 0");

	ret = ibv_query_pkey(ctx, 1, 0, &pkey);
	if (check_ret(ret, 0, "ibv_query_pkey(1, 0)"))
		check(pkey == 0xffff, "pkey 0 is the default 0xffff",
		      "pkey 0x%04x", pkey);

	return ctx;
}

/* ------------------------------------------------------------------------ */
/* Protection domain and memory regions                                      */
/* ------------------------------------------------------------------------ */

static void test_pd_mr(struct ibv_context *ctx)
{
	static const struct {
		int access;
		const char *name;
	} combos[] = {
		{ 0, "ibv_reg_mr access 0 (local read)" },
		{ IBV_ACCESS_LOCAL_WRITE, "ibv_reg_mr LOCAL_WRITE" },
		{ IBV_ACCESS_REMOTE_READ, "ibv_reg_mr REMOTE_READ" },
		{ IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		  "ibv_reg_mr LOCAL_WRITE|REMOTE_WRITE" },
		{ IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			  IBV_ACCESS_REMOTE_READ,
		  "ibv_reg_mr LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ" },
	};
	enum { NCOMBO = sizeof(combos) / sizeof(combos[0]) };
	struct ibv_mr *mrs[NCOMBO] = { 0 };
	const size_t len = 64 * 1024;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	char *buf;
	int i, j, distinct = 1;

	pd = ibv_alloc_pd(ctx);
	if (!check(pd != NULL, "ibv_alloc_pd", "%s", strerror(errno)))
		return;
	check(pd->context == ctx, "pd->context is the context", "%p",
	      (void *)pd->context);

	buf = malloc(len);
	if (!buf) {
		check(0, "malloc MR buffer", "out of memory");
		ibv_dealloc_pd(pd);
		return;
	}
	memset(buf, 0, len);

	for (i = 0; i < NCOMBO; i++) {
		/* Each region covers a different slice, as real programs do. */
		char *addr = buf + i * 4096;
		size_t mlen = len - i * 4096;

		mr = ibv_reg_mr(pd, addr, mlen, combos[i].access);
		if (!check(mr != NULL, combos[i].name, "%s", strerror(errno)))
			continue;
		mrs[i] = mr;
		/* iWARP STag 0 is reserved, so a user MR never gets it. */
		check(mr->addr == addr && mr->length == mlen &&
			      mr->lkey != 0 && mr->rkey != 0 &&
			      mr->pd == pd && mr->context == ctx,
		      "MR echoes addr/length and has lkey/rkey",
		      "addr %p/%p length %zu/%zu lkey 0x%x rkey 0x%x",
		      mr->addr, (void *)addr, mr->length, mlen, mr->lkey,
		      mr->rkey);
	}
	for (i = 0; i < NCOMBO; i++)
		for (j = i + 1; j < NCOMBO; j++)
			if (mrs[i] && mrs[j] && mrs[i]->lkey == mrs[j]->lkey)
				distinct = 0;
	check(distinct, "MRs get distinct lkeys", "two MRs share an lkey");

	/*
	 * The kernel's rule (ib_check_mr_access() in include/rdma/ib_verbs.h):
	 * remote write or remote atomic access without local write access is
	 * refused with EINVAL, because the HCA would write memory the
	 * consumer said it may not write.
	 */
	mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_REMOTE_WRITE);
	check_create_fails(mr, errno, EINVAL,
			   "ibv_reg_mr REMOTE_WRITE without LOCAL_WRITE -> EINVAL");
	if (mr)
		ibv_dereg_mr(mr);
	mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_REMOTE_ATOMIC);
	check_create_fails(mr, errno, EINVAL,
			   "ibv_reg_mr REMOTE_ATOMIC without LOCAL_WRITE -> EINVAL");
	if (mr)
		ibv_dereg_mr(mr);

	for (i = 0; i < NCOMBO; i++) {
		char name[96];

		if (!mrs[i])
			continue;
		snprintf(name, sizeof(name), "ibv_dereg_mr (%s)",
			 combos[i].name + strlen("ibv_reg_mr "));
		check_ret(ibv_dereg_mr(mrs[i]), 0, name);
	}
	/* A PD is deallocated only after every object on it is gone. */
	check_ret(ibv_dealloc_pd(pd), 0, "ibv_dealloc_pd after its MRs");
	free(buf);
}

/* ------------------------------------------------------------------------ */
/* Completion queues                                                         */
/* ------------------------------------------------------------------------ */

static void test_cq(struct ibv_context *ctx, const struct ibv_device_attr *dattr)
{
	struct ibv_cq_init_attr_ex cq_attr = {
		.cqe = 64,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM,
	};
	struct ibv_poll_cq_attr poll_attr = {};
	struct ibv_cq_ex *cqx;
	struct ibv_cq *cq;
	struct ibv_wc wc;
	int ret;

	cq = ibv_create_cq(ctx, 100, NULL, NULL, 0);
	if (check(cq != NULL, "ibv_create_cq(100)", "%s", strerror(errno))) {
		check(cq->cqe >= 100, "CQ cqe rounded to >= requested",
		      "cqe %d", cq->cqe);
		check_ret(ibv_poll_cq(cq, 1, &wc), 0,
			  "ibv_poll_cq on an empty CQ returns 0");
		check_ret(ibv_req_notify_cq(cq, 0), 0, "ibv_req_notify_cq");
		check_ret(ibv_req_notify_cq(cq, 1), 0,
			  "ibv_req_notify_cq solicited_only");
		check_ret(ibv_destroy_cq(cq), 0, "ibv_destroy_cq");
	}

	cqx = ibv_create_cq_ex(ctx, &cq_attr);
	if (check(cqx != NULL, "ibv_create_cq_ex with wc_flags", "%s",
		  strerror(errno))) {
		/* On an empty CQ ibv_start_poll returns ENOENT, and then the
		 * caller must NOT call ibv_end_poll. */
		ret = ibv_start_poll(cqx, &poll_attr);
		check_ret(ret, ENOENT, "ibv_start_poll on an empty CQ -> ENOENT");
		if (ret == 0)
			ibv_end_poll(cqx);
		check_ret(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0,
			  "ibv_destroy_cq of a cq_ex");
	}

	/* siw_create_cq() and rxe_cq_chk_attr() both refuse a CQ larger than
	 * the device's max_cqe with EINVAL. */
	if (dattr->max_cqe < INT_MAX) {
		cq = ibv_create_cq(ctx, dattr->max_cqe + 1, NULL, NULL, 0);
		check_create_fails(cq, errno, EINVAL,
				   "ibv_create_cq(max_cqe + 1) -> EINVAL");
		if (cq)
			ibv_destroy_cq(cq);
	} else {
		skip("ibv_create_cq(max_cqe + 1) -> EINVAL", "max_cqe is INT_MAX");
	}
}

/* ------------------------------------------------------------------------ */
/* Completion channel                                                        */
/* ------------------------------------------------------------------------ */

static void test_comp_channel(struct ibv_context *ctx)
{
	const char *env = getenv("UIW_EXPECT_COMP_CHANNEL");
	int expect = env && strcmp(env, "1") == 0;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	int err;

	/*
	 * libibverbs creates a channel itself, by asking the kernel for a new
	 * fd on cmd_fd; no provider is involved. Without a kernel behind
	 * /dev/infiniband, `uiw run`'s shim answers that request. Without the
	 * shim the call must fail cleanly; the one outcome never acceptable
	 * is a "channel" on fd 0/1/2, where ibv_get_cq_event would read stdin.
	 */
	errno = 0;
	ch = ibv_create_comp_channel(ctx);
	err = errno;
	if (!ch) {
		if (expect)
			check(0, "ibv_create_comp_channel",
			      "failed (%s) but UIW_EXPECT_COMP_CHANNEL=1",
			      strerror(err));
		else
			check(err != 0,
			      "ibv_create_comp_channel fails cleanly without the launcher",
			      "returned NULL with errno 0");
		return;
	}
	if (!check(ch->fd > 2 && fcntl(ch->fd, F_GETFD) != -1,
		   "ibv_create_comp_channel returns a valid fd > 2",
		   "fd %d (%s)", ch->fd,
		   ch->fd <= 2 ? "a standard stream!" : "not open")) {
		/* Do not let ibv_destroy_comp_channel close stdin/out/err. */
		if (ch->fd <= 2)
			return;
	}

	cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	if (check(cq != NULL, "ibv_create_cq on the channel", "%s",
		  strerror(errno))) {
		check(cq->channel == ch, "cq->channel is the channel", "%p",
		      (void *)cq->channel);
		check_ret(ibv_req_notify_cq(cq, 0), 0,
			  "ibv_req_notify_cq on a channel CQ");
		/* Destroy order: CQs first, then their channel. libibverbs
		 * counts the CQs on a channel and refuses with EBUSY. */
		check_ret(ibv_destroy_comp_channel(ch), EBUSY,
			  "ibv_destroy_comp_channel with a CQ on it -> EBUSY");
		check_ret(ibv_destroy_cq(cq), 0, "ibv_destroy_cq of a channel CQ");
	}
	check_ret(ibv_destroy_comp_channel(ch), 0, "ibv_destroy_comp_channel");
}

/* ------------------------------------------------------------------------ */
/* Queue pairs                                                               */
/* ------------------------------------------------------------------------ */

static void check_qp_attrs(struct ibv_qp *qp, enum ibv_qp_state want_state,
			   int want_access, const struct ibv_qp_cap *asked,
			   struct ibv_cq *scq, struct ibv_cq *rcq, const char *when)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	char name[128];
	int ret;

	memset(&attr, 0, sizeof(attr));
	memset(&init, 0, sizeof(init));
	snprintf(name, sizeof(name), "ibv_query_qp %s", when);
	ret = ibv_query_qp(qp, &attr,
			   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS | IBV_QP_CAP,
			   &init);
	if (!check_ret(ret, 0, name))
		return;

	/* iWARP providers report a QP that has not left RESET as INIT: siw keeps
	 * both as its IDLE state and answers INIT (siw_qp_state_to_ib_qp_state;
	 * cxgb4 the same), and rdma-core's tests expect INIT of every RNIC
	 * (698f2ae80). libibverbs copies the answer into qp->state. */
	if (want_state == IBV_QPS_RESET) {
		snprintf(name, sizeof(name),
			 "QP in RESET reports INIT (iWARP, as siw) %s", when);
		check(attr.qp_state == IBV_QPS_INIT &&
			      attr.cur_qp_state == IBV_QPS_INIT &&
			      qp->state == IBV_QPS_INIT,
		      name, "query says %s (cur %s), qp->state %s",
		      qp_state_str(attr.qp_state),
		      qp_state_str(attr.cur_qp_state), qp_state_str(qp->state));
	} else {
		snprintf(name, sizeof(name), "QP state %s %s",
			 qp_state_str(want_state), when);
		check(attr.qp_state == want_state && qp->state == want_state,
		      name, "query says %s, qp->state %s",
		      qp_state_str(attr.qp_state), qp_state_str(qp->state));
	}

	if (want_state != IBV_QPS_RESET) {
		snprintf(name, sizeof(name), "QP access flags, port 1, pkey_index 0 %s",
			 when);
		check(attr.qp_access_flags == (unsigned)want_access &&
			      attr.port_num == 1 && attr.pkey_index == 0,
		      name, "access 0x%x (want 0x%x) port %u pkey_index %u",
		      attr.qp_access_flags, want_access, attr.port_num,
		      attr.pkey_index);
	}

	snprintf(name, sizeof(name), "QP cap >= requested %s", when);
	check(attr.cap.max_send_wr >= asked->max_send_wr &&
		      attr.cap.max_recv_wr >= asked->max_recv_wr &&
		      attr.cap.max_send_sge >= asked->max_send_sge &&
		      attr.cap.max_recv_sge >= asked->max_recv_sge &&
		      attr.cap.max_inline_data >= asked->max_inline_data,
	      name, "send_wr %u recv_wr %u send_sge %u recv_sge %u inline %u",
	      attr.cap.max_send_wr, attr.cap.max_recv_wr, attr.cap.max_send_sge,
	      attr.cap.max_recv_sge, attr.cap.max_inline_data);

	snprintf(name, sizeof(name), "QP init_attr echoes type, CQs and caps %s",
		 when);
	check(init.qp_type == IBV_QPT_RC && init.send_cq == scq &&
		      init.recv_cq == rcq &&
		      init.cap.max_send_wr >= asked->max_send_wr &&
		      init.cap.max_recv_wr >= asked->max_recv_wr &&
		      init.cap.max_inline_data >= asked->max_inline_data,
	      name, "type %d send_cq %p/%p recv_cq %p/%p send_wr %u recv_wr %u",
	      init.qp_type, (void *)init.send_cq, (void *)scq,
	      (void *)init.recv_cq, (void *)rcq, init.cap.max_send_wr,
	      init.cap.max_recv_wr);
}

static void test_qp(struct ibv_context *ctx, const struct ibv_device_attr *dattr)
{
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ;
	struct ibv_qp_init_attr init;
	struct ibv_qp_init_attr_ex init_ex;
	struct ibv_qp_attr attr;
	struct ibv_qp_cap asked = {
		.max_send_wr = 64,
		.max_recv_wr = 64,
		.max_send_sge = 2,
		.max_recv_sge = 2,
		.max_inline_data = 64,
	};
	struct ibv_cq *scq = NULL, *rcq = NULL;
	struct ibv_pd *pd;
	struct ibv_qp *qp, *bad;
	struct ibv_qp_ex *qpx;
	struct ibv_recv_wr rwr, *bad_rwr;
	struct ibv_sge sge;
	struct ibv_mr *mr = NULL;
	struct ibv_wc wc[4];
	char buf[256];
	int n;

	pd = ibv_alloc_pd(ctx);
	scq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	if (!check(pd && scq && rcq, "PD and CQs for the QP tests", "%s",
		   strerror(errno)))
		goto out;
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!check(mr != NULL, "MR for the receive buffers", "%s",
		   strerror(errno)))
		goto out;

	/* --- RC QP, created with ibv_create_qp ------------------------------ */
	memset(&init, 0, sizeof(init));
	init.send_cq = scq;
	init.recv_cq = rcq;
	init.qp_type = IBV_QPT_RC;
	init.sq_sig_all = 0;
	init.cap = asked;
	qp = ibv_create_qp(pd, &init);
	if (!check(qp != NULL, "ibv_create_qp RC", "%s", strerror(errno)))
		goto out;
	/* ibv_create_qp writes the capabilities actually granted back into
	 * init.cap: ibv_rc_pingpong and perftest read max_inline_data there. */
	check(init.cap.max_send_wr >= asked.max_send_wr &&
		      init.cap.max_recv_wr >= asked.max_recv_wr &&
		      init.cap.max_send_sge >= asked.max_send_sge &&
		      init.cap.max_recv_sge >= asked.max_recv_sge &&
		      init.cap.max_inline_data >= asked.max_inline_data,
	      "ibv_create_qp echoes cap >= requested",
	      "send_wr %u recv_wr %u send_sge %u recv_sge %u inline %u",
	      init.cap.max_send_wr, init.cap.max_recv_wr, init.cap.max_send_sge,
	      init.cap.max_recv_sge, init.cap.max_inline_data);
	check(qp->qp_num != 0 && qp->pd == pd && qp->send_cq == scq &&
		      qp->recv_cq == rcq && qp->qp_type == IBV_QPT_RC &&
		      qp->state == IBV_QPS_RESET,
	      "new QP: qp_num set, pd/CQs/type echoed, state RESET",
	      "qp_num %u type %d state %s", qp->qp_num, qp->qp_type,
	      qp_state_str(qp->state));
	check_qp_attrs(qp, IBV_QPS_RESET, 0, &asked, scq, rcq, "after create");

	/*
	 * Receives may be posted before the QP is connected: siw and the
	 * other user-space providers (libsiw, librxe, mlx5) queue them in
	 * RESET as in INIT, and uiw does the same. They stay queued through
	 * RESET -> INIT and are flushed with IBV_WC_WR_FLUSH_ERR when the QP
	 * moves to ERR.
	 */
	sge.addr = (uintptr_t)buf;
	sge.length = 128;
	sge.lkey = mr->lkey;
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 0x1001;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	check_ret(ibv_post_recv(qp, &rwr, &bad_rwr), 0,
		  "ibv_post_recv in RESET is accepted (as siw)");

	/* --- bad transitions and attributes --------------------------------- */
	/* ib_modify_qp_is_ok() (drivers/infiniband/core/verbs.c), used by rxe
	 * and the hardware drivers: RESET may only go to INIT (or RESET/ERR). */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	check_ret(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL,
		  "RESET -> RTR (invalid transition) -> EINVAL");
	/* RESET -> INIT for RC requires PKEY_INDEX, PORT and ACCESS_FLAGS. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	attr.pkey_index = 0;
	attr.qp_access_flags = access;
	check_ret(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
						    IBV_QP_ACCESS_FLAGS),
		  EINVAL, "RESET -> INIT without IBV_QP_PORT -> EINVAL");
	/* modify_qp() in uverbs_cmd.c: rdma_is_port_valid() or EINVAL. */
	attr.port_num = 2;
	check_ret(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
						    IBV_QP_PORT |
						    IBV_QP_ACCESS_FLAGS),
		  EINVAL, "RESET -> INIT with port_num 2 -> EINVAL");
	/* Still RESET inside (shown as INIT): RESET -> RTR stays invalid. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	check_ret(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL,
		  "failed modifies leave the QP in RESET (RTR still refused)");

	/* --- the walk RESET -> INIT -> ERR -> RESET ------------------------- */
	check_ret(qp_to_init(qp, access), 0, "RESET -> INIT");
	check_qp_attrs(qp, IBV_QPS_INIT, access, &asked, scq, rcq, "in INIT");

	rwr.wr_id = 0x1002;
	check_ret(ibv_post_recv(qp, &rwr, &bad_rwr), 0, "ibv_post_recv in INIT");

	check_ret(move_qp(qp, IBV_QPS_ERR), 0, "INIT -> ERR");
	check_qp_attrs(qp, IBV_QPS_ERR, access, &asked, scq, rcq, "in ERR");

	n = poll_n(rcq, wc, 2, 2.0);
	check(n == 2 && wc[0].status == IBV_WC_WR_FLUSH_ERR &&
		      wc[1].status == IBV_WC_WR_FLUSH_ERR &&
		      wc[0].wr_id == 0x1001 && wc[1].wr_id == 0x1002 &&
		      wc[0].qp_num == qp->qp_num,
	      "moving to ERR flushes posted receives in order",
	      "%d completion(s); first status %s wr_id 0x%" PRIx64, n,
	      n > 0 ? ibv_wc_status_str(wc[0].status) : "-",
	      n > 0 ? wc[0].wr_id : 0);
	check_ret(ibv_poll_cq(scq, 1, wc), 0,
		  "nothing on the send CQ (no sends were posted)");

	check_ret(move_qp(qp, IBV_QPS_RESET), 0, "ERR -> RESET");
	check_qp_attrs(qp, IBV_QPS_RESET, access, &asked, scq, rcq,
		       "back in RESET");
	check_ret(qp_to_init(qp, IBV_ACCESS_LOCAL_WRITE), 0,
		  "RESET -> INIT again (a reset QP is reusable)");
	check_qp_attrs(qp, IBV_QPS_INIT, IBV_ACCESS_LOCAL_WRITE, &asked, scq,
		       rcq, "in INIT again");
	check_ret(ibv_destroy_qp(qp), 0, "ibv_destroy_qp");

	/* --- creation limits ----------------------------------------------- */
	/* siw_create_qp(): only RC, with EOPNOTSUPP for anything else. */
	memset(&init, 0, sizeof(init));
	init.send_cq = scq;
	init.recv_cq = rcq;
	init.qp_type = IBV_QPT_UD;
	init.cap = asked;
	init.cap.max_inline_data = 0;
	bad = ibv_create_qp(pd, &init);
	check_create_fails(bad, errno, EOPNOTSUPP,
			   "ibv_create_qp UD -> EOPNOTSUPP (iWARP is RC only)");
	if (bad)
		ibv_destroy_qp(bad);

	/* siw_create_qp(): queue sizes past the device limits -> EINVAL. */
	init.qp_type = IBV_QPT_RC;
	init.cap = asked;
	init.cap.max_send_wr = dattr->max_qp_wr + 1;
	bad = ibv_create_qp(pd, &init);
	check_create_fails(bad, errno, EINVAL,
			   "ibv_create_qp max_send_wr = max_qp_wr + 1 -> EINVAL");
	if (bad)
		ibv_destroy_qp(bad);

	init.cap = asked;
	init.cap.max_send_sge = dattr->max_sge + 1;
	bad = ibv_create_qp(pd, &init);
	check_create_fails(bad, errno, EINVAL,
			   "ibv_create_qp max_send_sge = max_sge + 1 -> EINVAL");
	if (bad)
		ibv_destroy_qp(bad);

	init.cap = asked;
	init.cap.max_send_sge = 1u << 20;
	bad = ibv_create_qp(pd, &init);
	check_create_fails(bad, errno, EINVAL,
			   "ibv_create_qp huge max_send_sge -> EINVAL");
	if (bad)
		ibv_destroy_qp(bad);

	/* --- RC QP, created with ibv_create_qp_ex for the ibv_wr_* API ------ */
	memset(&init_ex, 0, sizeof(init_ex));
	init_ex.send_cq = scq;
	init_ex.recv_cq = rcq;
	init_ex.qp_type = IBV_QPT_RC;
	init_ex.cap = asked;
	init_ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	init_ex.pd = pd;
	init_ex.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
				 IBV_QP_EX_WITH_RDMA_READ;
	qp = ibv_create_qp_ex(ctx, &init_ex);
	if (check(qp != NULL, "ibv_create_qp_ex with PD|SEND_OPS_FLAGS", "%s",
		  strerror(errno))) {
		qpx = ibv_qp_to_qp_ex(qp);
		if (check(qpx != NULL, "ibv_qp_to_qp_ex is non-NULL", "NULL"))
			check(&qpx->qp_base == qp && qpx->wr_start &&
				      qpx->wr_complete && qpx->wr_abort &&
				      qpx->wr_send && qpx->wr_rdma_write &&
				      qpx->wr_rdma_read && qpx->wr_set_sge &&
				      qpx->wr_set_sge_list,
			      "ibv_qp_ex has the ibv_wr_* entry points for the requested ops",
			      "a function pointer is NULL");
		check(init_ex.cap.max_send_wr >= asked.max_send_wr &&
			      init_ex.cap.max_inline_data >= asked.max_inline_data,
		      "ibv_create_qp_ex echoes cap >= requested",
		      "send_wr %u inline %u", init_ex.cap.max_send_wr,
		      init_ex.cap.max_inline_data);
		check_ret(qp_to_init(qp, access), 0, "qp_ex RESET -> INIT");
		check_ret(ibv_destroy_qp(qp), 0, "ibv_destroy_qp of a qp_ex");
	}

out:
	if (mr)
		ibv_dereg_mr(mr);
	if (scq)
		ibv_destroy_cq(scq);
	if (rcq)
		ibv_destroy_cq(rcq);
	if (pd)
		check_ret(ibv_dealloc_pd(pd), 0, "ibv_dealloc_pd after the QP tests");
}

/* ------------------------------------------------------------------------ */
/* Shared receive queues                                                     */
/* ------------------------------------------------------------------------ */

static void test_srq(struct ibv_context *ctx)
{
	struct ibv_srq_init_attr sinit = {
		.attr = { .max_wr = 64, .max_sge = 2, .srq_limit = 0 },
	};
	struct ibv_srq_attr sattr;
	struct ibv_qp_init_attr init;
	struct ibv_recv_wr wr[4], *bad_wr;
	struct ibv_sge sge[4];
	struct ibv_pd *pd;
	struct ibv_cq *cq = NULL;
	struct ibv_mr *mr = NULL;
	struct ibv_srq *srq = NULL;
	struct ibv_qp *qp;
	char buf[4 * 256];
	int i;

	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!check(pd && cq, "PD and CQ for the SRQ tests", "%s",
		   strerror(errno)))
		goto out;
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!check(mr != NULL, "MR for the SRQ buffers", "%s", strerror(errno)))
		goto out;

	srq = ibv_create_srq(pd, &sinit);
	if (!check(srq != NULL, "ibv_create_srq", "%s", strerror(errno)))
		goto out;
	check(sinit.attr.max_wr >= 64 && sinit.attr.max_sge >= 2,
	      "ibv_create_srq echoes max_wr/max_sge >= requested",
	      "max_wr %u max_sge %u", sinit.attr.max_wr, sinit.attr.max_sge);

	memset(&sattr, 0, sizeof(sattr));
	sattr.srq_limit = 8;
	check_ret(ibv_modify_srq(srq, &sattr, IBV_SRQ_LIMIT), 0,
		  "ibv_modify_srq srq_limit 8");
	memset(&sattr, 0, sizeof(sattr));
	if (check_ret(ibv_query_srq(srq, &sattr), 0, "ibv_query_srq"))
		check(sattr.srq_limit == 8 && sattr.max_wr >= 64 &&
			      sattr.max_sge >= 2,
		      "ibv_query_srq reads back limit, max_wr, max_sge",
		      "srq_limit %u max_wr %u max_sge %u", sattr.srq_limit,
		      sattr.max_wr, sattr.max_sge);

	for (i = 0; i < 4; i++) {
		sge[i].addr = (uintptr_t)(buf + i * 256);
		sge[i].length = 256;
		sge[i].lkey = mr->lkey;
		wr[i].wr_id = 0x2000 + i;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = 1;
		wr[i].next = i < 3 ? &wr[i + 1] : NULL;
	}
	bad_wr = NULL;
	check_ret(ibv_post_srq_recv(srq, wr, &bad_wr), 0,
		  "ibv_post_srq_recv of a chain of 4 WRs");

	/* A QP that takes its receives from the SRQ (max_recv_wr is ignored). */
	memset(&init, 0, sizeof(init));
	init.send_cq = cq;
	init.recv_cq = cq;
	init.srq = srq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = 16;
	init.cap.max_send_sge = 1;
	qp = ibv_create_qp(pd, &init);
	if (check(qp != NULL, "ibv_create_qp on the SRQ", "%s",
		  strerror(errno))) {
		check(qp->srq == srq, "qp->srq is the SRQ", "%p",
		      (void *)qp->srq);
		/* Destroy order: QPs using the SRQ first, then the SRQ. */
		check_ret(ibv_destroy_qp(qp), 0, "ibv_destroy_qp of the SRQ QP");
	}

out:
	if (srq)
		check_ret(ibv_destroy_srq(srq), 0, "ibv_destroy_srq");
	if (mr)
		ibv_dereg_mr(mr);
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	const char *want = argc > 1 ? argv[1] : getenv("UIW_DEVICE");
	struct ibv_device **list;
	struct ibv_device_attr dattr;
	struct ibv_context *ctx;
	int num = 0;

	if (!want || !*want)
		want = "uiw_lo";
	printf("# verbs_objects: device %s\n", want);

	list = ibv_get_device_list(&num);
	if (check(list != NULL, "ibv_get_device_list", "%s", strerror(errno))) {
		ctx = open_and_query(list, num, want, &dattr);
		if (ctx) {
			test_pd_mr(ctx);
			test_cq(ctx, &dattr);
			test_comp_channel(ctx);
			test_qp(ctx, &dattr);
			test_srq(ctx);
			check_ret(ibv_close_device(ctx), 0, "ibv_close_device");
		}
		ibv_free_device_list(list);
	}

	printf("%d passed, %d failed\n", n_passed, n_failed);
	return n_failed ? 1 : 0;
}
