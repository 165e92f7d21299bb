/*
 * integrity.c — data integrity of every RC operation at every size.
 *
 * Two processes, a server and a client, each open an RDMA device, connect
 * two RC queue pairs to each other the way ibv_rc_pingpong -g 0 and perftest
 * do (QPN, GID and buffer addresses/rkeys exchanged over a plain TCP socket,
 * then INIT -> RTR -> RTS, no rdma_cm), and then, driven by the client, run
 * every operation at every size:
 *
 *     SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ,
 *     ATOMIC_FETCH_AND_ADD, ATOMIC_CMP_AND_SWP (matching and failing compare)
 *
 * For every transfer the source side fills its buffer with seeded random
 * bytes and computes an FNV-1a 64 checksum; the side the data lands on
 * computes the checksum of what landed; both checksums are exchanged over the
 * TCP socket and BOTH sides compare them. The landing side also checks that
 * the guard bytes just before and after every target range (and every SGE)
 * are untouched, and every completion is checked field by field: status,
 * opcode, byte_len (receive side), wc_flags (IBV_WC_WITH_IMM) and imm_data,
 * qp_num and wr_id.
 *
 * Variants: one SGE; 3 SGEs in 2 different MRs (send/write/read source, and
 * receive/read sink); IBV_SEND_INLINE from unregistered memory that is
 * scribbled over as soon as the post returns; unsignaled WRs followed by a
 * signaled one; a chain of WRs in one ibv_post_send; receives from an SRQ.
 * With -N every send-queue WR is posted with the ibv_wr_* API (ibv_qp_ex)
 * instead of ibv_post_send.
 *
 * The program links only against -libverbs and knows nothing about uiw:
 *
 *     cc -O1 -g -Wall -Wextra -Werror -o integrity integrity.c -libverbs
 *     uiw run -- ./integrity -s &            # server
 *     uiw run -- ./integrity -c 127.0.0.1    # client
 *
 * Output is TAP-like, one line per check ("ok N - ..." or
 * "not ok N - ...: details"), then "N passed, M failed". Each process checks
 * what it can see and exits 1 if any of its checks failed; the client also
 * checks that the server reported no failure.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* ------------------------------------------------------------------------ */
/* Parameters                                                                */
/* ------------------------------------------------------------------------ */

#define DEFAULT_PORT 18520
#define DEFAULT_MAX (8u << 20)
#define MAX_WR 8 /* WRs in one test (batch) */
#define GUARD 256 /* guard bytes checked on each side of every range */
#define SLACK 64 /* extra receive-buffer room (inside the after-guard) */
#define MULTI_MAX (1u << 20) /* largest size for multi-WR variants */
#define SYNC_LEN 8 /* the SEND that follows plain RDMA Writes */
#define SCRATCH_OFF 1024 /* receive buffers for WRITE_WITH_IMM */
#define SCRATCH_LEN 64
#define SYNC_BUF_LEN (SCRATCH_OFF + MAX_WR * (SCRATCH_LEN + 2 * GUARD))
#define QP_DEPTH 64
#define CQ_DEPTH 256
#define RD_ATOMIC 16 /* ORD/IRD; batches post up to 8 Reads/Atomics */
#define WAIT_S 30.0 /* completion timeout */
#define MAGIC 0x7569772d696e7431ULL /* "uiw-int1" */

/* ------------------------------------------------------------------------ */
/* TAP-like reporting                                                        */
/* ------------------------------------------------------------------------ */

static int n_passed, n_failed;
static char tname[160]; /* the current test, prefixed to each check */

/*
 * Record one check: "ok N - <test>: <what>". `fmt` explains a failure and
 * is printed only on one.
 */
static int check(int cond, const char *what, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int check(int cond, const char *what, const char *fmt, ...)
{
	int n = n_passed + n_failed + 1;
	const char *sep = tname[0] ? ": " : "";

	if (cond) {
		printf("ok %d - %s%s%s\n", n, tname, sep, what);
		n_passed++;
	} else {
		va_list ap;

		printf("not ok %d - %s%s%s: ", n, tname, sep, what);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		printf("\n");
		n_failed++;
	}
	fflush(stdout);
	return cond;
}

/* Append to a failure description (bounded; the first problems matter). */
static void addf(char *buf, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void addf(char *buf, size_t cap, const char *fmt, ...)
{
	size_t len = strlen(buf);
	va_list ap;

	if (len + 1 >= cap)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + len, cap - len, fmt, ap);
	va_end(ap);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------------ */
/* Random bytes and checksums                                                */
/* ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* xorshift64*, handed out a byte at a time so that a stream can continue
 * across SGE boundaries. */
struct rng {
	uint64_t s, word;
	unsigned left;
};

static void rng_init(struct rng *r, uint64_t seed)
{
	r->s = splitmix64(seed) | 1;
	r->left = 0;
	r->word = 0;
}

static uint64_t rng_next(struct rng *r)
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 0x2545f4914f6cdd1dULL;
}

static inline uint8_t rng_byte(struct rng *r)
{
	uint8_t b;

	if (!r->left) {
		r->word = rng_next(r);
		r->left = 8;
	}
	b = (uint8_t)r->word;
	r->word >>= 8;
	r->left--;
	return b;
}

#define FNV_INIT 0xcbf29ce484222325ULL

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

/* The guard pattern: depends on the position, so that data shifted by a few
 * bytes, or a stale copy of the pattern, is still noticed. */
static inline uint8_t guard_byte(size_t off)
{
	return (uint8_t)(0xa5 ^ (off * 13) ^ (off >> 8));
}

/* ------------------------------------------------------------------------ */
/* Buffers, segments and spans                                               */
/* ------------------------------------------------------------------------ */

struct buf {
	const char *name;
	uint8_t *p;
	size_t len;
	struct ibv_mr *mr; /* NULL for the (unregistered) inline source */
};

/* One SGE's worth of local memory. */
struct seg {
	struct buf *b;
	size_t off;
	uint32_t len;
};

/* The local memory of one WR: up to 3 SGEs, in order. */
struct span {
	int n;
	struct seg s[3];
};

enum split {
	SPLIT_NONE, /* one SGE */
	SPLIT_A, /* thirds: how sources are gathered */
	SPLIT_B, /* quarter, then half of the rest: how sinks are scattered,
		  * so that no SGE boundary coincides with the source's */
};

static int split_lengths(size_t size, enum split how, uint32_t len[3])
{
	size_t a, b;

	switch (how) {
	case SPLIT_A:
		a = size / 3;
		b = size / 3;
		break;
	case SPLIT_B:
		a = (size + 3) / 4;
		b = (size - a) / 2;
		break;
	default:
		len[0] = (uint32_t)size;
		return 1;
	}
	len[0] = (uint32_t)a;
	len[1] = (uint32_t)b;
	len[2] = (uint32_t)(size - a - b);
	return 3;
}

/*
 * Place a WR's data: the first and last SGEs in `b0` starting at `base`, the
 * middle one in `b1` (another MR) — or all three in b0 when b1 == b0. Every
 * segment has GUARD free bytes on each side and `mis` shifts it off 8-byte
 * alignment. Exits on a layout bug (never on a provider problem).
 */
static void layout(struct span *sp, struct buf *b0, struct buf *b1, size_t base,
		   unsigned mis, size_t size, enum split how)
{
	uint32_t len[3];
	size_t cur0 = base + GUARD + mis, cur1 = GUARD + mis;
	int k;

	sp->n = split_lengths(size, how, len);
	for (k = 0; k < sp->n; k++) {
		int second = k == 1 && b1 != b0;
		struct buf *b = second ? b1 : b0;
		size_t *cur = second ? &cur1 : &cur0;

		sp->s[k].b = b;
		sp->s[k].off = *cur;
		sp->s[k].len = len[k];
		if (*cur + len[k] + GUARD > b->len) {
			fprintf(stderr, "integrity: layout bug: %zu+%u+%d > %zu (%s)\n",
				*cur, len[k], GUARD, b->len, b->name);
			exit(2);
		}
		*cur += len[k] + 2 * GUARD;
	}
}

static size_t span_len(const struct span *sp)
{
	size_t n = 0;
	int k;

	for (k = 0; k < sp->n; k++)
		n += sp->s[k].len;
	return n;
}

static void fill_guard(const struct span *sp)
{
	int k;

	for (k = 0; k < sp->n; k++) {
		const struct seg *s = &sp->s[k];
		size_t o;

		for (o = s->off - GUARD; o < s->off + s->len + GUARD; o++)
			s->b->p[o] = guard_byte(o);
	}
}

static void fill_random(const struct span *sp, uint64_t seed)
{
	struct rng r;
	int k;

	rng_init(&r, seed);
	for (k = 0; k < sp->n; k++) {
		uint8_t *p = sp->s[k].b->p + sp->s[k].off;
		uint32_t i;

		for (i = 0; i < sp->s[k].len; i++)
			p[i] = rng_byte(&r);
	}
}

static uint64_t span_sum(const struct span *sp)
{
	uint64_t h = FNV_INIT;
	int k;

	for (k = 0; k < sp->n; k++)
		h = fnv1a(h, sp->s[k].b->p + sp->s[k].off, sp->s[k].len);
	return h;
}

/*
 * Are the GUARD bytes before and after every segment still the pattern?
 * Describes the first damaged byte into `why`.
 */
static int guards_ok(const struct span *sp, char *why, size_t cap)
{
	int k;

	for (k = 0; k < sp->n; k++) {
		const struct seg *s = &sp->s[k];
		size_t o;

		for (o = s->off - GUARD; o < s->off + s->len + GUARD; o++) {
			if (o == s->off)
				o += s->len;
			if (o >= s->off + s->len + GUARD)
				break;
			if (s->b->p[o] != guard_byte(o)) {
				long rel = o < s->off ? (long)o - (long)s->off
						      : (long)(o - s->off - s->len);
				snprintf(why, cap,
					 "SGE %d (%u bytes at %s+%zu): the byte at %s%+ld "
					 "is 0x%02x, was 0x%02x",
					 k, s->len, s->b->name, s->off,
					 rel < 0 ? "start" : "end", rel, s->b->p[o],
					 guard_byte(o));
				return 0;
			}
		}
	}
	return 1;
}

/* Is the whole window of a span, its data bytes included, still the guard
 * pattern? (For buffers that must not be written at all.) */
static int untouched(const struct span *sp, char *why, size_t cap)
{
	const struct seg *s = &sp->s[0];
	size_t o;

	for (o = s->off - GUARD; o < s->off + s->len + GUARD; o++)
		if (s->b->p[o] != guard_byte(o)) {
			snprintf(why, cap, "byte %ld of a %u-byte buffer that must not "
				 "be written is 0x%02x, was 0x%02x",
				 (long)o - (long)s->off, s->len, s->b->p[o],
				 guard_byte(o));
			return 0;
		}
	return 1;
}

/* ------------------------------------------------------------------------ */
/* Operations and tests                                                      */
/* ------------------------------------------------------------------------ */

enum op { OP_SEND, OP_SEND_IMM, OP_WRITE, OP_WRITE_IMM, OP_READ, OP_FADD,
	  OP_CSWAP, N_OPS };

static const char *const op_names[N_OPS] = {
	"SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM",
	"RDMA_READ", "ATOMIC_FETCH_AND_ADD", "ATOMIC_CMP_AND_SWP",
};

static const char *op_name(uint64_t op)
{
	return op < N_OPS ? op_names[op] : "?";
}

/* Ops that consume a receive WR at the responder. */
static int consumes_recv(enum op op)
{
	return op == OP_SEND || op == OP_SEND_IMM || op == OP_WRITE_IMM;
}

static int is_atomic(enum op op)
{
	return op == OP_FADD || op == OP_CSWAP;
}

/* The send-queue completion opcode of each operation (ibv_poll_cq(3)). */
static enum ibv_wc_opcode send_wc_opcode(enum op op)
{
	switch (op) {
	case OP_SEND:
	case OP_SEND_IMM:
		return IBV_WC_SEND;
	case OP_WRITE:
	case OP_WRITE_IMM:
		return IBV_WC_RDMA_WRITE;
	case OP_READ:
		return IBV_WC_RDMA_READ;
	case OP_FADD:
		return IBV_WC_FETCH_ADD;
	default:
		return IBV_WC_COMP_SWAP;
	}
}

enum variant { V_BASIC, V_SGE3, V_INLINE, V_INLINE3, V_UNSIG, V_BATCH, V_SRQ,
	       V_ATOMIC };

struct test {
	unsigned no;
	enum variant var;
	int qpi; /* QP pair: 0 = plain RQ, 1 = SRQ on the server */
	int nwr;
	size_t size;
	enum op op[MAX_WR];
	int sync; /* a SEND follows, to learn that plain Writes were placed */
	uint64_t val[4]; /* atomics: initial, compare/add, swap */
};

static enum split src_split(const struct test *t)
{
	return t->var == V_SGE3 || t->var == V_INLINE3 ? SPLIT_A : SPLIT_NONE;
}

static enum split sink_split(const struct test *t)
{
	return t->var == V_SGE3 ? SPLIT_B : SPLIT_NONE;
}

/* Byte offset that moves WR i's data off 8-byte alignment (never atomics). */
static unsigned misalign(const struct test *t, int i)
{
	return t->var == V_ATOMIC ? 0 : (t->no * 3 + (unsigned)i) % 8;
}

static size_t stride(size_t size)
{
	return (size + 2 * GUARD + 8 + 63) & ~(size_t)63;
}

static uint64_t data_seed(const struct test *t, int i)
{
	return ((uint64_t)t->no << 40) ^ ((uint64_t)i << 32) ^ t->size ^
	       ((uint64_t)t->op[i] << 56);
}

static uint32_t imm_value(const struct test *t, int i)
{
	/* Varies every byte, the top bit included. */
	return (uint32_t)splitmix64(0x1111ULL * t->no + (uint64_t)i);
}

/* wr_ids use all 64 bits, so a provider that truncates them is caught. */
static uint64_t send_wr_id(const struct test *t, int i)
{
	return 0xc0de000000000000ULL | (uint64_t)t->no << 8 | (uint64_t)i;
}

static uint64_t recv_wr_id(const struct test *t, int i)
{
	return 0x5ec0000000000000ULL | (uint64_t)t->no << 8 | (uint64_t)i;
}

static void set_tname(const struct test *t)
{
	static const char *const vnames[] = {
		[V_BASIC] = "",
		[V_SGE3] = " [3 SGEs, 2 MRs]",
		[V_INLINE] = " [inline]",
		[V_INLINE3] = " [inline, 3 SGEs]",
		[V_UNSIG] = "",
		[V_BATCH] = "",
		[V_SRQ] = " [SRQ]",
		[V_ATOMIC] = "",
	};
	int mixed = 0, i;

	for (i = 1; i < t->nwr; i++)
		if (t->op[i] != t->op[0])
			mixed = 1;
	if (t->var == V_UNSIG)
		snprintf(tname, sizeof(tname), "%s %zu B [%d WRs, first %d unsignaled]",
			 op_name(t->op[0]), t->size, t->nwr, t->nwr - 1);
	else if (t->var == V_BATCH)
		snprintf(tname, sizeof(tname), "%s %zu B [chain of %d WRs in one post]",
			 mixed ? "mixed ops" : op_name(t->op[0]), t->size, t->nwr);
	else if (t->var == V_ATOMIC && t->nwr > 1)
		snprintf(tname, sizeof(tname), "%s [chain of %d on one address]",
			 op_name(t->op[0]), t->nwr);
	else if (t->var == V_ATOMIC && t->op[0] == OP_FADD)
		snprintf(tname, sizeof(tname), "%s 0x%" PRIx64 " + 0x%" PRIx64,
			 op_name(t->op[0]), t->val[0], t->val[1]);
	else if (t->var == V_ATOMIC)
		snprintf(tname, sizeof(tname), "%s 0x%" PRIx64 " (compare %s)",
			 op_name(t->op[0]), t->val[0],
			 t->val[0] == t->val[1] ? "matches" : "differs");
	else
		snprintf(tname, sizeof(tname), "%s %zu B%s", op_name(t->op[0]),
			 t->size, vnames[t->var]);
}

/* ------------------------------------------------------------------------ */
/* The out-of-band TCP channel                                               */
/* ------------------------------------------------------------------------ */

enum msg_type { MSG_HELLO = 1, MSG_TEST, MSG_READY, MSG_DONE, MSG_RESULT,
		MSG_QUIT, MSG_BYE };

/*
 * Every message has the same fixed layout of 64-bit words, sent big-endian.
 *   TEST   client -> server: what to run
 *   READY  server -> client: receives posted, targets prepared (addr[]),
 *          Read sources' checksums (sum[]), atomic target value (val[0])
 *   DONE   client -> server: WRs completed; source checksums (sum[]),
 *          expected atomic result (val[0]); status 1 = nothing was posted
 *   RESULT server -> client: checksums of what landed (sum[]), value seen
 *          (val[0]), status = failed checks on the server in this test
 */
struct msg {
	uint64_t type, test, variant, qpi, nwr, size, sync, status;
	uint64_t op[MAX_WR];
	uint64_t addr[MAX_WR];
	uint64_t sum[MAX_WR];
	uint64_t val[MAX_WR];
};
#define MSG_WORDS (sizeof(struct msg) / sizeof(uint64_t))
_Static_assert(sizeof(struct msg) == MSG_WORDS * sizeof(uint64_t),
	       "struct msg is a plain array of words");

static int send_msg(int fd, const struct msg *m)
{
	uint64_t w[MSG_WORDS];
	size_t i, done = 0;

	memcpy(w, m, sizeof(w));
	for (i = 0; i < MSG_WORDS; i++)
		w[i] = htobe64(w[i]);
	while (done < sizeof(w)) {
		ssize_t n = send(fd, (char *)w + done, sizeof(w) - done, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		done += (size_t)n;
	}
	return 0;
}

static int recv_msg(int fd, struct msg *m, enum msg_type want)
{
	uint64_t w[MSG_WORDS];
	size_t i, done = 0;

	while (done < sizeof(w)) {
		ssize_t n = recv(fd, (char *)w + done, sizeof(w) - done, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fprintf(stderr, "integrity: the peer closed the TCP channel%s%s\n",
				n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
			return -1;
		}
		done += (size_t)n;
	}
	for (i = 0; i < MSG_WORDS; i++)
		w[i] = be64toh(w[i]);
	memcpy(m, w, sizeof(w));
	if (want && m->type != (uint64_t)want) {
		fprintf(stderr, "integrity: protocol error: message type %" PRIu64
			", expected %d\n", m->type, want);
		return -1;
	}
	return 0;
}

static int tcp_listen_accept(int port)
{
	struct addrinfo hints = { .ai_flags = AI_PASSIVE, .ai_family = AF_INET,
				  .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	char service[16];
	int lfd, fd, one = 1;

	snprintf(service, sizeof(service), "%d", port);
	if (getaddrinfo(NULL, service, &hints, &res) != 0)
		return -1;
	lfd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
	if (lfd < 0) {
		freeaddrinfo(res);
		return -1;
	}
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, res->ai_addr, res->ai_addrlen) < 0 || listen(lfd, 1) < 0) {
		fprintf(stderr, "integrity: cannot listen on TCP port %d: %s\n",
			port, strerror(errno));
		freeaddrinfo(res);
		close(lfd);
		return -1;
	}
	freeaddrinfo(res);
	printf("# server: waiting for the client on TCP port %d\n", port);
	fflush(stdout);
	fd = accept(lfd, NULL, NULL);
	close(lfd);
	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* The server may not be listening yet: retry for a while, as a test
 * harness starts both sides at once. */
static int tcp_connect(const char *host, int port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
	double deadline = now_s() + 30.0;
	char service[16];
	int one = 1;

	snprintf(service, sizeof(service), "%d", port);
	for (;;) {
		struct addrinfo *res, *ai;
		int fd = -1;

		if (getaddrinfo(host, service, &hints, &res) != 0) {
			fprintf(stderr, "integrity: cannot resolve %s\n", host);
			return -1;
		}
		for (ai = res; ai; ai = ai->ai_next) {
			fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
			if (fd < 0)
				continue;
			if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
				break;
			close(fd);
			fd = -1;
		}
		freeaddrinfo(res);
		if (fd >= 0) {
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			return fd;
		}
		if (now_s() > deadline) {
			fprintf(stderr, "integrity: cannot connect to %s:%d: %s\n",
				host, port, strerror(errno));
			return -1;
		}
		usleep(100 * 1000);
	}
}

/* ------------------------------------------------------------------------ */
/* Verbs resources                                                           */
/* ------------------------------------------------------------------------ */

struct peer {
	uint32_t qpn[2];
	union ibv_gid gid;
	uint64_t main_addr; /* each test's targets come in its READY message */
	uint32_t main_rkey;
	uint32_t psn;
};

struct ctx {
	/* options */
	int server, use_wr_api, gidx, port;
	const char *host, *dev_name;
	size_t max_size;

	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_srq *srq;
	struct ibv_qp *qp[2];
	struct ibv_qp_ex *qpx[2];
	struct buf main, second, sync, inl;
	uint32_t max_inline;
	int atomics; /* atomic_cap != IBV_ATOMIC_NONE */
	enum ibv_mtu mtu;
	uint32_t psn;
	struct peer peer;
	int fd;
	int broken; /* a QP failed: stop testing */
};

static int alloc_buf(struct buf *b, const char *name, size_t len)
{
	void *p = NULL;

	b->name = name;
	b->len = len;
	b->mr = NULL;
	if (posix_memalign(&p, 4096, len) != 0) {
		b->p = NULL;
		return -1;
	}
	b->p = p;
	memset(b->p, 0, len);
	return 0;
}

static int reg_buf(struct ctx *c, struct buf *b, int access)
{
	char what[64];

	snprintf(what, sizeof(what), "ibv_reg_mr (%s)", b->name);
	b->mr = ibv_reg_mr(c->pd, b->p, b->len, access);
	return check(b->mr != NULL, what, "%zu bytes: %s", b->len, strerror(errno));
}

static struct ibv_qp *create_qp(struct ctx *c, int with_srq)
{
	struct ibv_qp_cap cap = {
		.max_send_wr = QP_DEPTH,
		.max_recv_wr = QP_DEPTH,
		.max_send_sge = 3,
		.max_recv_sge = 3,
		.max_inline_data = 64,
	};
	struct ibv_qp *qp;

	if (c->use_wr_api) {
		struct ibv_qp_init_attr_ex a;

		memset(&a, 0, sizeof(a));
		a.send_cq = c->scq;
		a.recv_cq = c->rcq;
		a.srq = with_srq ? c->srq : NULL;
		a.qp_type = IBV_QPT_RC;
		a.sq_sig_all = 0; /* unsignaled WRs are tested */
		a.cap = cap;
		a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.pd = c->pd;
		a.send_ops_flags =
			IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
			IBV_QP_EX_WITH_RDMA_WRITE |
			IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			IBV_QP_EX_WITH_RDMA_READ |
			IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
			IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
		qp = ibv_create_qp_ex(c->ctx, &a);
		cap = a.cap;
	} else {
		struct ibv_qp_init_attr a;

		memset(&a, 0, sizeof(a));
		a.send_cq = c->scq;
		a.recv_cq = c->rcq;
		a.srq = with_srq ? c->srq : NULL;
		a.qp_type = IBV_QPT_RC;
		a.sq_sig_all = 0;
		a.cap = cap;
		qp = ibv_create_qp(c->pd, &a);
		cap = a.cap;
	}
	if (!check(qp != NULL,
		   c->use_wr_api ? (with_srq ? "ibv_create_qp_ex with ibv_wr_* send ops, on the SRQ"
					     : "ibv_create_qp_ex with ibv_wr_* send ops")
				 : (with_srq ? "ibv_create_qp on the SRQ" : "ibv_create_qp"),
		   "%s", strerror(errno)))
		return NULL;
	/* ibv_create_qp writes the granted capabilities back into cap: the
	 * inline limit used below is the granted one, as perftest does. */
	check(cap.max_inline_data >= 64 && cap.max_send_sge >= 3,
	      "granted max_inline_data >= 64 and max_send_sge >= 3",
	      "max_inline_data %u, max_send_sge %u", cap.max_inline_data,
	      cap.max_send_sge);
	if (!c->max_inline || cap.max_inline_data < c->max_inline)
		c->max_inline = cap.max_inline_data;
	return qp;
}

static int qp_to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
	};

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					    IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* INIT -> RTR -> RTS exactly as ibv_rc_pingpong -g: the peer is named by its
 * GID (an IPv4-mapped address on iWARP) and its QPN. */
static int qp_connect(struct ctx *c, int i)
{
	struct ibv_qp_attr a;
	int ret;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = c->mtu;
	a.dest_qp_num = c->peer.qpn[i];
	a.rq_psn = c->peer.psn;
	a.max_dest_rd_atomic = RD_ATOMIC;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = c->peer.gid;
	a.ah_attr.grh.sgid_index = (uint8_t)c->gidx;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	ret = ibv_modify_qp(c->qp[i], &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (!check(ret == 0, "INIT -> RTR", "QP %d: %s", i, strerror(ret)))
		return -1;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = c->psn;
	a.max_rd_atomic = RD_ATOMIC;
	ret = ibv_modify_qp(c->qp[i], &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				    IBV_QP_MAX_QP_RD_ATOMIC);
	if (!check(ret == 0, "RTR -> RTS", "QP %d: %s", i, strerror(ret)))
		return -1;
	return 0;
}

static uint64_t gid_word(const union ibv_gid *g, int half)
{
	uint64_t v = 0;
	int k;

	for (k = 0; k < 8; k++)
		v = v << 8 | g->raw[half * 8 + k];
	return v;
}

static void gid_set_word(union ibv_gid *g, int half, uint64_t v)
{
	int k;

	for (k = 7; k >= 0; k--) {
		g->raw[half * 8 + k] = (uint8_t)v;
		v >>= 8;
	}
}

/* Open the device, create everything and connect both QP pairs. */
static int setup(struct ctx *c)
{
	struct ibv_device **list;
	struct ibv_device_attr dattr;
	struct ibv_port_attr port;
	union ibv_gid gid;
	struct msg m, r;
	size_t main_len, peer_max;
	int num = 0, i, ret;
	const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

	list = ibv_get_device_list(&num);
	if (!check(list != NULL, "ibv_get_device_list", "%s", strerror(errno)))
		return -1;
	ret = ENODEV;
	for (i = 0; i < num; i++)
		if (strcmp(ibv_get_device_name(list[i]), c->dev_name) == 0) {
			c->ctx = ibv_open_device(list[i]);
			ret = c->ctx ? 0 : errno;
			break;
		}
	ibv_free_device_list(list);
	if (!check(c->ctx != NULL, "ibv_open_device", "%s: %s", c->dev_name,
		   ret == ENODEV ? "not among the devices listed" : strerror(ret)))
		return -1;

	ret = ibv_query_device(c->ctx, &dattr);
	if (!check(ret == 0, "ibv_query_device", "%s", strerror(ret)))
		return -1;
	/* RFC 7306 atomics are negotiated between uiw peers; the device must
	 * then say so, or programs (perftest -A, UCX) will not use them. */
	c->atomics = dattr.atomic_cap != IBV_ATOMIC_NONE;
	check(c->atomics, "ibv_query_device reports atomic_cap HCA or GLOB",
	      "atomic_cap %d (IBV_ATOMIC_NONE): the atomic tests are not run",
	      dattr.atomic_cap);
	check(dattr.max_sge >= 3 && dattr.max_qp_rd_atom >= RD_ATOMIC &&
		      dattr.max_qp_init_rd_atom >= RD_ATOMIC,
	      "device limits cover the test (max_sge >= 3, rd_atom >= 16)",
	      "max_sge %d max_qp_rd_atom %d max_qp_init_rd_atom %d",
	      dattr.max_sge, dattr.max_qp_rd_atom, dattr.max_qp_init_rd_atom);

	ret = ibv_query_port(c->ctx, 1, &port);
	if (!check(ret == 0, "ibv_query_port(1)", "%s", strerror(ret)))
		return -1;
	c->mtu = port.active_mtu;
	if (port.max_msg_sz < c->max_size) {
		printf("# -m %zu is above the port's max_msg_sz %u: using %u\n",
		       c->max_size, port.max_msg_sz, port.max_msg_sz);
		c->max_size = port.max_msg_sz;
	}
	ret = ibv_query_gid(c->ctx, 1, c->gidx, &gid);
	if (!check(ret == 0, "ibv_query_gid", "index %d: %s", c->gidx,
		   strerror(ret)))
		return -1;

	c->pd = ibv_alloc_pd(c->ctx);
	c->scq = ibv_create_cq(c->ctx, CQ_DEPTH, NULL, NULL, 0);
	c->rcq = ibv_create_cq(c->ctx, CQ_DEPTH, NULL, NULL, 0);
	if (!check(c->pd && c->scq && c->rcq, "ibv_alloc_pd and two ibv_create_cq",
		   "%s", strerror(errno)))
		return -1;
	if (c->server) {
		struct ibv_srq_init_attr sa = {
			.attr = { .max_wr = QP_DEPTH, .max_sge = 3 },
		};

		c->srq = ibv_create_srq(c->pd, &sa);
		if (!check(c->srq != NULL, "ibv_create_srq", "%s", strerror(errno)))
			return -1;
	}

	/* Buffers: the largest single message with room for 3 SGEs and their
	 * guards, or a batch of MAX_WR messages of up to MULTI_MAX bytes. */
	main_len = c->max_size + 4 * GUARD + 64;
	if (main_len < MAX_WR * stride(c->max_size < MULTI_MAX ? c->max_size : MULTI_MAX))
		main_len = MAX_WR * stride(c->max_size < MULTI_MAX ? c->max_size : MULTI_MAX);
	if (alloc_buf(&c->main, "main MR", main_len) ||
	    /* The middle SGE of a split (size/3 or 3/8 of it) lives here. */
	    alloc_buf(&c->second, "second MR", c->max_size / 2 + 2 * GUARD + 64) ||
	    alloc_buf(&c->sync, "sync MR", SYNC_BUF_LEN)) {
		check(0, "allocate buffers", "%zu bytes: out of memory", main_len);
		return -1;
	}
	if (!reg_buf(c, &c->main, remote) || !reg_buf(c, &c->second, remote) ||
	    !reg_buf(c, &c->sync, IBV_ACCESS_LOCAL_WRITE))
		return -1;

	for (i = 0; i < 2; i++) {
		c->qp[i] = create_qp(c, c->server && i == 1);
		if (!c->qp[i])
			return -1;
		if (c->use_wr_api) {
			c->qpx[i] = ibv_qp_to_qp_ex(c->qp[i]);
			if (!check(c->qpx[i] != NULL, "ibv_qp_to_qp_ex", "NULL"))
				return -1;
		}
		ret = qp_to_init(c->qp[i]);
		if (!check(ret == 0, "RESET -> INIT", "QP %d: %s", i, strerror(ret)))
			return -1;
	}
	/* The inline source is ordinary unregistered memory (IBV_SEND_INLINE:
	 * "The L_Key will not be checked", ibv_post_send(3)). */
	if (alloc_buf(&c->inl, "inline buffer",
		      3 * ((size_t)c->max_inline + 2 * GUARD) + 64)) {
		check(0, "allocate the inline buffer", "out of memory");
		return -1;
	}

	/* Exchange what the peer needs, as ibv_rc_pingpong does. */
	c->fd = c->server ? tcp_listen_accept(c->port) : tcp_connect(c->host, c->port);
	if (!check(c->fd >= 0, "out-of-band TCP connection", "%s port %d",
		   c->server ? "listening on" : c->host, c->port))
		return -1;
	srand48((long)getpid() ^ (long)time(NULL));
	c->psn = (uint32_t)lrand48() & 0xffffff;
	memset(&m, 0, sizeof(m));
	m.type = MSG_HELLO;
	m.test = MAGIC;
	m.size = c->max_size;
	m.val[0] = c->qp[0]->qp_num;
	m.val[1] = c->qp[1]->qp_num;
	m.val[2] = c->psn;
	m.op[0] = gid_word(&gid, 0);
	m.op[1] = gid_word(&gid, 1);
	m.addr[0] = (uintptr_t)c->main.p;
	m.sum[0] = c->main.mr->rkey;
	if (send_msg(c->fd, &m) || recv_msg(c->fd, &r, MSG_HELLO)) {
		check(0, "exchange QPN, GID, addresses and rkeys", "TCP channel failed");
		return -1;
	}
	if (!check(r.test == MAGIC, "the peer is an integrity program of this version",
		   "magic 0x%" PRIx64, r.test))
		return -1;
	c->peer.qpn[0] = (uint32_t)r.val[0];
	c->peer.qpn[1] = (uint32_t)r.val[1];
	c->peer.psn = (uint32_t)r.val[2];
	gid_set_word(&c->peer.gid, 0, r.op[0]);
	gid_set_word(&c->peer.gid, 1, r.op[1]);
	c->peer.main_addr = r.addr[0];
	c->peer.main_rkey = (uint32_t)r.sum[0];
	peer_max = r.size;
	if (peer_max < c->max_size)
		c->max_size = peer_max; /* both sides must hold every message */
	printf("# %s: local QPNs %u/%u, peer QPNs %u/%u, max size %zu, "
	       "max_inline_data %u, %s\n",
	       c->server ? "server" : "client", c->qp[0]->qp_num,
	       c->qp[1]->qp_num, c->peer.qpn[0], c->peer.qpn[1], c->max_size,
	       c->max_inline, c->use_wr_api ? "ibv_wr_* API" : "ibv_post_send");

	for (i = 0; i < 2; i++)
		if (qp_connect(c, i))
			return -1;
	/* Both sides are in RTS before any work is posted. */
	memset(&m, 0, sizeof(m));
	m.type = MSG_HELLO;
	m.test = MAGIC;
	if (send_msg(c->fd, &m) || recv_msg(c->fd, &r, MSG_HELLO))
		return -1;
	return 0;
}

static void teardown(struct ctx *c)
{
	int i;

	for (i = 0; i < 2; i++)
		if (c->qp[i])
			check(ibv_destroy_qp(c->qp[i]) == 0, "ibv_destroy_qp", "QP %d",
			      i);
	if (c->srq)
		check(ibv_destroy_srq(c->srq) == 0, "ibv_destroy_srq", "failed");
	if (c->main.mr)
		ibv_dereg_mr(c->main.mr);
	if (c->second.mr)
		ibv_dereg_mr(c->second.mr);
	if (c->sync.mr)
		ibv_dereg_mr(c->sync.mr);
	if (c->scq)
		ibv_destroy_cq(c->scq);
	if (c->rcq)
		ibv_destroy_cq(c->rcq);
	if (c->pd)
		check(ibv_dealloc_pd(c->pd) == 0, "ibv_dealloc_pd", "failed");
	if (c->ctx)
		check(ibv_close_device(c->ctx) == 0, "ibv_close_device", "failed");
	free(c->main.p);
	free(c->second.p);
	free(c->sync.p);
	free(c->inl.p);
	if (c->fd >= 0)
		close(c->fd);
}

/* ------------------------------------------------------------------------ */
/* Posting and polling                                                       */
/* ------------------------------------------------------------------------ */

/* One send-queue WR as this program describes it. */
struct wr_desc {
	enum op op;
	uint64_t wr_id;
	int signaled, inl;
	struct span *sp; /* local data: source, Read sink or atomic result */
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm; /* host order */
	uint64_t cmp_add, swap;
};

/* After an inline WR is posted its source may be reused at once
 * (ibv_post_send(3); ibv_wr_set_inline_data copies "during the setter",
 * ibv_wr_post(3)): overwrite it to prove the provider does not read it later. */
static void scribble(const struct span *sp)
{
	int k;

	for (k = 0; k < sp->n; k++)
		memset(sp->s[k].b->p + sp->s[k].off, 0xdb, sp->s[k].len);
}

/* SGEs of a span; zero-length segments are left out (a 0-byte message has
 * num_sge 0). */
static int to_sges(const struct span *sp, struct ibv_sge *sge)
{
	int k, n = 0;

	for (k = 0; k < sp->n; k++) {
		if (!sp->s[k].len)
			continue;
		sge[n].addr = (uintptr_t)(sp->s[k].b->p + sp->s[k].off);
		sge[n].length = sp->s[k].len;
		sge[n].lkey = sp->s[k].b->mr ? sp->s[k].b->mr->lkey : 0;
		n++;
	}
	return n;
}

static enum ibv_wr_opcode wr_opcode(enum op op)
{
	static const enum ibv_wr_opcode map[N_OPS] = {
		[OP_SEND] = IBV_WR_SEND,
		[OP_SEND_IMM] = IBV_WR_SEND_WITH_IMM,
		[OP_WRITE] = IBV_WR_RDMA_WRITE,
		[OP_WRITE_IMM] = IBV_WR_RDMA_WRITE_WITH_IMM,
		[OP_READ] = IBV_WR_RDMA_READ,
		[OP_FADD] = IBV_WR_ATOMIC_FETCH_AND_ADD,
		[OP_CSWAP] = IBV_WR_ATOMIC_CMP_AND_SWP,
	};
	return map[op];
}

/*
 * Post `n` WRs as ONE ibv_post_send chain, or as one
 * ibv_wr_start()..ibv_wr_complete() region with -N. Returns 0 or an errno
 * value; *bad is the index of the WR that was refused.
 */
static int post_wrs(struct ctx *c, int qpi, struct wr_desc *d, int n, int *bad)
{
	struct ibv_sge sge[MAX_WR + 1][3];
	int i, ret;

	*bad = 0;
	if (c->use_wr_api) {
		struct ibv_qp_ex *qx = c->qpx[qpi];

		ibv_wr_start(qx);
		for (i = 0; i < n; i++) {
			int ns = to_sges(d[i].sp, sge[i]);

			qx->wr_id = d[i].wr_id;
			qx->wr_flags = d[i].signaled ? IBV_SEND_SIGNALED : 0;
			switch (d[i].op) {
			case OP_SEND:
				ibv_wr_send(qx);
				break;
			case OP_SEND_IMM:
				ibv_wr_send_imm(qx, htobe32(d[i].imm));
				break;
			case OP_WRITE:
				ibv_wr_rdma_write(qx, d[i].rkey, d[i].raddr);
				break;
			case OP_WRITE_IMM:
				ibv_wr_rdma_write_imm(qx, d[i].rkey, d[i].raddr,
						      htobe32(d[i].imm));
				break;
			case OP_READ:
				ibv_wr_rdma_read(qx, d[i].rkey, d[i].raddr);
				break;
			case OP_FADD:
				ibv_wr_atomic_fetch_add(qx, d[i].rkey, d[i].raddr,
							d[i].cmp_add);
				break;
			default:
				ibv_wr_atomic_cmp_swp(qx, d[i].rkey, d[i].raddr,
						      d[i].cmp_add, d[i].swap);
				break;
			}
			if (d[i].inl) {
				struct ibv_data_buf db[3];
				int k;

				for (k = 0; k < ns; k++) {
					db[k].addr = (void *)(uintptr_t)sge[i][k].addr;
					db[k].length = sge[i][k].length;
				}
				if (ns == 1)
					ibv_wr_set_inline_data(qx, db[0].addr, db[0].length);
				else
					ibv_wr_set_inline_data_list(qx, (size_t)ns, db);
				scribble(d[i].sp);
			} else if (ns == 1) {
				ibv_wr_set_sge(qx, sge[i][0].lkey, sge[i][0].addr,
					       sge[i][0].length);
			} else {
				ibv_wr_set_sge_list(qx, (size_t)ns, sge[i]);
			}
		}
		return ibv_wr_complete(qx);
	} else {
		struct ibv_send_wr wr[MAX_WR + 1], *bad_wr = NULL;

		memset(wr, 0, sizeof(wr));
		for (i = 0; i < n; i++) {
			wr[i].wr_id = d[i].wr_id;
			wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
			wr[i].sg_list = sge[i];
			wr[i].num_sge = to_sges(d[i].sp, sge[i]);
			wr[i].opcode = wr_opcode(d[i].op);
			wr[i].send_flags = (d[i].signaled ? IBV_SEND_SIGNALED : 0) |
					   (d[i].inl ? IBV_SEND_INLINE : 0);
			if (d[i].op == OP_SEND_IMM || d[i].op == OP_WRITE_IMM)
				wr[i].imm_data = htobe32(d[i].imm);
			if (is_atomic(d[i].op)) {
				wr[i].wr.atomic.remote_addr = d[i].raddr;
				wr[i].wr.atomic.rkey = d[i].rkey;
				wr[i].wr.atomic.compare_add = d[i].cmp_add;
				wr[i].wr.atomic.swap = d[i].swap;
			} else {
				wr[i].wr.rdma.remote_addr = d[i].raddr;
				wr[i].wr.rdma.rkey = d[i].rkey;
			}
		}
		ret = ibv_post_send(c->qp[qpi], wr, &bad_wr);
		if (ret) {
			*bad = bad_wr ? (int)(bad_wr - wr) : 0;
			return ret;
		}
		for (i = 0; i < n; i++)
			if (d[i].inl)
				scribble(d[i].sp);
		return 0;
	}
}

static int post_recv_span(struct ctx *c, int qpi, uint64_t wr_id,
			  const struct span *sp, uint32_t slack)
{
	struct ibv_sge sge[3];
	struct ibv_recv_wr wr, *bad = NULL;
	int k;

	for (k = 0; k < sp->n; k++) {
		sge[k].addr = (uintptr_t)(sp->s[k].b->p + sp->s[k].off);
		sge[k].length = sp->s[k].len;
		sge[k].lkey = sp->s[k].b->mr->lkey;
	}
	sge[sp->n - 1].length += slack;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = sge;
	wr.num_sge = sp->n;
	if (qpi == 1 && c->srq)
		return ibv_post_srq_recv(c->srq, &wr, &bad);
	return ibv_post_recv(c->qp[qpi], &wr, &bad);
}

/*
 * Poll until `want` completions arrived or WAIT_S passed. The provider
 * progresses in its own thread: yield the CPU (this machine has 2) instead
 * of spinning.
 */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int want)
{
	double deadline = now_s() + WAIT_S;
	int got = 0, idle = 0;

	while (got < want) {
		int n = ibv_poll_cq(cq, want - got, wc + got);

		if (n < 0)
			return got;
		got += n;
		if (n > 0) {
			idle = 0;
			continue;
		}
		if (++idle < 200) {
			sched_yield();
			continue;
		}
		if (now_s() > deadline)
			break;
		usleep(200);
	}
	return got;
}

static const char *wc_opcode_str(enum ibv_wc_opcode o)
{
	switch (o) {
	case IBV_WC_SEND: return "SEND";
	case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "RDMA_READ";
	case IBV_WC_COMP_SWAP: return "COMP_SWAP";
	case IBV_WC_FETCH_ADD: return "FETCH_ADD";
	case IBV_WC_RECV: return "RECV";
	case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
	default: return "other";
	}
}

/*
 * One completion, every field that ibv_poll_cq(3) defines for it. For
 * receive completions (`recv` set) also byte_len — "Relevant if the Receive
 * Queue for incoming Send or RDMA Write with immediate operations"; for
 * IBV_WC_RECV_RDMA_WITH_IMM it is the number of bytes the Write placed (the
 * IBA rule, which made Linux rxe fix its 0 in commit bdce1290493c, "Fill in
 * wc byte_len with IB_WC_RECV_RDMA_WITH_IMM"; mlx5 does the same) — and
 * wc_flags: exactly IBV_WC_WITH_IMM when immediate data came (IBV_WC_GRH is
 * UD-only, IBV_WC_IP_CSUM_OK needs a checksum-offload capability the device
 * does not claim), with imm_data as the sender posted it.
 */
static int check_wc(const struct ibv_wc *wc, const char *what, uint64_t wr_id,
		    enum ibv_wc_opcode opcode, uint32_t qp_num, int recv,
		    uint32_t byte_len, int with_imm, uint32_t imm)
{
	char why[512] = "";

	if (wc->status != IBV_WC_SUCCESS)
		addf(why, sizeof(why), "status %s (vendor_err 0x%x), want SUCCESS; ",
		     ibv_wc_status_str(wc->status), wc->vendor_err);
	if (wc->wr_id != wr_id)
		addf(why, sizeof(why), "wr_id 0x%" PRIx64 ", want 0x%" PRIx64 "; ",
		     wc->wr_id, wr_id);
	if (wc->qp_num != qp_num)
		addf(why, sizeof(why), "qp_num %u, want %u; ", wc->qp_num, qp_num);
	/* Only wr_id, status, qp_num and vendor_err are valid in an error
	 * completion (ibv_poll_cq(3)). */
	if (wc->status == IBV_WC_SUCCESS) {
		if (wc->opcode != opcode)
			addf(why, sizeof(why), "opcode %s (%d), want %s; ",
			     wc_opcode_str(wc->opcode), wc->opcode,
			     wc_opcode_str(opcode));
		if (recv && wc->byte_len != byte_len)
			addf(why, sizeof(why), "byte_len %u, want %u; ", wc->byte_len,
			     byte_len);
		if (recv && wc->wc_flags != (with_imm ? IBV_WC_WITH_IMM : 0u))
			addf(why, sizeof(why), "wc_flags 0x%x, want 0x%x; ",
			     wc->wc_flags, with_imm ? IBV_WC_WITH_IMM : 0u);
		if (recv && with_imm && be32toh(wc->imm_data) != imm)
			addf(why, sizeof(why), "imm_data 0x%08x, want 0x%08x; ",
			     be32toh(wc->imm_data), imm);
	}
	if (why[0])
		why[strlen(why) - 2] = '\0';
	return check(!why[0], what, "%s", why);
}

/* ------------------------------------------------------------------------ */
/* Data tests (everything but atomics)                                       */
/* ------------------------------------------------------------------------ */

static void test_from_msg(struct test *t, const struct msg *m)
{
	int i;

	memset(t, 0, sizeof(*t));
	t->no = (unsigned)m->test;
	t->var = (enum variant)m->variant;
	t->qpi = (int)m->qpi;
	t->nwr = (int)m->nwr;
	t->size = m->size;
	t->sync = (int)m->sync;
	for (i = 0; i < MAX_WR; i++)
		t->op[i] = (enum op)m->op[i];
	for (i = 0; i < 4; i++)
		t->val[i] = m->val[i];
}

static void msg_from_test(struct msg *m, const struct test *t, enum msg_type type)
{
	int i;

	memset(m, 0, sizeof(*m));
	m->type = type;
	m->test = t->no;
	m->variant = t->var;
	m->qpi = (uint64_t)t->qpi;
	m->nwr = (uint64_t)t->nwr;
	m->size = t->size;
	m->sync = (uint64_t)t->sync;
	for (i = 0; i < MAX_WR; i++)
		m->op[i] = t->op[i];
	for (i = 0; i < 4; i++)
		m->val[i] = t->val[i];
}

/* Where WR i lands on the server (or, for a Read, where it comes from). */
static void server_span(struct ctx *c, const struct test *t, int i, struct span *sp)
{
	size_t base = (size_t)i * stride(t->size);
	enum split how = (t->op[i] == OP_SEND || t->op[i] == OP_SEND_IMM)
				 ? sink_split(t) : SPLIT_NONE;

	layout(sp, &c->main, &c->second, base, misalign(t, i), t->size, how);
}

/* WR i's source (or, for a Read, its sink) on the client. */
static void client_span(struct ctx *c, const struct test *t, int i, struct span *sp)
{
	size_t base = (size_t)i * stride(t->size);

	if (t->op[i] == OP_READ)
		layout(sp, &c->main, &c->second, base, misalign(t, i), t->size,
		       sink_split(t));
	else if (t->var == V_INLINE || t->var == V_INLINE3)
		layout(sp, &c->inl, &c->inl, 0, misalign(t, i), t->size,
		       src_split(t));
	else
		layout(sp, &c->main, &c->second, base, misalign(t, i), t->size,
		       src_split(t));
}

static void scratch_span(struct ctx *c, int i, struct span *sp)
{
	sp->n = 1;
	sp->s[0].b = &c->sync;
	sp->s[0].off = SCRATCH_OFF + (size_t)i * (SCRATCH_LEN + 2 * GUARD) + GUARD;
	sp->s[0].len = SCRATCH_LEN;
}

static void sync_span(struct ctx *c, struct span *sp)
{
	sp->n = 1;
	sp->s[0].b = &c->sync;
	sp->s[0].off = GUARD;
	sp->s[0].len = SYNC_LEN;
}

/* The server's half of one data test. */
static int server_data_test(struct ctx *c, const struct msg *tm)
{
	struct test t;
	struct span sp[MAX_WR], scratch[MAX_WR], syncsp;
	struct ibv_wc wc[MAX_WR + 1];
	struct msg m, done;
	uint64_t src_sum[MAX_WR];
	int consumers[MAX_WR + 1], nrecv = 0, i, ret, got, failed0 = n_failed;
	char what[96];

	test_from_msg(&t, tm);
	set_tname(&t);
	msg_from_test(&m, &t, MSG_READY);
	if (t.nwr < 1 || t.nwr > MAX_WR || t.size > c->max_size) {
		fprintf(stderr, "integrity: bad test request\n");
		return -1;
	}
	/* Receives must be posted before the Sends arrive: iWARP has no RNR
	 * retry; an untagged DDP message that finds no posted buffer is a
	 * fatal stream error (RFC 5041 "No Buffer Available"; siw and uiw
	 * answer it with a Terminate). */
	for (i = 0; i < t.nwr; i++) {
		enum op op = t.op[i];

		server_span(c, &t, i, &sp[i]);
		fill_guard(&sp[i]);
		m.addr[i] = (uintptr_t)(sp[i].s[0].b->p + sp[i].s[0].off);
		if (op == OP_READ) {
			fill_random(&sp[i], data_seed(&t, i) ^ 0x5e5e);
			src_sum[i] = m.sum[i] = span_sum(&sp[i]);
		}
		ret = 0;
		if (op == OP_SEND || op == OP_SEND_IMM) {
			ret = post_recv_span(c, t.qpi, recv_wr_id(&t, i), &sp[i], SLACK);
		} else if (op == OP_WRITE_IMM) {
			/* The Write's data goes to the rkey's memory; the receive
			 * WR only delivers the immediate data — its buffer must
			 * stay untouched. */
			scratch_span(c, i, &scratch[i]);
			fill_guard(&scratch[i]);
			ret = post_recv_span(c, t.qpi, recv_wr_id(&t, i), &scratch[i], 0);
		}
		if (consumes_recv(op))
			consumers[nrecv++] = i;
		if (ret) {
			check(0, "post the receive", "ibv_post_%srecv: %s",
			      t.qpi == 1 ? "srq_" : "", strerror(ret));
			c->broken = 1;
		}
	}
	if (t.sync) {
		sync_span(c, &syncsp);
		fill_guard(&syncsp);
		ret = post_recv_span(c, t.qpi, recv_wr_id(&t, 0xff), &syncsp, 0);
		if (ret) {
			check(0, "post the receive for the sync SEND", "%s",
			      strerror(ret));
			c->broken = 1;
		}
		consumers[nrecv++] = -1;
	}
	m.status = (uint64_t)c->broken;
	if (send_msg(c->fd, &m) || recv_msg(c->fd, &done, MSG_DONE))
		return -1;
	if (done.status) {
		/* The client could not post: nothing will arrive. */
		c->broken = 1;
		msg_from_test(&m, &t, MSG_RESULT);
		m.status = (uint64_t)(n_failed - failed0);
		return send_msg(c->fd, &m);
	}

	/* Receive completions, in the order the client posted the WRs. */
	got = nrecv ? poll_n(c->rcq, wc, nrecv) : 0;
	for (i = 0; i < nrecv; i++) {
		int w = consumers[i];

		if (i >= got) {
			check(0, w < 0 ? "receive completion of the sync SEND"
				       : "receive completion",
			      "only %d of %d receive completions arrived in %.0f s",
			      got, nrecv, WAIT_S);
			c->broken = 1;
			break;
		}
		if (w < 0) {
			uint64_t v;

			check_wc(&wc[i], "receive completion of the sync SEND",
				 recv_wr_id(&t, 0xff), IBV_WC_RECV,
				 c->qp[t.qpi]->qp_num, 1, SYNC_LEN, 0, 0);
			memcpy(&v, c->sync.p + syncsp.s[0].off, sizeof(v));
			check(v == t.no, "sync SEND data", "got %" PRIu64 ", want %u",
			      v, t.no);
			continue;
		}
		snprintf(what, sizeof(what), t.nwr > 1 ? "WR %d: receive completion"
						       : "receive completion", w);
		check_wc(&wc[i], what, recv_wr_id(&t, w),
			 t.op[w] == OP_WRITE_IMM ? IBV_WC_RECV_RDMA_WITH_IMM
						 : IBV_WC_RECV,
			 c->qp[t.qpi]->qp_num, 1, (uint32_t)t.size,
			 t.op[w] != OP_SEND, imm_value(&t, w));
		if (wc[i].status != IBV_WC_SUCCESS)
			c->broken = 1;
	}
	if (ibv_poll_cq(c->rcq, 1, wc) != 0)
		check(0, "no unexpected receive completion",
		      "an extra completion: wr_id 0x%" PRIx64 " status %s",
		      wc[0].wr_id, ibv_wc_status_str(wc[0].status));

	/* What landed. */
	msg_from_test(&m, &t, MSG_RESULT);
	for (i = 0; i < t.nwr; i++) {
		char why[200];
		const char *pfx = t.nwr > 1 ? "WR " : "";
		char wno[16] = "";

		if (t.nwr > 1)
			snprintf(wno, sizeof(wno), "%d: ", i);
		if (t.op[i] == OP_READ) {
			uint64_t now = span_sum(&sp[i]);

			snprintf(what, sizeof(what), "%s%sdata read by the client matches the source",
				 pfx, wno);
			check(done.sum[i] == src_sum[i], what,
			      "client's checksum of what landed 0x%016" PRIx64
			      ", source 0x%016" PRIx64 " (%zu bytes)",
			      done.sum[i], src_sum[i], t.size);
			snprintf(what, sizeof(what), "%s%sRead source and its guard bytes untouched",
				 pfx, wno);
			why[0] = '\0';
			if (now != src_sum[i])
				snprintf(why, sizeof(why), "source checksum changed");
			else
				guards_ok(&sp[i], why, sizeof(why));
			check(!why[0], what, "%s", why);
			m.sum[i] = now;
			continue;
		}
		m.sum[i] = span_sum(&sp[i]);
		snprintf(what, sizeof(what), "%s%slanded data matches the source (%d SGE%s)",
			 pfx, wno, sp[i].n, sp[i].n > 1 ? "s" : "");
		check(m.sum[i] == done.sum[i], what,
		      "checksum of the %zu bytes that landed 0x%016" PRIx64
		      ", client's source 0x%016" PRIx64, span_len(&sp[i]),
		      m.sum[i], done.sum[i]);
		snprintf(what, sizeof(what), "%s%sguard bytes untouched", pfx, wno);
		why[0] = '\0';
		/* For a Write with Immediate the receive WR's buffer must not
		 * be written either: only the immediate data is delivered. */
		if (guards_ok(&sp[i], why, sizeof(why)) && t.op[i] == OP_WRITE_IMM &&
		    !untouched(&scratch[i], why, sizeof(why)))
			addf(why, sizeof(why), " (the receive buffer of the Write "
			     "with Immediate)");
		check(!why[0], what, "%s", why);
	}
	m.status = (uint64_t)(n_failed - failed0);
	return send_msg(c->fd, &m);
}

/* The client's half of one data test. */
static void client_data_test(struct ctx *c, struct test *t)
{
	struct span sp[MAX_WR], syncsp;
	struct wr_desc d[MAX_WR + 1];
	struct ibv_wc wc[MAX_WR + 2];
	struct msg m, ready, result;
	uint64_t sum[MAX_WR];
	int nd = 0, nsig = 0, i, k, ret, bad, got;
	char what[96];

	set_tname(t);
	msg_from_test(&m, t, MSG_TEST);
	if (send_msg(c->fd, &m) || recv_msg(c->fd, &ready, MSG_READY)) {
		c->broken = 1;
		check(0, "server prepared the test", "TCP channel failed");
		return;
	}
	if (ready.status) {
		c->broken = 1;
		check(0, "server prepared the test", "the server could not post receives");
	}

	for (i = 0; i < t->nwr; i++) {
		client_span(c, t, i, &sp[i]);
		if (t->op[i] == OP_READ) {
			fill_guard(&sp[i]);
			sum[i] = 0;
		} else {
			fill_random(&sp[i], data_seed(t, i));
			sum[i] = span_sum(&sp[i]);
		}
		memset(&d[nd], 0, sizeof(d[nd]));
		d[nd].op = t->op[i];
		d[nd].wr_id = send_wr_id(t, i);
		d[nd].signaled = t->var != V_UNSIG || i == t->nwr - 1;
		d[nd].inl = t->var == V_INLINE || t->var == V_INLINE3;
		d[nd].sp = &sp[i];
		d[nd].raddr = ready.addr[i];
		d[nd].rkey = c->peer.main_rkey;
		d[nd].imm = imm_value(t, i);
		nd++;
	}
	if (t->sync) {
		/* RDMA Write has no completion at the responder: a Send that
		 * follows it on the same QP completes there only after the
		 * Write's data was placed (RFC 5040 5.5, ordering). */
		uint64_t v = t->no;

		sync_span(c, &syncsp);
		memcpy(c->sync.p + syncsp.s[0].off, &v, sizeof(v));
		memset(&d[nd], 0, sizeof(d[nd]));
		d[nd].op = OP_SEND;
		d[nd].wr_id = send_wr_id(t, 0xff);
		d[nd].signaled = 1;
		d[nd].sp = &syncsp;
		nd++;
	}
	for (i = 0; i < nd; i++)
		nsig += d[i].signaled;

	ret = 0;
	bad = 0;
	if (!c->broken) {
		if (t->var == V_BATCH) {
			ret = post_wrs(c, t->qpi, d, nd, &bad);
		} else {
			for (i = 0; i < nd && !ret; i++) {
				ret = post_wrs(c, t->qpi, &d[i], 1, &bad);
				bad = i;
			}
		}
	}
	if (!c->broken && !check(ret == 0, c->use_wr_api ? "ibv_wr_complete" : "ibv_post_send",
				 "%s (%d) for WR %d (%s)", strerror(ret), ret, bad,
				 op_name(d[bad].op)))
		c->broken = 1;
	if (c->broken) {
		msg_from_test(&m, t, MSG_DONE);
		m.status = 1;
		if (!send_msg(c->fd, &m))
			recv_msg(c->fd, &result, MSG_RESULT);
		return;
	}

	/* Send completions: exactly one per signaled WR, in posting order
	 * (an RC send queue completes in order; unsignaled WRs produce none). */
	got = poll_n(c->scq, wc, nsig);
	for (i = 0, k = 0; i < nd; i++) {
		if (!d[i].signaled)
			continue;
		if (d[i].wr_id == send_wr_id(t, 0xff))
			snprintf(what, sizeof(what), "send completion of the sync SEND");
		else if (t->nwr > 1)
			snprintf(what, sizeof(what), "WR %d (%s): send completion", i,
				 op_name(d[i].op));
		else
			snprintf(what, sizeof(what), "send completion");
		if (k >= got) {
			check(0, what, "only %d of %d send completions arrived in %.0f s",
			      got, nsig, WAIT_S);
			c->broken = 1;
			break;
		}
		check_wc(&wc[k], what, d[i].wr_id, send_wc_opcode(d[i].op),
			 c->qp[t->qpi]->qp_num, 0, 0, 0, 0);
		if (wc[k].status != IBV_WC_SUCCESS)
			c->broken = 1;
		k++;
	}
	/* Unsignaled WRs must not complete (sq_sig_all = 0): give a stray
	 * completion a moment to show up. Elsewhere, only look. */
	if (t->var == V_UNSIG)
		usleep(5000);
	ret = ibv_poll_cq(c->scq, 1, wc);
	if (t->var == V_UNSIG || ret != 0)
		check(ret == 0, "no completion for the unsignaled WRs, none extra",
		      "an extra send completion: wr_id 0x%" PRIx64 " status %s",
		      wc[0].wr_id, ibv_wc_status_str(wc[0].status));

	/* Reads landed here: the completion means the data is placed. */
	for (i = 0; i < t->nwr; i++) {
		char why[200] = "";
		char wno[24] = "";

		if (t->op[i] != OP_READ)
			continue;
		if (t->nwr > 1)
			snprintf(wno, sizeof(wno), "WR %d: ", i);
		sum[i] = span_sum(&sp[i]);
		snprintf(what, sizeof(what), "%sdata read matches the server's source (%d SGE%s)",
			 wno, sp[i].n, sp[i].n > 1 ? "s" : "");
		check(sum[i] == ready.sum[i], what,
		      "checksum of the %zu bytes that landed 0x%016" PRIx64
		      ", server's source 0x%016" PRIx64,
		      t->size, sum[i], ready.sum[i]);
		snprintf(what, sizeof(what), "%sguard bytes around the Read sink untouched",
			 wno);
		guards_ok(&sp[i], why, sizeof(why));
		check(!why[0], what, "%s", why);
	}

	msg_from_test(&m, t, MSG_DONE);
	for (i = 0; i < t->nwr; i++)
		m.sum[i] = sum[i];
	if (send_msg(c->fd, &m) || recv_msg(c->fd, &result, MSG_RESULT)) {
		c->broken = 1;
		check(0, "server's verdict", "TCP channel failed");
		return;
	}
	/* The other side's view of what landed, compared here too. */
	for (i = 0; i < t->nwr; i++) {
		char wno[24] = "";

		if (t->op[i] == OP_READ)
			continue;
		if (t->nwr > 1)
			snprintf(wno, sizeof(wno), "WR %d: ", i);
		snprintf(what, sizeof(what), "%sserver's checksum of what landed matches",
			 wno);
		check(result.sum[i] == sum[i], what,
		      "server 0x%016" PRIx64 ", source 0x%016" PRIx64 " (%zu bytes)",
		      result.sum[i], sum[i], t->size);
	}
	if (result.status)
		printf("# the server reported %" PRIu64 " failed check(s) for this test\n",
		       result.status);
}

/* ------------------------------------------------------------------------ */
/* Atomics                                                                   */
/* ------------------------------------------------------------------------ */

/*
 * The 64-bit target lives in the server's memory in host byte order and is
 * changed as ibv_wr_post(3) describes: FETCH_AND_ADD adds, CMP_AND_SWP swaps
 * if equal; both return the ORIGINAL value into the local SGE (8 bytes).
 */
static int server_atomic_test(struct ctx *c, const struct msg *tm)
{
	struct test t;
	struct span sp;
	struct msg m, done;
	uint64_t v;
	char why[200] = "";
	int failed0 = n_failed;

	test_from_msg(&t, tm);
	set_tname(&t);
	layout(&sp, &c->main, &c->main, 0, 0, 8, SPLIT_NONE);
	fill_guard(&sp);
	memcpy(sp.s[0].b->p + sp.s[0].off, &t.val[0], 8);
	msg_from_test(&m, &t, MSG_READY);
	m.addr[0] = (uintptr_t)(sp.s[0].b->p + sp.s[0].off);
	memcpy(&m.val[0], sp.s[0].b->p + sp.s[0].off, 8);
	if (send_msg(c->fd, &m) || recv_msg(c->fd, &done, MSG_DONE))
		return -1;
	msg_from_test(&m, &t, MSG_RESULT);
	if (done.status) {
		c->broken = 1;
		return send_msg(c->fd, &m);
	}
	memcpy(&v, sp.s[0].b->p + sp.s[0].off, 8);
	check(v == done.val[0], "target holds the expected new value",
	      "0x%016" PRIx64 ", want 0x%016" PRIx64 " (was 0x%016" PRIx64 ")", v,
	      done.val[0], t.val[0]);
	guards_ok(&sp, why, sizeof(why));
	check(!why[0], "guard bytes around the 8-byte target untouched", "%s", why);
	m.val[0] = v;
	m.status = (uint64_t)(n_failed - failed0);
	return send_msg(c->fd, &m);
}

static void client_atomic_test(struct ctx *c, struct test *t)
{
	struct span sp[MAX_WR];
	struct wr_desc d[MAX_WR];
	struct ibv_wc wc[MAX_WR + 1];
	struct msg m, ready, result;
	uint64_t expect_final, cur;
	int i, ret, bad = 0, got;
	char what[96];

	set_tname(t);
	msg_from_test(&m, t, MSG_TEST);
	if (send_msg(c->fd, &m) || recv_msg(c->fd, &ready, MSG_READY)) {
		c->broken = 1;
		return;
	}
	cur = ready.val[0];
	check(cur == t->val[0], "server set the initial value",
	      "0x%016" PRIx64 ", want 0x%016" PRIx64, cur, t->val[0]);
	for (i = 0; i < t->nwr; i++) {
		layout(&sp[i], &c->main, &c->main, (size_t)i * stride(8), 0, 8,
		       SPLIT_NONE);
		fill_guard(&sp[i]);
		memset(&d[i], 0, sizeof(d[i]));
		d[i].op = t->op[i];
		d[i].wr_id = send_wr_id(t, i);
		d[i].signaled = 1;
		d[i].sp = &sp[i];
		d[i].raddr = ready.addr[0];
		d[i].rkey = c->peer.main_rkey;
		d[i].cmp_add = t->val[1];
		d[i].swap = t->val[2];
	}
	ret = post_wrs(c, 0, d, t->nwr, &bad);
	if (!check(ret == 0, c->use_wr_api ? "ibv_wr_complete" : "ibv_post_send",
		   "%s (%d) for WR %d", strerror(ret), ret, bad)) {
		c->broken = 1;
		msg_from_test(&m, t, MSG_DONE);
		m.status = 1;
		if (!send_msg(c->fd, &m))
			recv_msg(c->fd, &result, MSG_RESULT);
		return;
	}
	got = poll_n(c->scq, wc, t->nwr);
	for (i = 0; i < t->nwr; i++) {
		uint64_t want = cur, ret_val;
		char why[200] = "";

		snprintf(what, sizeof(what), t->nwr > 1 ? "WR %d: completion" : "completion", i);
		if (i >= got) {
			check(0, what, "only %d of %d completions arrived in %.0f s", got,
			      t->nwr, WAIT_S);
			c->broken = 1;
			break;
		}
		check_wc(&wc[i], what, d[i].wr_id, send_wc_opcode(d[i].op),
			 c->qp[0]->qp_num, 0, 0, 0, 0);
		if (wc[i].status != IBV_WC_SUCCESS)
			c->broken = 1;
		memcpy(&ret_val, sp[i].s[0].b->p + sp[i].s[0].off, 8);
		snprintf(what, sizeof(what),
			 t->nwr > 1 ? "WR %d: returned the original value"
				    : "returned the original value", i);
		check(ret_val == want, what, "0x%016" PRIx64 ", want 0x%016" PRIx64,
		      ret_val, want);
		snprintf(what, sizeof(what),
			 t->nwr > 1 ? "WR %d: guard bytes around the result untouched"
				    : "guard bytes around the result untouched", i);
		guards_ok(&sp[i], why, sizeof(why));
		check(!why[0], what, "%s", why);
		if (d[i].op == OP_FADD)
			cur += d[i].cmp_add;
		else if (cur == d[i].cmp_add)
			cur = d[i].swap;
	}
	expect_final = cur;
	msg_from_test(&m, t, MSG_DONE);
	m.val[0] = expect_final;
	if (send_msg(c->fd, &m) || recv_msg(c->fd, &result, MSG_RESULT)) {
		c->broken = 1;
		return;
	}
	check(result.val[0] == expect_final, "server sees the expected new value",
	      "0x%016" PRIx64 ", want 0x%016" PRIx64, result.val[0], expect_final);
}

/* ------------------------------------------------------------------------ */
/* The server: serve tests until the client says QUIT                        */
/* ------------------------------------------------------------------------ */

static void run_server(struct ctx *c)
{
	struct msg m;
	int ret;

	for (;;) {
		if (recv_msg(c->fd, &m, 0)) {
			tname[0] = '\0';
			check(0, "the client's next request", "TCP channel failed");
			return;
		}
		if (m.type == MSG_QUIT) {
			tname[0] = '\0';
			memset(&m, 0, sizeof(m));
			m.type = MSG_BYE;
			m.val[0] = (uint64_t)n_passed;
			m.val[1] = (uint64_t)n_failed;
			send_msg(c->fd, &m);
			return;
		}
		if (m.type != MSG_TEST) {
			check(0, "protocol", "unexpected message type %" PRIu64, m.type);
			return;
		}
		ret = m.variant == V_ATOMIC ? server_atomic_test(c, &m)
					    : server_data_test(c, &m);
		if (ret) {
			check(0, "the test's TCP exchange", "TCP channel failed");
			return;
		}
	}
}

/* ------------------------------------------------------------------------ */
/* The plan (client)                                                         */
/* ------------------------------------------------------------------------ */

static int cmp_size(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	return x < y ? -1 : x > y;
}

/* The sizes: edge cases around words, cache lines and pages, every power of
 * two up to `max`, odd sizes that straddle segments, and max-1, max. */
static int build_sizes(size_t max, size_t *out)
{
	static const size_t fixed[] = { 0, 1, 2, 3, 4, 7, 8, 63, 64, 65, 4095,
					4097, 65535, 65537, 1000003 };
	size_t all[64];
	int n = 0, m = 0, i;
	size_t p;

	for (i = 0; i < (int)(sizeof(fixed) / sizeof(fixed[0])); i++)
		all[n++] = fixed[i];
	for (p = 1; p <= max && p; p <<= 1)
		all[n++] = p;
	all[n++] = max - 1;
	all[n++] = max;
	qsort(all, (size_t)n, sizeof(all[0]), cmp_size);
	for (i = 0; i < n; i++)
		if (all[i] <= max && (m == 0 || out[m - 1] != all[i]))
			out[m++] = all[i];
	return m;
}

static void run_client(struct ctx *c)
{
	static const enum op data_ops[] = { OP_SEND, OP_SEND_IMM, OP_WRITE,
					    OP_WRITE_IMM, OP_READ };
	static const enum op mixed[MAX_WR] = { OP_WRITE, OP_SEND, OP_WRITE_IMM,
					       OP_READ, OP_SEND_IMM, OP_READ,
					       OP_WRITE, OP_SEND };
	static const size_t unsig_sizes[] = { 1, 4097, 65537 };
	static const size_t batch_sizes[] = { 0, 8, 4097, 65537, 1u << 20 };
	size_t sizes[64];
	int nsizes = build_sizes(c->max_size, sizes);
	unsigned no = 1;
	struct test t;
	int o, s, i, k;

#define RUN(...)                                                           \
	do {                                                               \
		if (c->broken)                                             \
			goto out;                                          \
		memset(&t, 0, sizeof(t));                                  \
		t.no = no++;                                               \
		t.nwr = 1;                                                 \
		__VA_ARGS__;                                               \
		for (i = 0; i < t.nwr; i++)                                \
			if (t.op[i] == OP_WRITE)                           \
				t.sync = 1;                                \
		if (t.var == V_ATOMIC)                                     \
			client_atomic_test(c, &t);                         \
		else                                                       \
			client_data_test(c, &t);                           \
	} while (0)

	/* 1. Every operation at every size, one SGE. */
	for (o = 0; o < 5; o++)
		for (s = 0; s < nsizes; s++)
			RUN(t.op[0] = data_ops[o]; t.size = sizes[s]);

	/* 2. Three SGEs over two MRs (source gathered, sink scattered), every
	 * size that gives each SGE at least one byte. */
	for (o = 0; o < 5; o++)
		for (s = 0; s < nsizes; s++)
			if (sizes[s] >= 3)
				RUN(t.op[0] = data_ops[o]; t.size = sizes[s];
				    t.var = V_SGE3);

	/* 3. Inline (Send and Write only, ibv_post_send(3)), up to the
	 * granted max_inline_data, which itself is tried. */
	for (o = 0; o < 4; o++) {
		for (s = 0; s <= nsizes; s++) {
			size_t sz = s < nsizes ? sizes[s] : c->max_inline;

			if (sz > c->max_inline || sz > c->max_size ||
			    (s < nsizes && sz == c->max_inline))
				continue;
			RUN(t.op[0] = data_ops[o]; t.size = sz; t.var = V_INLINE);
			if (sz >= 3)
				RUN(t.op[0] = data_ops[o]; t.size = sz;
				    t.var = V_INLINE3);
		}
	}

	/* 4. Unsignaled WRs, each posted alone, then a signaled one. */
	for (o = 0; o < 5; o++)
		for (s = 0; s < 3; s++)
			if (unsig_sizes[s] <= c->max_size)
				RUN(t.var = V_UNSIG; t.nwr = 4; t.size = unsig_sizes[s];
				    for (k = 0; k < 4; k++) t.op[k] = data_ops[o]);

	/* 5. A chain of WRs in one post: each op, then all mixed. */
	for (s = 0; s < 5; s++) {
		if (batch_sizes[s] > c->max_size)
			continue;
		for (o = 0; o < 5; o++)
			RUN(t.var = V_BATCH; t.nwr = MAX_WR; t.size = batch_sizes[s];
			    for (k = 0; k < MAX_WR; k++) t.op[k] = data_ops[o]);
		RUN(t.var = V_BATCH; t.nwr = MAX_WR; t.size = batch_sizes[s];
		    memcpy(t.op, mixed, sizeof(mixed)));
	}

	/* 6. Receives from an SRQ (the server's second QP). */
	for (o = 0; o < 4; o++)
		for (s = 0; s < nsizes; s++)
			RUN(t.op[0] = data_ops[o]; t.size = sizes[s]; t.var = V_SRQ;
			    t.qpi = 1);

	/* 7. Atomics: carries across 32 bits, wrap-around, compares that
	 * differ only in the low bit, bit 32 or bit 63 (a 32-bit compare
	 * would match), and a chain of adds to one address. */
	if (c->atomics) {
		uint64_t r1 = splitmix64(1), r2 = splitmix64(2), r3 = splitmix64(3);
		const struct {
			enum op op;
			uint64_t init, arg, swap;
		} cases[] = {
			{ OP_FADD, 0, 1, 0 },
			{ OP_FADD, 0xffffffffULL, 1, 0 },
			{ OP_FADD, ~0ULL, 1, 0 },
			{ OP_FADD, r1, r2, 0 },
			{ OP_CSWAP, r1, r1, r2 },
			{ OP_CSWAP, 0, 0, ~0ULL },
			{ OP_CSWAP, r1, r1 ^ 1, r2 },
			{ OP_CSWAP, r1, r1 ^ (1ULL << 32), r2 },
			{ OP_CSWAP, r1, r1 ^ (1ULL << 63), r2 },
		};

		for (k = 0; k < (int)(sizeof(cases) / sizeof(cases[0])); k++)
			RUN(t.var = V_ATOMIC; t.size = 8; t.op[0] = cases[k].op;
			    t.val[0] = cases[k].init; t.val[1] = cases[k].arg;
			    t.val[2] = cases[k].swap);
		RUN(t.var = V_ATOMIC; t.size = 8; t.nwr = 4; t.val[0] = r3;
		    t.val[1] = 0x0101010101010101ULL;
		    for (k = 0; k < 4; k++) t.op[k] = OP_FADD);
	}
#undef RUN
out:
	tname[0] = '\0';
	if (c->broken)
		check(0, "all tests ran", "stopped after test %u: a QP or the TCP channel failed",
		      no - 1);
}

/* ------------------------------------------------------------------------ */

static void usage(FILE *f, const char *argv0)
{
	fprintf(f,
		"Usage: %s -s [options]            server\n"
		"       %s -c HOST [options]       client (drives the tests)\n"
		"\n"
		"Checks the data integrity of SEND, SEND_WITH_IMM, RDMA_WRITE,\n"
		"RDMA_WRITE_WITH_IMM, RDMA_READ and the atomics at every size between\n"
		"two RC QPs connected without rdma_cm, as ibv_rc_pingpong -g does.\n"
		"\n"
		"Options (give the same -m, -N and -p to both sides):\n"
		"  -s            run as the server\n"
		"  -c HOST       run as the client, connecting to HOST\n"
		"  -d DEV        device (default uiw_lo)\n"
		"  -g GID_INDEX  local GID index (default 0)\n"
		"  -p PORT       TCP port of the out-of-band exchange (default %d)\n"
		"  -m SIZE       largest message, K/M suffixes allowed (default 8M)\n"
		"  -N            post with the ibv_wr_* API (ibv_qp_ex) instead of\n"
		"                ibv_post_send\n"
		"  -h, --help    this text\n"
		"\n"
		"Output: one \"ok N - ...\" / \"not ok N - ...\" line per check, then\n"
		"\"N passed, M failed\". Exit status 1 if any check failed, 2 on usage\n"
		"errors.\n",
		argv0, argv0, DEFAULT_PORT);
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s)
		return -1;
	if (*end == 'k' || *end == 'K')
		v <<= 10, end++;
	else if (*end == 'm' || *end == 'M')
		v <<= 20, end++;
	if (*end || v < 1 || v > (1ULL << 30))
		return -1;
	*out = (size_t)v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctx c;
	int opt;

	memset(&c, 0, sizeof(c));
	c.fd = -1;
	c.dev_name = "uiw_lo";
	c.port = DEFAULT_PORT;
	c.max_size = DEFAULT_MAX;
	while ((opt = getopt_long(argc, argv, "sc:d:g:p:m:Nh", longopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			c.server = 1;
			break;
		case 'c':
			c.host = optarg;
			break;
		case 'd':
			c.dev_name = optarg;
			break;
		case 'g':
			c.gidx = atoi(optarg);
			break;
		case 'p':
			c.port = atoi(optarg);
			break;
		case 'm':
			if (parse_size(optarg, &c.max_size)) {
				fprintf(stderr, "%s: bad size '%s' (1..1G)\n", argv[0], optarg);
				return 2;
			}
			break;
		case 'N':
			c.use_wr_api = 1;
			break;
		case 'h':
			usage(stdout, argv[0]);
			return 0;
		default:
			usage(stderr, argv[0]);
			return 2;
		}
	}
	if (optind != argc || c.server == (c.host != NULL) || c.port <= 0 ||
	    c.port > 65535 || c.gidx < 0) {
		usage(stderr, argv[0]);
		return 2;
	}
	printf("# integrity %s: device %s, GID index %d, max size %zu, %s\n",
	       c.server ? "server" : "client", c.dev_name, c.gidx, c.max_size,
	       c.use_wr_api ? "ibv_wr_* API" : "ibv_post_send");
	fflush(stdout);

	if (setup(&c) == 0) {
		double t0 = now_s();
		struct msg m;

		if (c.server) {
			run_server(&c);
		} else {
			run_client(&c);
			memset(&m, 0, sizeof(m));
			m.type = MSG_QUIT;
			if (send_msg(c.fd, &m) == 0 && recv_msg(c.fd, &m, MSG_BYE) == 0) {
				printf("# server: %" PRIu64 " passed, %" PRIu64 " failed\n",
				       m.val[0], m.val[1]);
				check(m.val[1] == 0 && m.val[0] > 0,
				      "the server passed all its checks",
				      "%" PRIu64 " failed on the server (see its output)",
				      m.val[1]);
			} else {
				check(0, "the server said goodbye", "TCP channel failed");
			}
		}
		printf("# %.1f s\n", now_s() - t0);
	}
	teardown(&c);
	printf("%d passed, %d failed\n", n_passed, n_failed);
	return n_failed ? 1 : 0;
}
