/*
 * slow_accept.c — an rdma_cm server that takes its time between CONNECT_REQUEST and
 * rdma_accept, as fabtests' MSG servers do (they allocate and clear a buffer of the
 * device's max_msg_sz there: seconds on a busy host).
 *
 * One process, two threads, over the uiw device on 127.0.0.1 (uiw_lo): the server
 * listens, gets the CONNECT_REQUEST, sleeps -s MS, creates its QP and accepts; the client
 * connects and reports the event its connect ends with.
 *
 *   slow_accept -p PORT -s MS -e established|failed
 *
 * -e established: the client's connect ends ESTABLISHED and so does the server's accept.
 * -e failed: the client's connect ends in a failure event (REJECTED, UNREACHABLE or
 *            CONNECT_ERROR), not ESTABLISHED — it gave up waiting for the MPA Reply.
 *
 * Output is TAP-like ("ok - ..." / "not ok - ...", then "N passed, N failed"); exit status
 * 1 if any check failed. Links against -lrdmacm -libverbs; runs on any iWARP or RoCE device
 * at 127.0.0.1 (none but uiw_lo has that address in practice).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>

static int passed, failed;

static void check(int cond, const char *what, const char *detail)
{
	if (cond) {
		passed++;
		printf("ok - %s\n", what);
	} else {
		failed++;
		printf("not ok - %s (%s)\n", what, detail ? detail : "");
	}
	fflush(stdout);
}

static int port = 7791;
static int sleep_ms = 1500;
static int want_established = 1;

/* The next event on ch, waiting at most timeout_ms (so that a missing event fails the check
 * instead of hanging the test); -1 if none came. */
static int next_event(struct rdma_event_channel *ch, int timeout_ms, struct rdma_cm_id **id,
		      enum rdma_cm_event_type *type, int *status)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, timeout_ms) != 1)
		return -1;
	if (rdma_get_cm_event(ch, &ev))
		return -1;
	*id = ev->id;
	*type = ev->event;
	*status = ev->status;
	rdma_ack_cm_event(ev);
	return 0;
}

static void qp_attr(struct ibv_qp_init_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->qp_type = IBV_QPT_RC;
	a->cap.max_send_wr = 4;
	a->cap.max_recv_wr = 4;
	a->cap.max_send_sge = 1;
	a->cap.max_recv_sge = 1;
}

static struct sockaddr_in addr(void)
{
	struct sockaddr_in s = { .sin_family = AF_INET, .sin_port = htons(port) };

	s.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return s;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int listening; /* 1 listening, -1 the server could not listen */

static void *server(void *arg)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid = NULL, *cid;
	struct sockaddr_in a = addr();
	enum rdma_cm_event_type type;
	struct ibv_qp_init_attr qa;
	struct rdma_conn_param cp;
	int status, ok;

	ok = ch && !rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) &&
	     !rdma_bind_addr(lid, (struct sockaddr *)&a) && !rdma_listen(lid, 4);
	pthread_mutex_lock(&lock);
	listening = ok ? 1 : -1;
	pthread_cond_signal(&cond);
	pthread_mutex_unlock(&lock);
	check(ok, "server: listening on 127.0.0.1", strerror(errno));
	if (!ok)
		return NULL;
	if (next_event(ch, 30000, &cid, &type, &status) || type != RDMA_CM_EVENT_CONNECT_REQUEST) {
		check(0, "server: CONNECT_REQUEST", "none");
		return NULL;
	}
	check(1, "server: CONNECT_REQUEST", NULL);
	/* The application's own set-up, longer than the stack's MPA timeout. */
	usleep(sleep_ms * 1000);
	qp_attr(&qa);
	if (rdma_create_qp(cid, NULL, &qa)) {
		check(0, "server: QP created", strerror(errno));
		return NULL;
	}
	memset(&cp, 0, sizeof(cp));
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	ok = !rdma_accept(cid, &cp);
	if (!want_established)
		return NULL; /* the client is gone: whatever the accept says is not checked */
	check(ok, "server: rdma_accept", strerror(errno));
	ok = !next_event(ch, 30000, &cid, &type, &status) && type == RDMA_CM_EVENT_ESTABLISHED;
	check(ok, "server: ESTABLISHED", rdma_event_str(type));
	return NULL;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id = NULL, *eid;
	enum rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
	struct sockaddr_in a;
	struct ibv_qp_init_attr qa;
	struct rdma_conn_param cp;
	pthread_t t;
	int opt, status = 0, got;
	char detail[128];

	while ((opt = getopt(argc, argv, "p:s:e:")) != -1) {
		switch (opt) {
		case 'p':
			port = atoi(optarg);
			break;
		case 's':
			sleep_ms = atoi(optarg);
			break;
		case 'e':
			want_established = !strcmp(optarg, "established");
			break;
		default:
			fprintf(stderr, "usage: %s -p PORT -s MS -e established|failed\n", argv[0]);
			return 2;
		}
	}
	pthread_create(&t, NULL, server, NULL);
	pthread_mutex_lock(&lock);
	while (!listening)
		pthread_cond_wait(&cond, &lock);
	pthread_mutex_unlock(&lock);
	if (listening < 0)
		goto out;

	a = addr();
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) ||
	    next_event(ch, 10000, &eid, &type, &status) || type != RDMA_CM_EVENT_ADDR_RESOLVED ||
	    rdma_resolve_route(id, 2000) ||
	    next_event(ch, 10000, &eid, &type, &status) || type != RDMA_CM_EVENT_ROUTE_RESOLVED) {
		check(0, "client: address and route resolved", rdma_event_str(type));
		goto out;
	}
	qp_attr(&qa);
	if (rdma_create_qp(id, NULL, &qa)) {
		check(0, "client: QP created", strerror(errno));
		goto out;
	}
	memset(&cp, 0, sizeof(cp));
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	if (rdma_connect(id, &cp)) {
		check(0, "client: rdma_connect", strerror(errno));
		goto out;
	}
	/* Longer than the server's sleep and than any reply timeout a test sets. */
	got = next_event(ch, 30000, &eid, &type, &status);
	snprintf(detail, sizeof(detail), "%s, status %d", got ? "no event" : rdma_event_str(type), status);
	if (want_established)
		check(!got && type == RDMA_CM_EVENT_ESTABLISHED,
		      "client: connect ends ESTABLISHED after the slow accept", detail);
	else
		check(!got && (type == RDMA_CM_EVENT_REJECTED || type == RDMA_CM_EVENT_UNREACHABLE ||
			       type == RDMA_CM_EVENT_CONNECT_ERROR),
		      "client: connect fails when the Reply takes longer than its timeout", detail);
out:
	pthread_join(t, NULL);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
