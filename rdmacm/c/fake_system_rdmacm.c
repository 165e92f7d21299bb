/*
 * A stand-in for the system's librdmacm (the kernel's rdma_cm), for testing forwarding on
 * machines without an RDMA kernel stack: load it with UIW_SYSTEM_RDMACM=<this .so>.
 * It implements just enough: ids on channels, bind (marks the id with a fake device),
 * resolve_addr/route (queue events), listen, a scripted CONNECT_REQUEST on listen, events
 * through a pipe, acks, migrate, destroy. Every call is logged to stderr as "fake: ...".
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static struct ibv_context fake_ctx;
static int live_ids, live_events;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct rdma_event_channel *rdma_create_event_channel(void)
{
	int p[2];
	struct rdma_event_channel *c = calloc(1, sizeof *c + sizeof(int));

	if (pipe(p))
		return NULL;
	c->fd = p[0];
	((int *)(c + 1))[0] = p[1];
	fprintf(stderr, "fake: create_event_channel\n");
	return c;
}

static void post(struct rdma_cm_id *id, struct rdma_cm_id *listen, enum rdma_cm_event_type t)
{
	struct rdma_cm_event *e = calloc(1, sizeof *e);
	struct rdma_event_channel *c = (listen ? listen : id)->channel;

	e->id = id;
	e->listen_id = listen;
	e->event = t;
	pthread_mutex_lock(&mu);
	live_events++;
	pthread_mutex_unlock(&mu);
	if (write(((int *)(c + 1))[0], &e, sizeof e) != sizeof e)
		abort();
}

int rdma_get_cm_event(struct rdma_event_channel *c, struct rdma_cm_event **e)
{
	if (read(c->fd, e, sizeof *e) != sizeof *e) {
		errno = EIO;
		return -1;
	}
	return 0;
}

int rdma_ack_cm_event(struct rdma_cm_event *e)
{
	fprintf(stderr, "fake: ack %s\n", rdma_event_str(e->event));
	pthread_mutex_lock(&mu);
	live_events--;
	pthread_mutex_unlock(&mu);
	free(e);
	return 0;
}

const char *rdma_event_str(enum rdma_cm_event_type t)
{
	static const char *n[] = { "ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST" };
	return t < 5 ? n[t] : "OTHER";
}

int rdma_create_id(struct rdma_event_channel *c, struct rdma_cm_id **id, void *ctx, enum rdma_port_space ps)
{
	struct rdma_cm_id *i = calloc(1, sizeof *i);

	i->channel = c;
	i->context = ctx;
	i->ps = ps;
	*id = i;
	pthread_mutex_lock(&mu);
	live_ids++;
	pthread_mutex_unlock(&mu);
	fprintf(stderr, "fake: create_id\n");
	return 0;
}

int rdma_destroy_id(struct rdma_cm_id *id)
{
	pthread_mutex_lock(&mu);
	live_ids--;
	pthread_mutex_unlock(&mu);
	fprintf(stderr, "fake: destroy_id (%d ids, %d events left)\n", live_ids, live_events);
	free(id);
	return 0;
}

int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *a)
{
	id->verbs = &fake_ctx;
	id->port_num = 7;
	memcpy(&id->route.addr.src_addr, a, sizeof(struct sockaddr_in));
	fprintf(stderr, "fake: bind_addr\n");
	return 0;
}

int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *s, struct sockaddr *d, int ms)
{
	id->verbs = &fake_ctx;
	memcpy(&id->route.addr.dst_addr, d, sizeof(struct sockaddr_in));
	post(id, NULL, RDMA_CM_EVENT_ADDR_RESOLVED);
	fprintf(stderr, "fake: resolve_addr\n");
	return 0;
}

int rdma_resolve_route(struct rdma_cm_id *id, int ms)
{
	post(id, NULL, RDMA_CM_EVENT_ROUTE_RESOLVED);
	return 0;
}

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct rdma_cm_id *n;

	/* a peer "connects" at once */
	rdma_create_id(id->channel, &n, id->context, id->ps);
	n->verbs = &fake_ctx;
	post(n, id, RDMA_CM_EVENT_CONNECT_REQUEST);
	fprintf(stderr, "fake: listen\n");
	return 0;
}

int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *c)
{
	id->channel = c;
	fprintf(stderr, "fake: migrate_id\n");
	return 0;
}

int rdma_reject(struct rdma_cm_id *id, const void *d, uint8_t l)
{
	fprintf(stderr, "fake: reject %u bytes\n", l);
	return 0;
}

struct ibv_context **rdma_get_devices(int *n)
{
	if (n)
		*n = 0;
	return calloc(1, sizeof(void *));
}

void rdma_free_devices(struct ibv_context **l)
{
	free(l);
}

/* what the pump and the forwarding test look at */
struct ibv_context *fake_rdmacm_ctx(void)
{
	return &fake_ctx;
}
