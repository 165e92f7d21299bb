/*
 * faults.c — what a surviving RC QP sees when its peer dies or closes.
 *
 * Two processes connect one RC QP each, the way ibv_rc_pingpong does: they
 * exchange QPN, GID, rkey and buffer address over a TCP socket and move their
 * QPs RESET -> INIT -> RTR (ah_attr.is_global = 1, grh.dgid = the peer's GID
 * at index 0, an IPv4-mapped address on iWARP; dest_qp_num = the peer's QPN)
 * -> RTS. Then one side streams RDMA Writes and Sends (with -R also RDMA
 * Reads), keeping its send queue full, and the other keeps receives posted.
 * It links only against -libverbs and runs unchanged on any RC device with a
 * GID (siw, rxe, a RNIC, uiw).
 *
 *   faults -r survivor -m stream|sink -p PORT [options]
 *   faults -r peer     -m stream|sink -p PORT -a kill|error|exit [options] HOST
 *
 * The survivor listens on PORT (it prints "LISTENING <port>" once it does);
 * the peer connects to HOST:PORT. The two must use opposite -m modes.
 * The peer's -a action says how the connection ends:
 *   kill    the peer does nothing special: it streams (or reposts receives)
 *           until somebody sends it SIGKILL (the test harness does, once the
 *           survivor printed "STREAMING")
 *   error   after -k operations the peer moves its own QP to IBV_QPS_ERR,
 *           checks that its own outstanding WRs are flushed, and stays alive
 *           until the survivor is done
 *   exit    after -k operations the peer stops, waits for its outstanding
 *           WRs, destroys its objects and exits normally
 *
 * The survivor checks, in TAP-like form ("ok - ..." / "not ok - ...", then
 * "N passed, N failed"; exit status 1 if any failed):
 *   - every WR it posted completes exactly once, in posting order per queue,
 *     with no successful completion after the first error on a queue; the
 *     ones outstanding when the peer went away complete in error
 *     (IBV_WC_WR_FLUSH_ERR or another error status) — none is lost
 *   - the QP is in IBV_QPS_ERR afterwards (ibv_query_qp)
 *   - the async event IBV_EVENT_QP_FATAL for this QP arrives
 *     (ibv_get_async_event after poll() on the async fd with a timeout);
 *     with -e optional an event is not required, but one that arrives must
 *     be a QP event for this QP
 *   - nothing hangs: it gives up (and fails) -t seconds after the peer went
 *     away if completions are still missing
 * and prints progress lines a harness can time-stamp:
 *   STREAMING                      after -s successful completions
 *   FIRST_ERROR <status>           the first completion in error
 *   LAST_COMPLETION                every posted WR has completed
 *   ASYNC_EVENT <type> ...         the async event
 *   RESULT key=value ...           counts and in-process timings (ms)
 *
 * Options:
 *   -d DEV    device (default uiw_lo, or $UIW_DEVICE)
 *   -g IDX    GID index (default 0)
 *   -s N      successful completions before "STREAMING" (default 200)
 *   -k N      peer: operations before the error/exit action (default 64)
 *   -e required|optional   survivor: the QP_FATAL event (default required)
 *   -R        stream mode: one WR in 8 is an RDMA Read (256 KiB) from the peer,
 *             so Reads are outstanding (awaiting their response) when the
 *             peer goes away
 *   -w        sleep on a completion channel (ibv_req_notify_cq, poll() on the
 *             channel fd, ibv_get_cq_event) instead of busy-polling the CQ;
 *             flushed WRs must then wake the process
 *   -t SEC    survivor: seconds to wait for the flush after the first error,
 *             and for the async event (default 8)
 *   -T SEC    give up if nothing goes wrong for this long (default 30)
 *   -L        survivor: listen on every address, not only 127.0.0.1 (for a peer on
 *             another host, e.g. in another network namespace)
 *
 * Build: cc -O1 -g -Wall -Wextra -Werror -o faults faults.c -libverbs
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* ------------------------------------------------------------------------ */
/* Reporting                                                                 */
/* ------------------------------------------------------------------------ */

static int n_passed, n_failed;
static const char *role_name = "faults";

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

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* A setup step failed: nothing else can be checked. */
static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	printf("not ok - %s setup: ", role_name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n%d passed, %d failed\n", n_passed, n_failed + 1);
	fflush(stdout);
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double ms_between(uint64_t from, uint64_t to)
{
	if (!from || !to)
		return -1.0;
	return to >= from ? (double)(to - from) / 1e6 : -(double)(from - to) / 1e6;
}

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */
/* ------------------------------------------------------------------------ */

enum role { SURVIVOR, PEER };
enum mode { STREAM, SINK };
enum action { ACT_KILL, ACT_ERROR, ACT_EXIT };

struct config {
	enum role role;
	enum mode mode;
	enum action action;
	const char *dev;
	const char *host;
	int port;
	int gid_idx;
	long streaming_after;
	long act_after;
	int event_required;
	int use_events;
	int flush_timeout_s;
	int give_up_s;
	int listen_any;
};

/* Buffer layout (both sides): RDMA Writes land in (and RDMA Reads fetch
 * from) [0, WRITE_AREA); receives are placed in MSG_SIZE slots after it;
 * Sends come from SEND_AREA; RDMA Read responses land in READ_AREA. */
#define BUF_SIZE (8u << 20)
#define WRITE_SIZE (64u << 10)
#define WRITE_AREA (2u << 20)
#define MSG_SIZE 1024u
#define RECV_SLOTS 2048u
#define SEND_AREA (WRITE_AREA + RECV_SLOTS * MSG_SIZE)
#define READ_AREA (SEND_AREA + (1u << 20))
#define READ_SIZE (256u << 10)
#define READ_SLOTS 4u
/* Of every STREAM_CYCLE WRs of the stream, one is a Send, one an RDMA Read
 * (with -R; else an RDMA Write) and the rest RDMA Writes. */
#define STREAM_CYCLE 8
#define SEND_AT 7
#define READ_AT 3
#define WANT_RD_ATOM 16

#define WANT_SQ 512u
#define WANT_RQ 1024u

/* wr_id: kind in the top byte, per-queue sequence number below. */
enum { KIND_WRITE = 1, KIND_SEND = 2, KIND_RECV = 3, KIND_READ = 4 };
#define WRID(kind, seq) (((uint64_t)(kind) << 56) | (uint64_t)(seq))
#define WRID_KIND(id) ((int)((id) >> 56))
#define WRID_SEQ(id) ((id) & ((UINT64_C(1) << 56) - 1))

/* ------------------------------------------------------------------------ */
/* The out-of-band exchange (a TCP socket, as ibv_rc_pingpong)               */
/* ------------------------------------------------------------------------ */

struct dest {
	uint32_t qpn;
	uint32_t psn;
	uint32_t rkey;
	uint64_t addr;
	long pid;
	union ibv_gid gid;
};

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

/* One '\n'-terminated line (without it); -1 on EOF or error. */
static int read_line(int fd, char *buf, size_t size)
{
	size_t n = 0;

	for (;;) {
		char c;
		ssize_t r = read(fd, &c, 1);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		if (c == '\n')
			break;
		if (n + 1 < size)
			buf[n++] = c;
	}
	buf[n] = 0;
	return 0;
}

static void send_dest(int fd, const struct dest *d)
{
	char line[160], gid[33];
	int i;

	for (i = 0; i < 16; i++)
		snprintf(gid + 2 * i, 3, "%02x", d->gid.raw[i]);
	snprintf(line, sizeof line, "%06x %06x %08x %016" PRIx64 " %ld %s\n", d->qpn, d->psn,
		 d->rkey, d->addr, d->pid, gid);
	if (write_all(fd, line, strlen(line)))
		die("sending the QP description to the peer: %s", strerror(errno));
}

static void recv_dest(int fd, struct dest *d)
{
	char line[160], gid[33];
	unsigned qpn, psn, rkey;
	uint64_t addr;
	long pid;
	int i;

	if (read_line(fd, line, sizeof line))
		die("the peer closed the exchange socket before sending its QP description");
	if (sscanf(line, "%x %x %x %" SCNx64 " %ld %32s", &qpn, &psn, &rkey, &addr, &pid, gid) != 6 ||
	    strlen(gid) != 32)
		die("bad QP description from the peer: \"%s\"", line);
	for (i = 0; i < 16; i++) {
		unsigned b;

		if (sscanf(gid + 2 * i, "%2x", &b) != 1)
			die("bad GID from the peer: \"%s\"", gid);
		d->gid.raw[i] = (uint8_t)b;
	}
	d->qpn = qpn;
	d->psn = psn;
	d->rkey = rkey;
	d->addr = addr;
	d->pid = pid;
}

static int listen_on(int port, int any)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		die("socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	a.sin_addr.s_addr = htonl(any ? INADDR_ANY : INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 1))
		die("listen on port %d: %s", port, strerror(errno));
	say("LISTENING %d", port);
	return fd;
}

static int connect_to(const char *host, int port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res, *ai;
	char service[16];
	int fd = -1, tries, err;

	snprintf(service, sizeof service, "%d", port);
	err = getaddrinfo(host, service, &hints, &res);
	if (err)
		die("getaddrinfo %s: %s", host, gai_strerror(err));
	/* The harness starts us once the survivor listens; retry briefly anyway. */
	for (tries = 0; tries < 50 && fd < 0; tries++) {
		for (ai = res; ai && fd < 0; ai = ai->ai_next) {
			fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
			if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
				close(fd);
				fd = -1;
			}
		}
		if (fd < 0)
			usleep(100000);
	}
	freeaddrinfo(res);
	if (fd < 0)
		die("cannot connect to %s:%d", host, port);
	return fd;
}

/* ------------------------------------------------------------------------ */
/* Verbs                                                                     */
/* ------------------------------------------------------------------------ */

struct ctx {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *ch; /* -w: sleep on completion events */
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char *buf;
	uint32_t sq_depth, rq_depth;
	uint8_t ord, ird; /* RDMA Reads outstanding as initiator / responder */
	int reads;        /* -R: the stream has RDMA Reads too */
	struct dest local, remote;
};

static void open_device(struct ctx *c, const struct config *cfg)
{
	struct ibv_device **list;
	struct ibv_device_attr da;
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;
	int i, n, cqe;

	list = ibv_get_device_list(&n);
	if (!list)
		die("ibv_get_device_list: %s", strerror(errno));
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), cfg->dev))
			break;
	if (i == n)
		die("no device %s among %d devices", cfg->dev, n);
	c->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!c->ctx)
		die("ibv_open_device(%s): %s", cfg->dev, strerror(errno));
	if (ibv_query_device(c->ctx, &da))
		die("ibv_query_device: %s", strerror(errno));
	c->sq_depth = (uint32_t)da.max_qp_wr < WANT_SQ ? (uint32_t)da.max_qp_wr : WANT_SQ;
	c->rq_depth = (uint32_t)da.max_qp_wr < WANT_RQ ? (uint32_t)da.max_qp_wr : WANT_RQ;
	c->ord = (uint8_t)(da.max_qp_init_rd_atom < WANT_RD_ATOM ? da.max_qp_init_rd_atom : WANT_RD_ATOM);
	c->ird = (uint8_t)(da.max_qp_rd_atom < WANT_RD_ATOM ? da.max_qp_rd_atom : WANT_RD_ATOM);
	if (!c->ord || !c->ird)
		die("the device supports no RDMA Reads (max_qp_init_rd_atom %d, max_qp_rd_atom %d)",
		    da.max_qp_init_rd_atom, da.max_qp_rd_atom);
	cqe = (int)(c->sq_depth + c->rq_depth + 16);
	if (cqe > da.max_cqe)
		cqe = da.max_cqe;

	c->pd = ibv_alloc_pd(c->ctx);
	if (!c->pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	c->buf = aligned_alloc(4096, BUF_SIZE);
	if (!c->buf)
		die("out of memory");
	memset(c->buf, 0x5a, BUF_SIZE);
	c->mr = ibv_reg_mr(c->pd, c->buf, BUF_SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!c->mr)
		die("ibv_reg_mr: %s", strerror(errno));
	if (cfg->use_events) {
		c->ch = ibv_create_comp_channel(c->ctx);
		if (!c->ch)
			die("ibv_create_comp_channel: %s (run under `uiw run`)", strerror(errno));
	}
	c->cq = ibv_create_cq(c->ctx, cqe, NULL, c->ch, 0);
	if (!c->cq)
		die("ibv_create_cq(%d): %s", cqe, strerror(errno));

	memset(&ia, 0, sizeof ia);
	ia.send_cq = c->cq;
	ia.recv_cq = c->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.sq_sig_all = 1;
	ia.cap.max_send_wr = c->sq_depth;
	ia.cap.max_recv_wr = c->rq_depth;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &ia);
	if (!c->qp)
		die("ibv_create_qp(sq %u, rq %u): %s", c->sq_depth, c->rq_depth, strerror(errno));

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	errno = ibv_modify_qp(c->qp, &a,
			      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (errno)
		die("modify QP to INIT: %s", strerror(errno));

	c->local.qpn = c->qp->qp_num;
	c->local.psn = (uint32_t)(getpid() & 0xffffff);
	c->local.rkey = c->mr->rkey;
	c->local.addr = (uint64_t)(uintptr_t)c->buf;
	c->local.pid = (long)getpid();
	if (ibv_query_gid(c->ctx, 1, cfg->gid_idx, &c->local.gid))
		die("ibv_query_gid(port 1, index %d): %s", cfg->gid_idx, strerror(errno));
}

static void connect_qp(struct ctx *c, const struct config *cfg)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = c->remote.qpn;
	a.rq_psn = c->remote.psn;
	a.max_dest_rd_atomic = c->ird;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = c->remote.gid;
	a.ah_attr.grh.sgid_index = (uint8_t)cfg->gid_idx;
	a.ah_attr.grh.hop_limit = 1;
	errno = ibv_modify_qp(c->qp, &a,
			      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (errno)
		die("modify QP to RTR (dest QPN %#x): %s", c->remote.qpn, strerror(errno));

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = c->local.psn;
	a.max_rd_atomic = c->ord;
	errno = ibv_modify_qp(c->qp, &a,
			      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (errno)
		die("modify QP to RTS: %s", strerror(errno));
}

static int post_recv(struct ctx *c, uint64_t seq)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(c->buf + WRITE_AREA + (seq % RECV_SLOTS) * MSG_SIZE),
		.length = MSG_SIZE,
		.lkey = c->mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = WRID(KIND_RECV, seq), .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(c->qp, &wr, &bad);
}

/* WR number `seq` of the stream: a Send, an RDMA Read (-R) or an RDMA Write. */
static int post_stream(struct ctx *c, uint64_t seq)
{
	int at = (int)(seq % STREAM_CYCLE);
	struct ibv_sge sge = { .lkey = c->mr->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof wr);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (at == READ_AT && c->reads) {
		uint64_t off = (seq / STREAM_CYCLE % READ_SLOTS) * READ_SIZE;

		sge.addr = (uintptr_t)(c->buf + READ_AREA + off);
		sge.length = READ_SIZE;
		wr.opcode = IBV_WR_RDMA_READ;
		wr.wr_id = WRID(KIND_READ, seq);
		wr.wr.rdma.remote_addr = c->remote.addr + (seq * READ_SIZE) % WRITE_AREA;
		wr.wr.rdma.rkey = c->remote.rkey;
	} else if (at == SEND_AT) {
		sge.addr = (uintptr_t)(c->buf + SEND_AREA);
		sge.length = MSG_SIZE;
		wr.opcode = IBV_WR_SEND;
		wr.wr_id = WRID(KIND_SEND, seq);
	} else {
		uint64_t off = (seq * WRITE_SIZE) % WRITE_AREA;

		sge.addr = (uintptr_t)(c->buf + off);
		sge.length = WRITE_SIZE;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr_id = WRID(KIND_WRITE, seq);
		wr.wr.rdma.remote_addr = c->remote.addr + off;
		wr.wr.rdma.rkey = c->remote.rkey;
	}
	return ibv_post_send(c->qp, &wr, &bad);
}

/* ------------------------------------------------------------------------ */
/* Work-queue accounting                                                     */
/* ------------------------------------------------------------------------ */

struct wq {
	const char *name;
	uint64_t posted, completed, ok, errors, flushed;
	uint64_t out_of_order, ok_after_error, foreign;
	uint64_t first_bad_seq, first_bad_expected;
	uint64_t first_error_seq, first_ok_after_error_seq, last_ok_after_error_seq;
	int first_error_kind, first_ok_after_error_kind;
	int first_error_status; /* -1: none yet */
};

struct stats {
	struct wq sq, rq;
	uint64_t t_start, t_streaming, t_detect, t_first_error, t_last_ok, t_last_completion;
	uint64_t outstanding_at_detect;
	uint64_t cq_events, cq_events_after_detect;
	int first_error_status;
	int post_errno;
	int streaming_printed;
};

static void wq_init(struct wq *q, const char *name)
{
	memset(q, 0, sizeof *q);
	q->name = name;
	q->first_error_status = -1;
}

static uint64_t outstanding(const struct stats *s)
{
	return (s->sq.posted - s->sq.completed) + (s->rq.posted - s->rq.completed);
}

/* Mark the moment this side learned that the connection is gone. */
static void detected(struct stats *s)
{
	if (!s->t_detect) {
		s->t_detect = now_ns();
		s->outstanding_at_detect = outstanding(s);
	}
}

static const char *kind_name(int kind)
{
	switch (kind) {
	case KIND_WRITE: return "RDMA Write";
	case KIND_SEND: return "Send";
	case KIND_RECV: return "Receive";
	case KIND_READ: return "RDMA Read";
	default: return "?";
	}
}

/* Account one completion; returns 1 if it was successful. */
static int account(struct stats *s, const struct ibv_wc *wc)
{
	int kind = WRID_KIND(wc->wr_id);
	uint64_t seq = WRID_SEQ(wc->wr_id);
	struct wq *q = kind == KIND_RECV ? &s->rq : &s->sq;

	if (kind < KIND_WRITE || kind > KIND_READ) {
		s->sq.foreign++;
		return 0;
	}
	if (seq != q->completed) {
		if (!q->out_of_order) {
			q->first_bad_seq = seq;
			q->first_bad_expected = q->completed;
		}
		q->out_of_order++;
	}
	q->completed++;
	if (wc->status == IBV_WC_SUCCESS) {
		q->ok++;
		if (q->errors) {
			if (!q->ok_after_error++) {
				q->first_ok_after_error_seq = seq;
				q->first_ok_after_error_kind = kind;
			}
			q->last_ok_after_error_seq = seq;
		}
		s->t_last_ok = now_ns();
		return 1;
	}
	q->errors++;
	if (wc->status == IBV_WC_WR_FLUSH_ERR)
		q->flushed++;
	if (q->first_error_status < 0) {
		q->first_error_status = wc->status;
		q->first_error_seq = seq;
		q->first_error_kind = kind;
	}
	if (!s->t_first_error) {
		s->t_first_error = now_ns();
		s->first_error_status = wc->status;
		detected(s);
		say("FIRST_ERROR status %d (%s) on the %s, wr_id seq %" PRIu64 ", vendor_err %#x",
		    wc->status, ibv_wc_status_str(wc->status), q->name, seq, wc->vendor_err);
	}
	return 0;
}

/* Poll once; returns the number of completions, or dies on a poll error. */
static int poll_some(struct ctx *c, struct stats *s, int *ok_recvs)
{
	struct ibv_wc wc[32];
	int n = ibv_poll_cq(c->cq, 32, wc), i;

	if (n < 0)
		die("ibv_poll_cq returned %d", n);
	for (i = 0; i < n; i++) {
		int ok = account(s, &wc[i]);

		if (ok && WRID_KIND(wc[i].wr_id) == KIND_RECV && ok_recvs)
			(*ok_recvs)++;
	}
	return n;
}

/* With -w, sleep on the completion channel until a completion arrives or
 * `deadline` passes (0 completions then); else the same as poll_some. A
 * provider that does not signal the channel for flushed WRs makes this time
 * out, and the survivor fails instead of hanging. */
static int wait_some(struct ctx *c, const struct config *cfg, struct stats *s, int *ok_recvs,
		     uint64_t deadline)
{
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	int n = poll_some(c, s, ok_recvs);

	if (n || !cfg->use_events)
		return n;
	if (ibv_req_notify_cq(c->cq, 0))
		die("ibv_req_notify_cq failed");
	/* A completion may have arrived before the CQ was armed. */
	n = poll_some(c, s, ok_recvs);
	if (n)
		return n;
	for (;;) {
		struct pollfd pfd = { .fd = c->ch->fd, .events = POLLIN };
		int64_t left_ms = ((int64_t)deadline - (int64_t)now_ns()) / 1000000;
		int r;

		if (left_ms <= 0)
			return 0;
		r = poll(&pfd, 1, (int)left_ms);
		if (r < 0 && errno != EINTR)
			die("poll() on the completion channel: %s", strerror(errno));
		if (r > 0)
			break;
	}
	if (ibv_get_cq_event(c->ch, &ev_cq, &ev_ctx))
		die("ibv_get_cq_event failed after poll() said readable");
	if (ev_cq != c->cq)
		die("completion event for an unknown CQ %p", (void *)ev_cq);
	ibv_ack_cq_events(ev_cq, 1);
	s->cq_events++;
	if (s->t_detect)
		s->cq_events_after_detect++;
	return poll_some(c, s, ok_recvs);
}

static int all_completed(const struct stats *s)
{
	return s->sq.completed >= s->sq.posted && s->rq.completed >= s->rq.posted;
}

/* Wait (bounded) until every posted WR has completed. Returns 1 if so. */
static int drain(struct ctx *c, const struct config *cfg, struct stats *s, int timeout_s)
{
	uint64_t deadline = now_ns() + (uint64_t)timeout_s * 1000000000u;

	while (!all_completed(s)) {
		if (!wait_some(c, cfg, s, NULL, deadline)) {
			if (now_ns() > deadline)
				return 0;
			if (!cfg->use_events)
				usleep(50);
		}
	}
	s->t_last_completion = now_ns();
	return 1;
}

/* Keep the send queue full of the stream (a sink: its receive queue full)
 * until the connection fails, `stop_after` successful operations happened
 * (0: no limit), or `give_up_s` seconds pass. Returns 1 if it ended because
 * of an error. */
static int run_traffic(struct ctx *c, const struct config *cfg, struct stats *s,
		       long stop_after)
{
	uint64_t deadline = now_ns() + (uint64_t)cfg->give_up_s * 1000000000u;
	int ok_recvs = 0;
	long successes;

	for (;;) {
		if (cfg->mode == STREAM) {
			while (s->sq.posted - s->sq.completed < c->sq_depth) {
				int err = post_stream(c, s->sq.posted);

				if (err) {
					s->post_errno = err;
					say("POST_FAILED ibv_post_send: %s", strerror(err));
					detected(s);
					return 1;
				}
				s->sq.posted++;
			}
		} else {
			while (s->rq.posted - s->rq.completed < c->rq_depth) {
				int err = post_recv(c, s->rq.posted);

				if (err) {
					s->post_errno = err;
					say("POST_FAILED ibv_post_recv: %s", strerror(err));
					detected(s);
					return 1;
				}
				s->rq.posted++;
			}
		}
		if (!wait_some(c, cfg, s, &ok_recvs, deadline) && now_ns() >= deadline) {
			say("GAVE_UP after %d s without an error", cfg->give_up_s);
			return 0;
		}
		if (s->t_first_error)
			return 1;
		successes = (long)(cfg->mode == STREAM ? s->sq.ok : s->rq.ok);
		if (!s->streaming_printed && successes >= cfg->streaming_after) {
			s->streaming_printed = 1;
			s->t_streaming = now_ns();
			say("STREAMING %ld successful completions, %" PRIu64 " WRs outstanding",
			    successes, outstanding(s));
		}
		if (stop_after && successes >= stop_after)
			return 0;
	}
}

/* The enum's own names (ibv_event_type_str gives prose). */
static const char *event_name(enum ibv_event_type t)
{
	switch (t) {
	case IBV_EVENT_CQ_ERR: return "IBV_EVENT_CQ_ERR";
	case IBV_EVENT_QP_FATAL: return "IBV_EVENT_QP_FATAL";
	case IBV_EVENT_QP_REQ_ERR: return "IBV_EVENT_QP_REQ_ERR";
	case IBV_EVENT_QP_ACCESS_ERR: return "IBV_EVENT_QP_ACCESS_ERR";
	case IBV_EVENT_COMM_EST: return "IBV_EVENT_COMM_EST";
	case IBV_EVENT_SQ_DRAINED: return "IBV_EVENT_SQ_DRAINED";
	case IBV_EVENT_PATH_MIG: return "IBV_EVENT_PATH_MIG";
	case IBV_EVENT_PATH_MIG_ERR: return "IBV_EVENT_PATH_MIG_ERR";
	case IBV_EVENT_DEVICE_FATAL: return "IBV_EVENT_DEVICE_FATAL";
	case IBV_EVENT_PORT_ACTIVE: return "IBV_EVENT_PORT_ACTIVE";
	case IBV_EVENT_PORT_ERR: return "IBV_EVENT_PORT_ERR";
	case IBV_EVENT_QP_LAST_WQE_REACHED: return "IBV_EVENT_QP_LAST_WQE_REACHED";
	case IBV_EVENT_SRQ_ERR: return "IBV_EVENT_SRQ_ERR";
	case IBV_EVENT_SRQ_LIMIT_REACHED: return "IBV_EVENT_SRQ_LIMIT_REACHED";
	default: return "IBV_EVENT_(other)";
	}
}

/* ------------------------------------------------------------------------ */
/* Survivor                                                                  */
/* ------------------------------------------------------------------------ */

static void check_queue(const struct wq *q, int must_have_errors)
{
	char name[128];

	snprintf(name, sizeof name, "%s: every posted WR completed exactly once (none lost)",
		 q->name);
	check(q->completed == q->posted, name,
	      "%" PRIu64 " posted, %" PRIu64 " completed (%" PRIu64 " ok, %" PRIu64 " in error)",
	      q->posted, q->completed, q->ok, q->errors);
	snprintf(name, sizeof name, "%s: completions in posting order", q->name);
	check(!q->out_of_order, name,
	      "%" PRIu64 " out of order; first: seq %" PRIu64 " where %" PRIu64 " was expected",
	      q->out_of_order, q->first_bad_seq, q->first_bad_expected);
	snprintf(name, sizeof name, "%s: no successful completion after the first error",
		 q->name);
	check(!q->ok_after_error, name,
	      "%" PRIu64 " successful completions after the first error (%s seq %" PRIu64
	      ", status %d): seq %" PRIu64 " (%s) to %" PRIu64,
	      q->ok_after_error, kind_name(q->first_error_kind), q->first_error_seq,
	      q->first_error_status, q->first_ok_after_error_seq,
	      kind_name(q->first_ok_after_error_kind), q->last_ok_after_error_seq);
	if (must_have_errors) {
		snprintf(name, sizeof name, "%s: outstanding WRs completed in error", q->name);
		check(q->errors > 0, name,
		      "%" PRIu64 " posted, all %" PRIu64 " completed successfully", q->posted,
		      q->ok);
	}
}

static void check_async_event(struct ctx *c, const struct config *cfg)
{
	struct pollfd pfd = { .fd = c->ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int timeout_ms = cfg->event_required ? cfg->flush_timeout_s * 1000 : 1000;
	uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
	int got = 0, ours_fatal = 0, r;

	/* Wait up to the timeout for the first event (for QP_FATAL if it is
	 * required), then take whatever else is queued. */
	for (;;) {
		int64_t left_ms = ((int64_t)deadline - (int64_t)now_ns()) / 1000000;
		int wait_ms;

		if (!got || (cfg->event_required && !ours_fatal))
			wait_ms = left_ms > 0 ? (int)left_ms : 0;
		else
			wait_ms = 100;
		r = poll(&pfd, 1, wait_ms);
		if (r <= 0)
			break;
		if (ibv_get_async_event(c->ctx, &ev)) {
			check(0, "ibv_get_async_event", "failed after poll() said readable: %s",
			      strerror(errno));
			break;
		}
		got++;
		switch (ev.event_type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_COMM_EST:
		case IBV_EVENT_SQ_DRAINED:
		case IBV_EVENT_PATH_MIG:
		case IBV_EVENT_PATH_MIG_ERR:
		case IBV_EVENT_QP_LAST_WQE_REACHED:
			say("ASYNC_EVENT %s (%d) for %s QP", event_name(ev.event_type),
			    ev.event_type, ev.element.qp == c->qp ? "this" : "ANOTHER");
			check(ev.element.qp == c->qp, "the async event names this QP",
			      "event %s for QP %p, ours is %p", event_name(ev.event_type),
			      (void *)ev.element.qp, (void *)c->qp);
			if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == c->qp)
				ours_fatal = 1;
			break;
		default:
			say("ASYNC_EVENT %s (%d)", event_name(ev.event_type), ev.event_type);
			check(0, "no async event other than for the QP", "got %s",
			      event_name(ev.event_type));
			break;
		}
		ibv_ack_async_event(&ev);
	}
	if (r < 0)
		check(0, "poll() on the async fd", "%s", strerror(errno));
	if (!got)
		say("ASYNC_EVENT none within %d ms", timeout_ms);
	if (cfg->event_required)
		check(ours_fatal, "async event IBV_EVENT_QP_FATAL for this QP",
		      got ? "other events only (see the ASYNC_EVENT lines)"
			  : "no async event within %d ms", timeout_ms);
}

static void run_survivor(struct ctx *c, const struct config *cfg, int sock)
{
	struct stats s;
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	uint64_t i, rq_initial;
	char line[16];
	int flushed_all;

	memset(&s, 0, sizeof s);
	wq_init(&s.sq, "send queue");
	wq_init(&s.rq, "receive queue");
	s.first_error_status = -1;

	/* A sink fills its receive queue before the peer may start; a
	 * streaming survivor keeps a few receives posted too (the peer never
	 * sends, so they are all outstanding when it goes away). */
	rq_initial = cfg->mode == STREAM ? 64 : c->rq_depth;
	for (i = 0; i < rq_initial; i++) {
		errno = post_recv(c, s.rq.posted);
		if (errno)
			die("ibv_post_recv: %s", strerror(errno));
		s.rq.posted++;
	}

	/* Exchange as ibv_rc_pingpong's server: read the peer, connect, answer. */
	recv_dest(sock, &c->remote);
	connect_qp(c, cfg);
	send_dest(sock, &c->local);
	if (read_line(sock, line, sizeof line) || strcmp(line, "RTS"))
		die("the peer did not report RTS");
	say("CONNECTED local QPN %#x, peer QPN %#x (pid %ld)", c->local.qpn, c->remote.qpn,
	    c->remote.pid);
	if (cfg->mode == SINK && write_all(sock, "GO\n", 3))
		die("telling the peer to start: %s", strerror(errno));

	s.t_start = now_ns();
	run_traffic(c, cfg, &s, 0);
	if (!s.t_detect)
		detected(&s);
	say("DETECTED %" PRIu64 " WRs outstanding (%" PRIu64 " send, %" PRIu64 " receive)",
	    s.outstanding_at_detect, s.sq.posted - s.sq.completed, s.rq.posted - s.rq.completed);
	flushed_all = drain(c, cfg, &s, cfg->flush_timeout_s);
	if (flushed_all)
		say("LAST_COMPLETION");
	else
		say("NOT_ALL_COMPLETED after %d s: %" PRIu64 " WRs missing", cfg->flush_timeout_s,
		    outstanding(&s));

	check(s.streaming_printed, "traffic flowed before the peer went away",
	      "only %" PRIu64 " send and %" PRIu64 " receive completions succeeded", s.sq.ok,
	      s.rq.ok);
	check(s.t_first_error != 0 || s.post_errno != 0, "the survivor noticed the peer going away",
	      "no error completion and no failed post within %d s", cfg->give_up_s);
	check(s.outstanding_at_detect > 0, "WRs were outstanding when it noticed",
	      "none outstanding");
	check(flushed_all, "every outstanding WR completed (no hang)",
	      "%" PRIu64 " WRs still outstanding after %d s", outstanding(&s),
	      cfg->flush_timeout_s);
	check_queue(&s.sq, cfg->mode == STREAM);
	check_queue(&s.rq, 1);
	check(!s.sq.foreign, "no completion with a wr_id never posted", "%" PRIu64 " of them",
	      s.sq.foreign);

	memset(&a, 0, sizeof a);
	errno = ibv_query_qp(c->qp, &a, IBV_QP_STATE, &ia);
	if (check(!errno, "ibv_query_qp", "%s", strerror(errno)))
		check(a.qp_state == IBV_QPS_ERR, "QP is in IBV_QPS_ERR", "qp_state %d",
		      a.qp_state);

	check_async_event(c, cfg);

	say("RESULT sq_posted=%" PRIu64 " sq_ok=%" PRIu64 " sq_err=%" PRIu64 " sq_flushed=%" PRIu64
	    " rq_posted=%" PRIu64 " rq_ok=%" PRIu64 " rq_err=%" PRIu64 " rq_flushed=%" PRIu64
	    " outstanding_at_detect=%" PRIu64 " first_error_status=%d",
	    s.sq.posted, s.sq.ok, s.sq.errors, s.sq.flushed, s.rq.posted, s.rq.ok, s.rq.errors,
	    s.rq.flushed, s.outstanding_at_detect, s.first_error_status);
	say("RESULT detect_to_last_ms=%.3f last_ok_to_last_ms=%.3f streaming_to_detect_ms=%.3f",
	    ms_between(s.t_detect, s.t_last_completion), ms_between(s.t_last_ok, s.t_last_completion),
	    ms_between(s.t_streaming, s.t_detect));
	if (cfg->use_events)
		say("RESULT cq_events=%" PRIu64 " cq_events_after_detect=%" PRIu64, s.cq_events,
		    s.cq_events_after_detect);

	/* Tell a peer that is still alive (error action) that we are done. */
	write_all(sock, "DONE\n", 5);
}

/* ------------------------------------------------------------------------ */
/* Peer                                                                      */
/* ------------------------------------------------------------------------ */

static void run_peer(struct ctx *c, const struct config *cfg, int sock)
{
	struct stats s;
	char line[16];
	uint64_t i;

	memset(&s, 0, sizeof s);
	wq_init(&s.sq, "peer send queue");
	wq_init(&s.rq, "peer receive queue");
	s.first_error_status = -1;

	if (cfg->mode == SINK) {
		for (i = 0; i < c->rq_depth; i++) {
			errno = post_recv(c, s.rq.posted);
			if (errno)
				die("ibv_post_recv: %s", strerror(errno));
			s.rq.posted++;
		}
	}
	/* As ibv_rc_pingpong's client: send ours, read theirs, connect. */
	send_dest(sock, &c->local);
	recv_dest(sock, &c->remote);
	connect_qp(c, cfg);
	if (write_all(sock, "RTS\n", 4))
		die("reporting RTS: %s", strerror(errno));
	/* A streaming peer starts once the survivor's receives are posted. */
	if (cfg->mode == STREAM && (read_line(sock, line, sizeof line) || strcmp(line, "GO")))
		die("the survivor did not say GO");
	say("CONNECTED local QPN %#x, peer QPN %#x", c->local.qpn, c->remote.qpn);

	if (cfg->action == ACT_KILL) {
		run_traffic(c, cfg, &s, 0);
		/* Only reached if the survivor went away first, or nobody killed us. */
		say("PEER_NOT_KILLED");
		check(0, "the peer was killed", "it was not (first error %s)",
		      s.first_error_status >= 0
			      ? ibv_wc_status_str((enum ibv_wc_status)s.first_error_status)
			      : "none");
		return;
	}

	if (run_traffic(c, cfg, &s, cfg->act_after))
		check(0, "peer traffic before its action", "failed early: %s",
		      s.first_error_status >= 0
			      ? ibv_wc_status_str((enum ibv_wc_status)s.first_error_status)
			      : strerror(s.post_errno));
	if (cfg->action == ACT_EXIT) {
		/* Stop posting, let what is outstanding finish, leave normally. */
		if (cfg->mode == STREAM)
			check(drain(c, cfg, &s, cfg->flush_timeout_s),
			      "peer: outstanding sends completed before exit",
			      "%" PRIu64 " missing", s.sq.posted - s.sq.completed);
		say("PEER_EXITING");
		return;
	}
	/* ACT_ERROR: move our own QP to ERR; our outstanding WRs must flush. */
	{
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

		errno = ibv_modify_qp(c->qp, &a, IBV_QP_STATE);
		check(!errno, "peer: modify own QP to IBV_QPS_ERR", "%s", strerror(errno));
		say("PEER_QP_ERROR");
		check(drain(c, cfg, &s, cfg->flush_timeout_s), "peer: own outstanding WRs flushed",
		      "%" PRIu64 " missing", outstanding(&s));
	}
	/* Stay alive (connection state is the QP's business now) until the
	 * survivor has made its checks. */
	if (read_line(sock, line, sizeof line))
		say("PEER_SURVIVOR_GONE");
}

/* ------------------------------------------------------------------------ */
/* main                                                                      */
/* ------------------------------------------------------------------------ */

static void usage(void)
{
	fprintf(stderr,
		"usage: faults -r survivor -m stream|sink -p PORT [options]\n"
		"       faults -r peer -m stream|sink -p PORT -a kill|error|exit [options] HOST\n"
		"options: -d DEV -g GIDX -s N -k N -e required|optional -w -R -t SEC -T SEC -L\n");
	exit(2);
}

static void destroy(struct ctx *c, int checked)
{
	int e;

	e = ibv_destroy_qp(c->qp);
	if (checked)
		check(!e, "ibv_destroy_qp", "%s", strerror(e));
	e = ibv_destroy_cq(c->cq);
	if (checked)
		check(!e, "ibv_destroy_cq", "%s", strerror(e));
	if (c->ch) {
		e = ibv_destroy_comp_channel(c->ch);
		if (checked)
			check(!e, "ibv_destroy_comp_channel", "%s", strerror(e ? errno : 0));
	}
	e = ibv_dereg_mr(c->mr);
	if (checked)
		check(!e, "ibv_dereg_mr", "%s", strerror(e));
	e = ibv_dealloc_pd(c->pd);
	if (checked)
		check(!e, "ibv_dealloc_pd", "%s", strerror(e));
	e = ibv_close_device(c->ctx);
	if (checked)
		check(!e, "ibv_close_device", "%s", strerror(errno));
	free(c->buf);
}

int main(int argc, char **argv)
{
	struct config cfg = {
		.role = SURVIVOR,
		.mode = STREAM,
		.action = ACT_KILL,
		.dev = getenv("UIW_DEVICE") ? getenv("UIW_DEVICE") : "uiw_lo",
		.port = 0,
		.gid_idx = 0,
		.streaming_after = 200,
		.act_after = 64,
		.event_required = 1,
		.flush_timeout_s = 8,
		.give_up_s = 30,
	};
	struct ctx c;
	int opt, sock, have_mode = 0, have_role = 0;

	memset(&c, 0, sizeof c);
	while ((opt = getopt(argc, argv, "r:m:a:d:p:g:s:k:e:wRt:T:L")) != -1) {
		switch (opt) {
		case 'r':
			have_role = 1;
			if (!strcmp(optarg, "survivor"))
				cfg.role = SURVIVOR;
			else if (!strcmp(optarg, "peer"))
				cfg.role = PEER;
			else
				usage();
			break;
		case 'm':
			have_mode = 1;
			if (!strcmp(optarg, "stream"))
				cfg.mode = STREAM;
			else if (!strcmp(optarg, "sink"))
				cfg.mode = SINK;
			else
				usage();
			break;
		case 'a':
			if (!strcmp(optarg, "kill"))
				cfg.action = ACT_KILL;
			else if (!strcmp(optarg, "error"))
				cfg.action = ACT_ERROR;
			else if (!strcmp(optarg, "exit"))
				cfg.action = ACT_EXIT;
			else
				usage();
			break;
		case 'd':
			cfg.dev = optarg;
			break;
		case 'p':
			cfg.port = atoi(optarg);
			break;
		case 'g':
			cfg.gid_idx = atoi(optarg);
			break;
		case 's':
			cfg.streaming_after = atol(optarg);
			break;
		case 'k':
			cfg.act_after = atol(optarg);
			break;
		case 'e':
			if (!strcmp(optarg, "required"))
				cfg.event_required = 1;
			else if (!strcmp(optarg, "optional"))
				cfg.event_required = 0;
			else
				usage();
			break;
		case 'w':
			cfg.use_events = 1;
			break;
		case 'R':
			c.reads = 1;
			break;
		case 't':
			cfg.flush_timeout_s = atoi(optarg);
			break;
		case 'T':
			cfg.give_up_s = atoi(optarg);
			break;
		case 'L':
			cfg.listen_any = 1;
			break;
		default:
			usage();
		}
	}
	if (!have_role || !have_mode || cfg.port <= 0 || cfg.port > 65535)
		usage();
	if (cfg.role == PEER) {
		if (optind != argc - 1)
			usage();
		cfg.host = argv[optind];
		role_name = "peer";
	} else {
		if (optind != argc)
			usage();
		role_name = "survivor";
	}
	/* SIGPIPE keeps its default action on purpose: a provider that writes to
	 * a dead peer's socket without MSG_NOSIGNAL kills the survivor, and the
	 * test must see that. Our own socket writes use MSG_NOSIGNAL. */

	if (cfg.role == SURVIVOR) {
		int lfd = listen_on(cfg.port, cfg.listen_any);

		open_device(&c, &cfg);
		sock = accept(lfd, NULL, NULL);
		if (sock < 0)
			die("accept: %s", strerror(errno));
		close(lfd);
		run_survivor(&c, &cfg, sock);
	} else {
		open_device(&c, &cfg);
		sock = connect_to(cfg.host, cfg.port);
		run_peer(&c, &cfg, sock);
	}
	destroy(&c, cfg.role == SURVIVOR);
	close(sock);
	printf("%d passed, %d failed\n", n_passed, n_failed);
	return n_failed ? 1 : 0;
}
