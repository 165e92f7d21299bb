/*
 * cm_check: rdma_cm behaviour checks for the uiw librdmacm drop-in, written against the
 * installed <rdma/rdma_cma.h> only (it runs unchanged against rdma-core's librdmacm).
 *
 *   cm_check [-p PORT] [-a OTHER_IP] MODE
 *
 * MODE: channel   event channel, ids, addresses, routes, QPs, options, bad input
 *       nolistener connect to a port nobody listens on (the kernel's iWARP answer)
 *       pdata      private data both ways, IRD/ORD, a Send each way, disconnect
 *       reject     reject with private data
 *       many       64 simultaneous connects to one listener, requested in the order of the calls
 *       forward    ids on addresses no uiw device holds go to the system librdmacm
 *                  (run with UIW_SYSTEM_RDMACM=libfake_system_rdmacm.so; -a: such an
 *                  address, local and not loopback)
 *
 * Output is TAP-like: "ok - ..." / "not ok - ...", then "N passed, N failed".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static int passed, failed;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static int check(int cond, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&out_lock);
	printf(cond ? "ok - " : "not ok - ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	if (!cond)
		printf(" (errno %d %s)", errno, strerror(errno));
	printf("\n");
	fflush(stdout);
	if (cond)
		passed++;
	else
		failed++;
	pthread_mutex_unlock(&out_lock);
	return cond;
}

static int port = 20886;
/* forward mode: a local address no uiw device holds (not a loopback one: those go to the
 * first uiw device, as the kernel's cma_bind_loopback does) */
static const char *other_ip = "192.0.2.2";

static struct sockaddr_in sin_of(const char *ip, int p)
{
	struct sockaddr_in s = { .sin_family = AF_INET, .sin_port = htons(p) };

	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

/* Wait up to ms for an event on channel; NULL on timeout. */
static struct rdma_cm_event *get_event(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e = NULL;

	if (poll(&p, 1, ms) != 1)
		return NULL;
	if (rdma_get_cm_event(ch, &e))
		return NULL;
	return e;
}

/* Get one event and check its type; acks it unless keep. */
static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type t, struct rdma_cm_event **keep,
		  const char *what)
{
	struct rdma_cm_event *e = get_event(ch, 10000);
	int ok = e && e->event == t;

	check(ok, "%s: %s (got %s, status %d)", what, rdma_event_str(t), e ? rdma_event_str(e->event) : "nothing",
	      e ? e->status : 0);
	if (e && keep && ok)
		*keep = e;
	else if (e)
		rdma_ack_cm_event(e);
	return ok;
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	return a;
}

static int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i))
		return -1;
	return a.qp_state;
}

/* ---- channel: no connection needed ---------------------------------------------------- */

static void *ack_later(void *arg)
{
	usleep(200 * 1000);
	rdma_ack_cm_event(arg);
	return NULL;
}

static void mode_channel(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL, *id2 = NULL;
	struct rdma_cm_event *e = NULL;
	struct sockaddr_in dst = sin_of("127.0.0.1", port), src;
	int fl, n = 0, r;

	check(ch != NULL, "rdma_create_event_channel");
	if (!ch)
		return;
	check(ch->fd > 2, "channel fd %d is not stdio", ch->fd);
	check(fcntl(ch->fd, F_GETFD) & FD_CLOEXEC, "channel fd is close-on-exec");

	fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	errno = 0;
	r = rdma_get_cm_event(ch, &e);
	check(r == -1 && errno == EAGAIN, "non-blocking channel without events: -1/EAGAIN");
	fcntl(ch->fd, F_SETFL, fl);

	check(rdma_create_id(ch, &id, (void *)0x1234, RDMA_PS_TCP) == 0 && id, "rdma_create_id");
	check(id->channel == ch && id->context == (void *)0x1234 && id->ps == RDMA_PS_TCP &&
		      id->qp_type == IBV_QPT_RC && !id->verbs,
	      "new id: channel, context, ps, qp_type, no device yet");

	check(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr 127.0.0.1");
	{
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		check(poll(&p, 1, 5000) == 1 && (p.revents & POLLIN), "channel fd becomes readable");
	}
	if (expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, &e, "resolve_addr")) {
		check(e->id == id && e->status == 0 && e->listen_id == NULL, "ADDR_RESOLVED names the id, status 0");
		check(id->verbs != NULL && id->pd != NULL && id->port_num == 1, "id bound to a device, with a PD, port 1");
		check(id->verbs && strncmp(ibv_get_device_name(id->verbs->device), "uiw_", 4) == 0,
		      "device is uiw's (%s)", id->verbs ? ibv_get_device_name(id->verbs->device) : "-");
		check(rdma_get_local_addr(id)->sa_family == AF_INET &&
			      ((struct sockaddr_in *)rdma_get_local_addr(id))->sin_addr.s_addr == htonl(0x7f000001),
		      "source address 127.0.0.1");
		check(rdma_get_src_port(id) != 0, "source port assigned (%u)", ntohs(rdma_get_src_port(id)));
		check(rdma_get_dst_port(id) == htons(port), "destination port");
		{
			struct pollfd p = { .fd = ch->fd, .events = POLLIN };
			check(poll(&p, 1, 0) == 0, "fd not readable once the queue is empty");
		}
		check(rdma_ack_cm_event(e) == 0, "rdma_ack_cm_event");
	}
	check(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, "resolve_route");

	{
		struct ibv_qp_init_attr a = qp_attr();
		check(rdma_create_qp(id, NULL, &a) == 0 && id->qp, "rdma_create_qp with the id's PD and new CQs");
		if (id->qp) {
			check(qp_state(id->qp) == IBV_QPS_INIT, "QP in INIT, as the kernel's ucma leaves it");
			check(id->send_cq && id->recv_cq && id->send_cq_channel && id->recv_cq_channel,
			      "CQs and completion channels created");
			rdma_destroy_qp(id);
			check(id->qp == NULL && id->send_cq == NULL, "rdma_destroy_qp clears the QP and CQs");
		}
	}
	{
		struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT };
		int mask = 0;
		check(rdma_init_qp_attr(id, &qa, &mask) == 0 && (mask & IBV_QP_STATE) && (mask & IBV_QP_ACCESS_FLAGS) &&
			      (qa.qp_access_flags & IBV_ACCESS_REMOTE_WRITE),
		      "rdma_init_qp_attr(INIT)");
	}

	/* Destroying an id waits for its events to be acknowledged. */
	check(rdma_create_id(ch, &id2, NULL, RDMA_PS_TCP) == 0, "second id");
	rdma_resolve_addr(id2, NULL, (struct sockaddr *)&dst, 2000);
	e = get_event(ch, 5000);
	check(e && e->id == id2, "event for the second id");
	if (e) {
		pthread_t t;
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		pthread_create(&t, NULL, ack_later, e);
		check(rdma_destroy_id(id2) == 0, "rdma_destroy_id with an unacked event");
		clock_gettime(CLOCK_MONOTONIC, &b);
		check((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 >= 150,
		      "... returned only after the event was acked");
		pthread_join(t, NULL);
	}
	/* Queued, undelivered events die with their id. */
	check(rdma_create_id(ch, &id2, NULL, RDMA_PS_TCP) == 0, "third id");
	rdma_resolve_addr(id2, NULL, (struct sockaddr *)&dst, 2000);
	usleep(100 * 1000);
	check(rdma_destroy_id(id2) == 0, "destroy with an undelivered event does not block");
	{
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		check(poll(&p, 1, 100) == 0, "... and its event is gone from the channel");
	}

	/* Migration to a new channel and to no channel (synchronous). */
	{
		struct rdma_event_channel *ch2 = rdma_create_event_channel();
		struct rdma_cm_id *m = NULL;
		rdma_create_id(ch, &m, NULL, RDMA_PS_TCP);
		rdma_resolve_addr(m, NULL, (struct sockaddr *)&dst, 2000);
		usleep(100 * 1000);
		check(rdma_migrate_id(m, ch2) == 0 && m->channel == ch2, "rdma_migrate_id");
		e = get_event(ch2, 2000);
		check(e && e->id == m && e->event == RDMA_CM_EVENT_ADDR_RESOLVED, "queued event moved to the new channel");
		if (e)
			rdma_ack_cm_event(e);
		check(rdma_migrate_id(m, NULL) == 0, "migrate to synchronous");
		check(rdma_resolve_route(m, 2000) == 0 && m->event && m->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED,
		      "synchronous resolve_route returns with id->event set");
		check(rdma_destroy_id(m) == 0, "destroy synchronous id");
		rdma_destroy_event_channel(ch2);
	}

	/* bind + options */
	{
		struct rdma_cm_id *b = NULL;
		int one = 1;
		uint8_t tos = 0;
		src = sin_of("127.0.0.1", 0);
		rdma_create_id(ch, &b, NULL, RDMA_PS_TCP);
		check(rdma_set_option(b, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0,
		      "set REUSEADDR");
		errno = 0;
		check(rdma_set_option(b, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, 1) == -1 && errno == EINVAL,
		      "option with a wrong length: EINVAL");
		check(rdma_set_option(b, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0, "TOS accepted (ignored)");
		check(rdma_bind_addr(b, (struct sockaddr *)&src) == 0, "rdma_bind_addr 127.0.0.1:0");
		check(b->verbs != NULL && rdma_get_src_port(b) != 0, "bound to uiw device, port %u",
		      ntohs(rdma_get_src_port(b)));
		errno = 0;
		check(rdma_bind_addr(b, (struct sockaddr *)&src) == -1 && errno == EINVAL, "second bind: EINVAL");
		check(rdma_listen(b, 8) == 0, "rdma_listen");
		rdma_destroy_id(b);
	}

	/* Bad input: errors, no crash. */
	errno = 0;
	check(rdma_destroy_id((struct rdma_cm_id *)&n) == -1 && errno == EINVAL, "destroy of a non-id: EINVAL");
	errno = 0;
	check(rdma_ack_cm_event((struct rdma_cm_event *)&n) == -1 && errno == EINVAL, "ack of a non-event: EINVAL");
	errno = 0;
	check(rdma_get_cm_event(ch, NULL) == -1 && errno == EINVAL, "get_cm_event(NULL): EINVAL");
	errno = 0;
	check(rdma_resolve_addr(id, NULL, NULL, 100) == -1 && errno == EINVAL, "resolve_addr(NULL dst): EINVAL");
	errno = 0;
	check(rdma_connect(id, NULL) == -1 && errno == EINVAL, "connect without a QP: EINVAL");
	check(strcmp(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT") == 0 &&
		      strcmp(rdma_event_str(1000), "UNKNOWN EVENT") == 0,
	      "rdma_event_str");

	{
		struct ibv_context **l = rdma_get_devices(&n);
		int found = 0;
		for (int i = 0; l && l[i]; i++)
			found |= strncmp(ibv_get_device_name(l[i]->device), "uiw_", 4) == 0;
		check(l && n >= 1 && found, "rdma_get_devices lists the uiw device (%d devices)", n);
		rdma_free_devices(l);
	}
	{
		struct rdma_addrinfo h = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *res = NULL;
		char ps[16];
		snprintf(ps, sizeof ps, "%d", port);
		check(rdma_getaddrinfo("127.0.0.1", ps, &h, &res) == 0 && res && res->ai_src_addr &&
			      res->ai_src_len == sizeof(struct sockaddr_in) && res->ai_qp_type == IBV_QPT_RC &&
			      (res->ai_flags & RAI_PASSIVE),
		      "rdma_getaddrinfo passive");
		rdma_freeaddrinfo(res);
		res = NULL;
		h.ai_flags = 0;
		check(rdma_getaddrinfo("127.0.0.1", ps, &h, &res) == 0 && res && res->ai_dst_addr &&
			      ((struct sockaddr_in *)res->ai_dst_addr)->sin_port == htons(port),
		      "rdma_getaddrinfo active");
		rdma_freeaddrinfo(res);
	}

	check(rdma_destroy_id(id) == 0, "rdma_destroy_id");
	rdma_destroy_event_channel(ch);
}

/* ---- nolistener ---------------------------------------------------------------------- */

/* An id with address, route and QP resolved towards 127.0.0.1:p. */
static struct rdma_cm_id *client_id(struct rdma_event_channel *ch, int p, void *ctx)
{
	struct rdma_cm_id *id = NULL;
	struct sockaddr_in dst = sin_of("127.0.0.1", p);
	struct ibv_qp_init_attr a = qp_attr();

	if (rdma_create_id(ch, &id, ctx, RDMA_PS_TCP) || rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000))
		return NULL;
	if (!expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, "client") || rdma_resolve_route(id, 2000) ||
	    !expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, "client") || rdma_create_qp(id, NULL, &a))
		return NULL;
	return id;
}

static void mode_nolistener(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = client_id(ch, port, NULL);
	struct rdma_cm_event *e = NULL;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7 };

	check(id != NULL, "client id towards a port without listener");
	if (!id)
		return;
	check(rdma_connect(id, &cp) == 0, "rdma_connect returns 0 (the answer is an event)");
	e = get_event(ch, 10000);
	/* cma_iw_handler: IW_CM_EVENT_CONNECT_REPLY with -ECONNREFUSED -> REJECTED, status -ECONNREFUSED */
	check(e && e->event == RDMA_CM_EVENT_REJECTED && e->status == -ECONNREFUSED,
	      "REJECTED with status -ECONNREFUSED (got %s, %d)", e ? rdma_event_str(e->event) : "nothing",
	      e ? e->status : 0);
	check(e && e->param.conn.private_data_len == 0, "... and no private data");
	check(qp_state(id->qp) == IBV_QPS_ERR, "QP moved to ERROR");
	if (e)
		rdma_ack_cm_event(e);
	errno = 0;
	check(rdma_disconnect(id) == -1 && errno == EINVAL, "disconnect of a never-connected id: EINVAL");
	rdma_destroy_qp(id);
	check(rdma_destroy_id(id) == 0, "destroy");
	rdma_destroy_event_channel(ch);
}

/* ---- connections: a listener thread ---------------------------------------------------- */

static const char cli_pd[] = "uiw client private data: 0123456789abcdef0123456789abcdef!";
static const char srv_pd[] = "uiw server reply: private data back";
static const char rej_pd[] = "uiw says no";

struct server {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen;
	int mode;  /* 0 accept, 1 reject */
	int expect_conns;
	int established, disconnected, requests, pd_ok, depth_ok;
	int zero_depth; /* depth0 mode: IRD/ORD 0 offered by the client and accepted as 0 */
	/* many mode: the client's index (the byte after cli_pd) of each request, in arrival order */
	int order[128];
	struct rdma_cm_id *conns[128];
	int nconns;
	struct ibv_mr *mr;
	char buf[64];
	int recv_ok;
};

static void *server_thread(void *arg)
{
	struct server *s = arg;
	struct rdma_cm_event *e;
	int done = 0;

	while (!done && (e = get_event(s->ch, 20000))) {
		struct rdma_cm_id *id = e->id;
		switch (e->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			s->requests++;
			if (e->listen_id == s->listen && e->param.conn.private_data_len >= sizeof cli_pd &&
			    memcmp(e->param.conn.private_data, cli_pd, sizeof cli_pd) == 0)
				s->pd_ok++;
			if (s->requests <= (int)(sizeof s->order / sizeof s->order[0]))
				s->order[s->requests - 1] = e->param.conn.private_data_len > sizeof cli_pd
					? ((const unsigned char *)e->param.conn.private_data)[sizeof cli_pd] : -1;
			if (s->zero_depth ? e->param.conn.initiator_depth == 0 && e->param.conn.responder_resources == 0
					  : e->param.conn.initiator_depth >= 1 && e->param.conn.responder_resources >= 1)
				s->depth_ok++;
			if (s->mode == 1) {
				rdma_reject(id, rej_pd, sizeof rej_pd);
				rdma_ack_cm_event(e);
				rdma_destroy_id(id);
				done = s->requests == s->expect_conns;
				continue;
			} else if (s->nconns == (int)(sizeof s->conns / sizeof s->conns[0])) {
				/* More requests than this listener can hold (a stranger on our port):
				 * refuse them rather than write past conns[]. */
				check(0, "server: request %d is more than the %d connections it can hold", s->requests,
				      s->nconns);
				rdma_reject(id, NULL, 0);
				rdma_ack_cm_event(e);
				rdma_destroy_id(id);
				continue;
			} else {
				struct ibv_qp_init_attr a = qp_attr();
				struct rdma_conn_param cp = { .private_data = srv_pd, .private_data_len = sizeof srv_pd,
							      .responder_resources = !s->zero_depth,
							      .initiator_depth = !s->zero_depth };
				if (rdma_create_qp(id, NULL, &a) == 0) {
					if (s->expect_conns == 1) {
						s->mr = ibv_reg_mr(id->pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE);
						struct ibv_sge sge = { .addr = (uintptr_t)s->buf, .length = sizeof s->buf,
								       .lkey = s->mr ? s->mr->lkey : 0 };
						struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
						if (s->mr)
							ibv_post_recv(id->qp, &wr, &bad);
					}
					if (rdma_accept(id, &cp))
						check(0, "server rdma_accept");
					s->conns[s->nconns++] = id;
				}
			}
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			s->established++;
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			s->disconnected++;
			done = s->disconnected == s->expect_conns;
			break;
		default:
			check(0, "server: unexpected %s status %d", rdma_event_str(e->event), e->status);
			break;
		}
		rdma_ack_cm_event(e);
	}
	return NULL;
}

static int start_server(struct server *s, int mode, int conns)
{
	struct sockaddr_in a = sin_of("127.0.0.1", port);

	memset(s, 0, sizeof *s);
	s->mode = mode;
	s->expect_conns = conns;
	s->ch = rdma_create_event_channel();
	if (!s->ch || rdma_create_id(s->ch, &s->listen, s, RDMA_PS_TCP) ||
	    rdma_bind_addr(s->listen, (struct sockaddr *)&a) || rdma_listen(s->listen, 128))
		return -1;
	return 0;
}

static void stop_server(struct server *s)
{
	for (int i = 0; i < s->nconns; i++) {
		if (s->conns[i]->qp)
			rdma_destroy_qp(s->conns[i]);
		rdma_destroy_id(s->conns[i]);
	}
	if (s->mr)
		ibv_dereg_mr(s->mr);
	rdma_destroy_id(s->listen);
	rdma_destroy_event_channel(s->ch);
}

static void mode_pdata(void)
{
	struct server s;
	pthread_t t;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_cm_event *e = NULL;
	struct rdma_conn_param cp = { .private_data = cli_pd, .private_data_len = sizeof cli_pd,
				      .responder_resources = 1, .initiator_depth = 1, .retry_count = 7 };
	char msg[64] = "a Send over the connection rdma_cm set up";
	struct ibv_mr *mr;

	if (!check(start_server(&s, 0, 1) == 0, "listener on 127.0.0.1:%d", port))
		return;
	pthread_create(&t, NULL, server_thread, &s);
	id = client_id(ch, port, NULL);
	check(id != NULL, "client id");
	if (!id)
		goto out;
	mr = ibv_reg_mr(id->pd, msg, sizeof msg, 0);
	check(rdma_connect(id, &cp) == 0, "rdma_connect with %zu bytes of private data", sizeof cli_pd);
	if (expect(ch, RDMA_CM_EVENT_ESTABLISHED, &e, "client")) {
		check(e->param.conn.private_data_len >= sizeof srv_pd &&
			      memcmp(e->param.conn.private_data, srv_pd, sizeof srv_pd) == 0,
		      "ESTABLISHED carries the server's private data");
		check(qp_state(id->qp) == IBV_QPS_RTS, "client QP in RTS");
		rdma_ack_cm_event(e);
		{
			struct ibv_sge sge = { .addr = (uintptr_t)msg, .length = sizeof msg, .lkey = mr->lkey };
			struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
						  .send_flags = IBV_SEND_SIGNALED }, *bad;
			struct ibv_wc wc;
			int n = 0;
			check(ibv_post_send(id->qp, &wr, &bad) == 0, "post a Send");
			for (int i = 0; i < 5000 && n == 0; i++) {
				n = ibv_poll_cq(id->send_cq, 1, &wc);
				if (!n)
					usleep(1000);
			}
			check(n == 1 && wc.status == IBV_WC_SUCCESS, "Send completed");
		}
		usleep(200 * 1000);
		check(s.pd_ok == 1, "server saw the client's private data in CONNECT_REQUEST");
		check(s.depth_ok == 1, "CONNECT_REQUEST carries IRD/ORD");
		check(s.established == 1, "server ESTABLISHED");
		check(memcmp(s.buf, msg, sizeof msg) == 0, "server received the Send's bytes");
		check(rdma_disconnect(id) == 0, "rdma_disconnect");
		expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL, "client");
	}
	ibv_dereg_mr(mr);
	pthread_join(t, NULL);
	check(s.disconnected == 1, "server DISCONNECTED");
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
out:
	stop_server(&s);
	rdma_destroy_event_channel(ch);
}

/* IRD/ORD 0 (RFC 6581 allows it; SPDK's NVMe-oF target expects responder_resources 0 back):
 * both sides offer 0, both see 0, Sends still work. */
static void mode_depth0(void)
{
	struct server s;
	pthread_t t;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_cm_event *e = NULL;
	struct rdma_conn_param cp = { .private_data = cli_pd, .private_data_len = sizeof cli_pd,
				      .responder_resources = 0, .initiator_depth = 0, .retry_count = 7 };
	char msg[64] = "a Send over a connection without Reads";
	struct ibv_mr *mr;

	if (!check(start_server(&s, 0, 1) == 0, "listener on 127.0.0.1:%d", port))
		return;
	s.zero_depth = 1;
	pthread_create(&t, NULL, server_thread, &s);
	id = client_id(ch, port, NULL);
	check(id != NULL, "client id");
	if (!id)
		goto out;
	mr = ibv_reg_mr(id->pd, msg, sizeof msg, 0);
	check(rdma_connect(id, &cp) == 0, "rdma_connect with responder_resources 0, initiator_depth 0");
	if (expect(ch, RDMA_CM_EVENT_ESTABLISHED, &e, "client")) {
		check(e->param.conn.responder_resources == 0 && e->param.conn.initiator_depth == 0,
		      "ESTABLISHED reports the server's IRD/ORD as 0/0 (got %u/%u)", e->param.conn.initiator_depth,
		      e->param.conn.responder_resources);
		rdma_ack_cm_event(e);
		struct ibv_sge sge = { .addr = (uintptr_t)msg, .length = sizeof msg, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		struct ibv_wc wc;
		int n = 0;
		check(ibv_post_send(id->qp, &wr, &bad) == 0, "post a Send");
		for (int i = 0; i < 5000 && n == 0; i++) {
			n = ibv_poll_cq(id->send_cq, 1, &wc);
			if (!n)
				usleep(1000);
		}
		check(n == 1 && wc.status == IBV_WC_SUCCESS, "Send completed");
		usleep(200 * 1000);
		check(s.depth_ok == 1, "CONNECT_REQUEST carries IRD/ORD 0/0, not floored at 1");
		check(s.established == 1, "server ESTABLISHED");
		check(memcmp(s.buf, msg, sizeof msg) == 0, "server received the Send's bytes");
		check(rdma_disconnect(id) == 0, "rdma_disconnect");
		expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL, "client");
	}
	ibv_dereg_mr(mr);
	pthread_join(t, NULL);
	check(s.disconnected == 1, "server DISCONNECTED");
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
out:
	stop_server(&s);
	rdma_destroy_event_channel(ch);
}

/* One completion from cq within ~5 s (the CQs rdma_create_qp made are polled). */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 5000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		usleep(1000);
	}
	return 0;
}

/* IBV_DEVICE_MEM_MGT_EXTENSIONS keeps its promise: IBV_WR_LOCAL_INV completes as
 * IBV_WC_LOCAL_INV, and afterwards the peer can no longer write with that rkey. */
static void mode_localinv(void)
{
	struct server s;
	pthread_t t;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_conn_param cp = { .private_data = cli_pd, .private_data_len = sizeof cli_pd,
				      .responder_resources = 1, .initiator_depth = 1, .retry_count = 7 };
	static char target[64];
	struct ibv_device_attr da;
	struct ibv_mr *mr, *smr;
	struct ibv_wc wc;

	if (!check(start_server(&s, 0, 1) == 0, "listener on 127.0.0.1:%d", port))
		return;
	pthread_create(&t, NULL, server_thread, &s);
	id = client_id(ch, port, NULL);
	check(id != NULL, "client id");
	if (!id)
		goto out;
	memset(&da, 0, sizeof da);
	int qd = ibv_query_device(id->verbs, &da);
	check(qd == 0 && (da.device_cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS),
	      "device_cap_flags has IBV_DEVICE_MEM_MGT_EXTENSIONS (%#x)", da.device_cap_flags);
	mr = ibv_reg_mr(id->pd, target, sizeof target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	check(mr != NULL, "client region with remote write");
	check(rdma_connect(id, &cp) == 0, "rdma_connect");
	if (!mr || !expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL, "client"))
		goto disc;
	usleep(100 * 1000);
	check(s.nconns == 1 && s.mr, "server side up");
	if (s.nconns != 1 || !s.mr)
		goto disc;
	struct rdma_cm_id *sid = s.conns[0];
	smr = s.mr;
	/* The server writes into the client's region: it works before the invalidation... */
	memcpy(s.buf, "before", 7);
	struct ibv_sge sge = { .addr = (uintptr_t)s.buf, .length = 7, .lkey = smr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = (uintptr_t)target;
	w.wr.rdma.rkey = mr->rkey;
	memset(&wc, 0xff, sizeof wc);
	int ok = ibv_post_send(sid->qp, &w, &bad) == 0 && poll_one(sid->send_cq, &wc) == 1;
	check(ok && wc.status == IBV_WC_SUCCESS, "RDMA Write into the client's region before LOCAL_INV (status %d)",
	      wc.status);
	usleep(50 * 1000);
	check(memcmp(target, "before", 7) == 0, "... its bytes arrived");
	/* ...the client invalidates its rkey... */
	struct ibv_send_wr inv = { .wr_id = 2, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED };
	inv.invalidate_rkey = mr->rkey;
	check(ibv_post_send(id->qp, &inv, &bad) == 0, "post IBV_WR_LOCAL_INV");
	memset(&wc, 0xff, sizeof wc);
	ok = poll_one(id->send_cq, &wc) == 1;
	check(ok && wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV,
	      "LOCAL_INV completes: status %d opcode %d (IBV_WC_LOCAL_INV = %d)", wc.status, wc.opcode,
	      IBV_WC_LOCAL_INV);
	/* ...and the same Write now draws a Terminate from the client (an iWARP Write completes
	 * when sent; the peer's refusal ends the connection): both QPs go to ERROR, the bytes
	 * never land. */
	memcpy(s.buf, "after!", 7);
	w.wr_id = 3;
	check(ibv_post_send(sid->qp, &w, &bad) == 0, "RDMA Write with the invalidated rkey posted");
	int st_s = -1, st_c = -1;
	for (int i = 0; i < 300 && (st_s != IBV_QPS_ERR || st_c != IBV_QPS_ERR); i++) {
		usleep(10 * 1000);
		ibv_poll_cq(sid->send_cq, 1, &wc);
		st_s = qp_state(sid->qp);
		st_c = qp_state(id->qp);
	}
	check(st_s == IBV_QPS_ERR && st_c == IBV_QPS_ERR, "... refused: writer's QP in ERROR (%d), target's (%d)", st_s,
	      st_c);
	check(memcmp(target, "before", 7) == 0, "... and nothing was written");
disc:
	rdma_disconnect(id);
	if (mr)
		ibv_dereg_mr(mr);
	pthread_join(t, NULL);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
out:
	stop_server(&s);
	rdma_destroy_event_channel(ch);
}

static void mode_reject(void)
{
	struct server s;
	pthread_t t;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_cm_event *e = NULL;
	struct rdma_conn_param cp = { .private_data = cli_pd, .private_data_len = sizeof cli_pd,
				      .responder_resources = 1, .initiator_depth = 1 };

	if (!check(start_server(&s, 1, 1) == 0, "listener"))
		return;
	pthread_create(&t, NULL, server_thread, &s);
	id = client_id(ch, port, NULL);
	check(id && rdma_connect(id, &cp) == 0, "rdma_connect");
	e = get_event(ch, 10000);
	check(e && e->event == RDMA_CM_EVENT_REJECTED, "REJECTED (got %s, status %d)", e ? rdma_event_str(e->event) : "-",
	      e ? e->status : 0);
	check(e && e->param.conn.private_data_len >= sizeof rej_pd &&
		      memcmp(e->param.conn.private_data, rej_pd, sizeof rej_pd) == 0,
	      "REJECTED carries the reject's private data");
	check(e && e->status == -ECONNREFUSED, "status -ECONNREFUSED as siw/iw_cm report an MPA reject");
	if (e)
		rdma_ack_cm_event(e);
	pthread_join(t, NULL);
	check(s.pd_ok == 1, "server saw the private data of the request it rejected");
	if (id) {
		rdma_destroy_qp(id);
		rdma_destroy_id(id);
	}
	stop_server(&s);
	rdma_destroy_event_channel(ch);
}

#define MANY 64

static void mode_many(void)
{
	struct server s;
	pthread_t t;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *ids[MANY];
	struct rdma_cm_event *e;
	struct sockaddr_in dst = sin_of("127.0.0.1", port);
	int n = 0, est = 0, disc = 0, other = 0;

	if (!check(start_server(&s, 0, MANY) == 0, "listener"))
		return;
	pthread_create(&t, NULL, server_thread, &s);
	/* resolve all first, then connect all at once */
	for (int i = 0; i < MANY; i++) {
		ids[i] = NULL;
		if (rdma_create_id(ch, &ids[i], (void *)(long)i, RDMA_PS_TCP) == 0 &&
		    rdma_resolve_addr(ids[i], NULL, (struct sockaddr *)&dst, 2000) == 0)
			n++;
	}
	for (int i = 0; i < MANY && (e = get_event(ch, 5000)); i++) {
		if (e->event == RDMA_CM_EVENT_ADDR_RESOLVED)
			rdma_resolve_route(e->id, 2000);
		rdma_ack_cm_event(e);
	}
	for (int i = 0; i < MANY && (e = get_event(ch, 5000)); i++) {
		struct ibv_qp_init_attr a = qp_attr();
		if (e->event == RDMA_CM_EVENT_ROUTE_RESOLVED)
			rdma_create_qp(e->id, NULL, &a);
		rdma_ack_cm_event(e);
	}
	check(n == MANY, "%d ids resolved", n);
	for (int i = 0; i < MANY; i++) {
		/* the client's private data, then the connect's index */
		unsigned char pd[sizeof cli_pd + 1];
		memcpy(pd, cli_pd, sizeof cli_pd);
		pd[sizeof cli_pd] = i;
		struct rdma_conn_param cp = { .private_data = pd, .private_data_len = sizeof pd,
					      .responder_resources = 1, .initiator_depth = 1 };
		if (ids[i]->qp)
			rdma_connect(ids[i], &cp);
	}
	while (est + other < MANY && (e = get_event(ch, 20000))) {
		if (e->event == RDMA_CM_EVENT_ESTABLISHED)
			est++;
		else
			other++;
		rdma_ack_cm_event(e);
	}
	check(est == MANY, "%d of %d connections ESTABLISHED (%d other events)", est, MANY, other);
	usleep(300 * 1000);
	check(s.requests == MANY && s.established == MANY, "server: %d requests, %d established", s.requests,
	      s.established);
	/* The kernel's rdma_cm sends the connects to one destination in the order of the calls, and
	 * programs pair QPs by it (perftest -R -q N numbers the server's QPs in request order). */
	int first_out = -1;
	for (int i = 0; i < MANY && i < s.requests; i++)
		if (s.order[i] != i && first_out < 0)
			first_out = i;
	check(first_out < 0, "server: CONNECT_REQUESTs in the order of the rdma_connect calls (request %d is connect %d)",
	      first_out, first_out < 0 ? -1 : s.order[first_out]);
	for (int i = 0; i < MANY; i++)
		rdma_disconnect(ids[i]);
	while (disc < MANY && (e = get_event(ch, 10000))) {
		if (e->event == RDMA_CM_EVENT_DISCONNECTED)
			disc++;
		rdma_ack_cm_event(e);
	}
	check(disc == MANY, "%d DISCONNECTED", disc);
	pthread_join(t, NULL);
	check(s.disconnected == MANY, "server: %d DISCONNECTED", s.disconnected);
	for (int i = 0; i < MANY; i++) {
		if (ids[i]->qp)
			rdma_destroy_qp(ids[i]);
		rdma_destroy_id(ids[i]);
	}
	stop_server(&s);
	rdma_destroy_event_channel(ch);
}

/* ---- forward: the system library behind ids of other devices ---------------------------- */

static void mode_forward(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *a = NULL, *b = NULL;
	struct rdma_cm_event *e;
	struct sockaddr_in other = sin_of(other_ip, port), dst = sin_of(other_ip, 1);

	check(rdma_create_id(ch, &a, (void *)0xabc, RDMA_PS_TCP) == 0, "create id");
	check(rdma_bind_addr(a, (struct sockaddr *)&other) == 0, "bind %s (no uiw device holds it)", other_ip);
	check(a->verbs != NULL && a->port_num == 7, "the system library's device and port show in our id");
	check(rdma_listen(a, 4) == 0, "listen (forwarded)");
	e = get_event(ch, 5000);
	check(e && e->event == RDMA_CM_EVENT_CONNECT_REQUEST && e->listen_id == a && e->id && e->id != a,
	      "forwarded CONNECT_REQUEST on our channel, with our listener and a new id");
	if (e) {
		struct rdma_cm_id *n = e->id;
		check(n->context == (void *)0xabc && n->verbs == a->verbs && n->channel == ch,
		      "new id: listener's context, device, channel");
		check(rdma_reject(n, "x", 1) == 0, "reject forwarded");
		rdma_ack_cm_event(e);
		check(rdma_destroy_id(n) == 0, "destroy the new id");
	}
	check(rdma_create_id(ch, &b, NULL, RDMA_PS_TCP) == 0, "second id");
	check(rdma_resolve_addr(b, (struct sockaddr *)&other, (struct sockaddr *)&dst, 1000) == 0,
	      "resolve_addr from %s (forwarded)", other_ip);
	expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, "forwarded");
	check(rdma_resolve_route(b, 1000) == 0, "resolve_route (forwarded)");
	e = get_event(ch, 5000);
	check(e && e->event == RDMA_CM_EVENT_ROUTE_RESOLVED && e->id == b, "ROUTE_RESOLVED for our id");
	check(rdma_destroy_id(a) == 0, "destroy listener");
	if (e)
		rdma_ack_cm_event(e);
	check(rdma_destroy_id(b) == 0, "destroy second id");
	rdma_destroy_event_channel(ch);
}

int main(int argc, char **argv)
{
	int c;

	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((c = getopt(argc, argv, "p:a:")) != -1) {
		if (c == 'p')
			port = atoi(optarg);
		else if (c == 'a')
			other_ip = optarg;
	}
	if (optind >= argc) {
		fprintf(stderr, "usage: %s [-p PORT] [-a OTHER_IP] channel|nolistener|pdata|depth0|localinv|reject|many|forward\n",
			argv[0]);
		return 2;
	}
	if (!strcmp(argv[optind], "channel"))
		mode_channel();
	else if (!strcmp(argv[optind], "nolistener"))
		mode_nolistener();
	else if (!strcmp(argv[optind], "pdata"))
		mode_pdata();
	else if (!strcmp(argv[optind], "reject"))
		mode_reject();
	else if (!strcmp(argv[optind], "depth0"))
		mode_depth0();
	else if (!strcmp(argv[optind], "localinv"))
		mode_localinv();
	else if (!strcmp(argv[optind], "many"))
		mode_many();
	else if (!strcmp(argv[optind], "forward"))
		mode_forward();
	else
		return 2;
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
