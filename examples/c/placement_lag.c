/*
 * placement_lag.c — how long after the initiator's RDMA Write completion the
 * data is visible at a passive target in the same process (issue 9).
 *
 * rdma-core's own tests (tests/test_qpex.py, test_qp_ex_rc_rdma_write) read
 * the target buffer right after the initiator polled the Write's completion,
 * in one process, without the target ever polling its CQ. On a hardware RNIC
 * the data is there by then; on a software provider it is there only once a
 * thread of the provider has read it from the stream and placed it. This
 * program measures that gap, and fails if the data never shows up.
 *
 * One process, two RC QPs on one device, each with its own CQ, connected to
 * each other without rdma_cm (GID index 0 and the other's QPN, exchanged in
 * the process, as ibv_rc_pingpong exchanges them across processes). QP "a"
 * is the initiator; QP "b" owns the registered target buffer and its CQ is
 * never polled (a passive target). Then, -n times:
 *   1. a fresh sequence number goes into the first and last 8 bytes of the
 *      source buffer, which a writes (signaled RDMA Write, -s bytes) into the
 *      target;
 *   2. a's CQ is polled until the Write's completion; timestamp t0;
 *   3. the target's last 8 bytes are read (volatile) until they hold the new
 *      sequence number; timestamp t1; the lag is t1 - t0 (0 when the data
 *      was already there at the first look);
 *   4. the first 8 bytes must hold it too (the whole message arrived).
 * A Write whose data is not visible within -t milliseconds of its completion
 * (or whose completion does not come within -t milliseconds, or is not a
 * success) ends the run with a message saying which and exit status 1: the
 * program never hangs.
 *
 * Build and run:
 *     cc -O2 -Wall -Werror -o placement_lag placement_lag.c -libverbs
 *     uiw run -- ./placement_lag [-d DEVICE] [-n ITERS] [-s SIZE] ...
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define DEFAULT_ITERS 10000
#define DEFAULT_WARMUP 100
#define DEFAULT_SIZE 8
#define DEFAULT_TIMEOUT_MS 1000
#define MAX_SIZE (1 << 30)

static void usage(FILE *f, const char *argv0)
{
	fprintf(f,
		"NAME\n"
		"    placement_lag - time from an RDMA Write's completion at the initiator to its\n"
		"    data being visible at a passive target in the same process\n"
		"\n"
		"SYNOPSIS\n"
		"    %s [-d DEVICE] [-n ITERS] [-w WARMUP] [-s SIZE] [-t MS] [-q] [-P] [-I MS] [-B MS]\n"
		"    %s -h | --help\n"
		"\n"
		"DESCRIPTION\n"
		"    Opens DEVICE, creates two RC QPs with a CQ each and connects them to each\n"
		"    other without rdma_cm (GID index 0, the other QP's number), registers a\n"
		"    SIZE-byte target buffer on QP b, and then, WARMUP + ITERS times: writes a\n"
		"    fresh sequence number (in the first and last 8 bytes of the message) from\n"
		"    QP a with a signaled RDMA Write, polls a's CQ until the Write's completion\n"
		"    (time t0), reads the target's last 8 bytes until they hold the new number\n"
		"    (time t1), and records t1 - t0; the first 8 bytes must then hold it too.\n"
		"    b's CQ is never polled: the target is passive, as in rdma-core's\n"
		"    tests/test_qpex.py (test_qp_ex_rc_rdma_write), which reads the target right\n"
		"    after the initiator's completion. The first WARMUP writes are checked but\n"
		"    not timed.\n"
		"\n"
		"    A Write whose completion does not arrive within MS milliseconds, completes\n"
		"    with an error, or whose data is not visible MS milliseconds after its\n"
		"    completion ends the run (exit status 1) with a line saying which.\n"
		"\n"
		"OPTIONS\n"
		"    -d DEVICE   the device (default: $UIW_DEVICE, else the first one listed)\n"
		"    -n ITERS    timed writes (default %d)\n"
		"    -w WARMUP   untimed writes first (default %d)\n"
		"    -s SIZE     bytes per Write, a multiple of 8, K/M suffixes allowed\n"
		"                (default %d; e.g. 4K)\n"
		"    -t MS       how long a completion or the data may take (default %d)\n"
		"    -q          print only the result lines\n"
		"    -P          poll the target's CQ between looks (an active target, for\n"
		"                comparison: a provider that serves a QP from ibv_poll_cq then\n"
		"                places the data in this thread; the CQ stays empty, a Write\n"
		"                without immediate data completes nothing at the target)\n"
		"    -X          look for a sequence number that is never written (a check of\n"
		"                the give-up path, for tests: the run must end after MS\n"
		"                milliseconds with exit status 1)\n"
		"    -I MS       afterwards, leave the connected QPs idle for MS milliseconds and\n"
		"                report what the provider's progress thread (the thread named\n"
		"                uiw-progress) did meanwhile: its context switches (wake-ups)\n"
		"                and CPU time, from /proc/self/task (an idle process takes no\n"
		"                periodic wake-ups, and a busy-poll after traffic must end)\n"
		"    -B MS       afterwards (after -I's wait, with both), poll the initiator's\n"
		"                CQ without pause for MS milliseconds, as an SPDK reactor or an\n"
		"                MPI rank does, and report the same of the progress thread\n"
		"                meanwhile (a thread that keeps polling drives its QP itself:\n"
		"                the progress thread need not wake for it)\n"
		"    -h, --help  this text\n"
		"\n"
		"OUTPUT\n"
		"    On success, besides the description lines:\n"
		"        visible: N of N writes\n"
		"        lag_us: p50=X p99=X p99.9=X max=X min=X mean=X n=N\n"
		"        first_look: K of N writes were already visible when the completion came\n"
		"    and with -I:\n"
		"        idle: ms=MS progress_threads=T switches=S cpu_ms=C\n"
		"    and with -B:\n"
		"        polling: ms=MS progress_threads=T switches=S cpu_ms=C polls=N\n"
		"    (microseconds, CLOCK_MONOTONIC). uiw-bench's placement_lag row reads the\n"
		"    lag_us line.\n"
		"\n"
		"EXIT STATUS\n"
		"    0 every write became visible; 1 a write failed, timed out or never became\n"
		"    visible; 2 a usage error, or the device, QPs or buffers could not be set up.\n"
		"\n"
		"EXAMPLE\n"
		"    uiw run -- placement_lag -n 10000 -s 4K\n",
		argv0, argv0, DEFAULT_ITERS, DEFAULT_WARMUP, DEFAULT_SIZE, DEFAULT_TIMEOUT_MS);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int parse_count(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
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
	if (*end || v < 8 || v > MAX_SIZE || v % 8)
		return -1;
	*out = (size_t)v;
	return 0;
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

	s->cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!s->cq)
		return -1;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = s->cq;
	ia.recv_cq = s->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	s->qp = ibv_create_qp(pd, &ia);
	if (!s->qp)
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct side *s, uint32_t peer_qpn)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
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
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(s->qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

/* The q-quantile (0 < q <= 1) of n sorted values: the smallest value at or
 * above which lies a fraction q of them (nearest rank). */
static uint64_t quantile(const uint64_t *v, long n, double q)
{
	long rank = (long)(q * (double)n + 0.999999);
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return v[rank - 1];
}

/* The context switches and CPU time (ms) of this process's threads named
 * uiw-progress, summed; returns how many there are. */
static int progress_stats(uint64_t *switches, double *cpu_ms)
{
	char path[320], line[256], comm[64];
	int n = 0;
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;

	*switches = 0;
	*cpu_ms = 0;
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		FILE *f;
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		comm[0] = 0;
		if (!fgets(comm, sizeof(comm), f))
			comm[0] = 0;
		fclose(f);
		if (strncmp(comm, "uiw-progress", 12) != 0)
			continue;
		n++;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		if ((f = fopen(path, "r"))) {
			unsigned long long v;
			while (fgets(line, sizeof(line), f))
				if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
				    sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
					*switches += v;
			fclose(f);
		}
		snprintf(path, sizeof(path), "/proc/self/task/%s/schedstat", e->d_name);
		if ((f = fopen(path, "r"))) {
			unsigned long long ns;
			if (fscanf(f, "%llu", &ns) == 1)
				*cpu_ms += (double)ns / 1e6;
			fclose(f);
		}
	}
	closedir(d);
	return n;
}

static double us(uint64_t ns)
{
	return (double)ns / 1000.0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *dev_name = getenv("UIW_DEVICE");
	long iters = DEFAULT_ITERS, warmup = DEFAULT_WARMUP, timeout_ms = DEFAULT_TIMEOUT_MS, idle_ms = 0, busy_ms = 0;
	size_t size = DEFAULT_SIZE;
	int quiet = 0, never = 0, active = 0, opt, num, rc = 2;
	struct ibv_device **list;
	struct side a = { 0 }, b = { 0 };
	unsigned char *src = NULL, *dst = NULL;
	struct ibv_mr *smr = NULL, *dmr = NULL;
	uint64_t *lag = NULL, timeout_ns, first_look = 0, sum = 0;
	volatile uint64_t *head, *tail;

	while ((opt = getopt_long(argc, argv, "d:n:w:s:t:qPXI:B:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'd':
			dev_name = optarg;
			break;
		case 'n':
			if (parse_count(optarg, 1, 100000000, &iters)) {
				fprintf(stderr, "%s: bad -n '%s' (1..100000000)\n", argv[0], optarg);
				return 2;
			}
			break;
		case 'w':
			if (parse_count(optarg, 0, 100000000, &warmup)) {
				fprintf(stderr, "%s: bad -w '%s' (0..100000000)\n", argv[0], optarg);
				return 2;
			}
			break;
		case 's':
			if (parse_size(optarg, &size)) {
				fprintf(stderr, "%s: bad -s '%s' (8..1G, a multiple of 8)\n", argv[0], optarg);
				return 2;
			}
			break;
		case 't':
			if (parse_count(optarg, 1, 3600000, &timeout_ms)) {
				fprintf(stderr, "%s: bad -t '%s' (1..3600000 ms)\n", argv[0], optarg);
				return 2;
			}
			break;
		case 'I':
			if (parse_count(optarg, 1, 3600000, &idle_ms)) {
				fprintf(stderr, "%s: bad -I '%s' (1..3600000 ms)\n", argv[0], optarg);
				return 2;
			}
			break;
		case 'B':
			if (parse_count(optarg, 1, 3600000, &busy_ms)) {
				fprintf(stderr, "%s: bad -B '%s' (1..3600000 ms)\n", argv[0], optarg);
				return 2;
			}
			break;
		case 'q':
			quiet = 1;
			break;
		case 'P':
			active = 1;
			break;
		case 'X':
			never = 1;
			break;
		case 'h':
			usage(stdout, argv[0]);
			return 0;
		default:
			usage(stderr, argv[0]);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr, argv[0]);
		return 2;
	}
	timeout_ns = (uint64_t)timeout_ms * 1000000u;

	list = ibv_get_device_list(&num);
	if (!list || num == 0) {
		fprintf(stderr, "placement_lag: no RDMA device (run it under `uiw run --`)\n");
		if (list)
			ibv_free_device_list(list);
		return 2;
	}
	for (int i = 0; i < num && !ctx; i++)
		if (!dev_name || strcmp(ibv_get_device_name(list[i]), dev_name) == 0) {
			dev_name = ibv_get_device_name(list[i]);
			ctx = ibv_open_device(list[i]);
		}
	if (!ctx || ibv_query_gid(ctx, 1, 0, &gid) || !(pd = ibv_alloc_pd(ctx))) {
		fprintf(stderr, "placement_lag: cannot open %s: %s\n", dev_name ? dev_name : "a device",
			strerror(errno));
		ibv_free_device_list(list);
		goto out;
	}
	if (!quiet)
		printf("placement_lag: device %s, %zu-byte RDMA Writes, %ld timed after %ld warm-up, "
		       "target %s, give-up after %ld ms\n",
		       dev_name, size, iters, warmup,
		       active ? "active (its CQ is polled between looks)" : "passive (its CQ is never polled)",
		       timeout_ms);
	ibv_free_device_list(list);
	fflush(stdout);

	lag = calloc((size_t)iters, sizeof(*lag));
	if (posix_memalign((void **)&src, 4096, size) || posix_memalign((void **)&dst, 4096, size) || !lag) {
		fprintf(stderr, "placement_lag: out of memory\n");
		goto out;
	}
	memset(src, 0, size);
	memset(dst, 0, size);
	smr = ibv_reg_mr(pd, src, size, 0);
	dmr = ibv_reg_mr(pd, dst, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !dmr) {
		fprintf(stderr, "placement_lag: ibv_reg_mr: %s\n", strerror(errno));
		goto out;
	}
	if (make_side(&a) || make_side(&b) || to_rtr(&a, b.qp->qp_num) || to_rtr(&b, a.qp->qp_num) || to_rts(&a) ||
	    to_rts(&b)) {
		fprintf(stderr, "placement_lag: cannot create and connect the two QPs: %s\n", strerror(errno));
		goto out;
	}
	head = (volatile uint64_t *)dst;
	tail = (volatile uint64_t *)(dst + size - 8);

	rc = 1;
	for (long i = 0; i < warmup + iters; i++) {
		uint64_t seq = (uint64_t)i + 1, want, t0, t1, deadline, seen = 0;
		struct ibv_sge sge = { .addr = (uintptr_t)src, .length = (uint32_t)size, .lkey = smr->lkey };
		struct ibv_send_wr wr, *bad;
		struct ibv_wc wc;
		int n, looks = 0;

		memcpy(src, &seq, 8);
		memcpy(src + size - 8, &seq, 8);
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = seq;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = (uintptr_t)dst;
		wr.wr.rdma.rkey = dmr->rkey;
		errno = ibv_post_send(a.qp, &wr, &bad);
		if (errno) {
			printf("FAILED: write %" PRIu64 ": ibv_post_send: %s\n", seq, strerror(errno));
			goto out;
		}
		deadline = now_ns() + timeout_ns;
		while ((n = ibv_poll_cq(a.cq, 1, &wc)) == 0 && now_ns() < deadline)
			;
		if (n <= 0) {
			printf("FAILED: write %" PRIu64 ": %s\n", seq,
			       n < 0 ? "ibv_poll_cq failed" : "no completion within the time limit");
			goto out;
		}
		if (wc.status != IBV_WC_SUCCESS || wc.wr_id != seq) {
			printf("FAILED: write %" PRIu64 ": completion wr_id %" PRIu64 " status %s\n", seq,
			       (uint64_t)wc.wr_id, ibv_wc_status_str(wc.status));
			goto out;
		}
		/* -X: a number no write carries (the sequence numbers are small). */
		want = never ? seq | (1ull << 63) : seq;
		t0 = now_ns();
		t1 = t0;
		deadline = t0 + timeout_ns;
		/* Each look reads the target through a volatile pointer: the
		 * compiler cannot keep it in a register, and another thread of
		 * the provider writes it. The clock is read every 64 looks; once
		 * past the deadline, one more look decides (this thread may have
		 * been descheduled for a while between the two). */
		while ((seen = *tail) != want) {
			if (active) {
				struct ibv_wc twc;
				if (ibv_poll_cq(b.cq, 1, &twc) != 0) {
					printf("FAILED: write %" PRIu64 ": the target's CQ returned a completion (or an "
					       "error) for a Write without immediate data\n",
					       seq);
					goto out;
				}
			}
			if ((++looks & 63) == 0 && (t1 = now_ns()) > deadline) {
				seen = *tail;
				break;
			}
		}
		if (seen != want) {
			printf("FAILED: write %" PRIu64 ": its data was not visible at the target %ld ms after its "
			       "completion (the target's last 8 bytes hold %" PRIu64 ")\n",
			       seq, timeout_ms, seen);
			goto out;
		}
		if (looks > 0)
			t1 = now_ns();
		if (*head != seq) {
			uint64_t h;
			/* Placement order inside a message is not specified: give the
			 * rest of the message the same time limit. */
			while ((h = *head) != seq && now_ns() < deadline)
				;
			h = *head;
			if (h != seq) {
				printf("FAILED: write %" PRIu64 ": its last 8 bytes arrived but its first 8 bytes "
				       "still hold %" PRIu64 " after %ld ms\n",
				       seq, h, timeout_ms);
				goto out;
			}
		}
		if (i >= warmup) {
			lag[i - warmup] = t1 - t0;
			sum += t1 - t0;
			first_look += looks == 0;
		}
	}
	qsort(lag, (size_t)iters, sizeof(*lag), cmp_u64);
	printf("visible: %ld of %ld writes\n", iters, iters);
	printf("lag_us: p50=%.2f p99=%.2f p99.9=%.2f max=%.2f min=%.2f mean=%.2f n=%ld\n",
	       us(quantile(lag, iters, 0.50)), us(quantile(lag, iters, 0.99)), us(quantile(lag, iters, 0.999)),
	       us(lag[iters - 1]), us(lag[0]), us(sum) / (double)iters, iters);
	printf("first_look: %" PRIu64 " of %ld writes were already visible when the completion came\n", first_look,
	       iters);
	if (!quiet)
		printf("placement_lag: every write became visible at the passive target\n");
	if (idle_ms) {
		uint64_t sw0, sw1;
		double cpu0, cpu1;
		struct timespec ts = { .tv_sec = idle_ms / 1000, .tv_nsec = (idle_ms % 1000) * 1000000 };
		int threads = progress_stats(&sw0, &cpu0);

		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		progress_stats(&sw1, &cpu1);
		printf("idle: ms=%ld progress_threads=%d switches=%" PRIu64 " cpu_ms=%.3f\n", idle_ms, threads, sw1 - sw0,
		       cpu1 - cpu0);
	}
	if (busy_ms) {
		uint64_t sw0, sw1, polls = 0, end;
		double cpu0, cpu1;
		struct ibv_wc wc;
		int threads = progress_stats(&sw0, &cpu0);

		end = now_ns() + (uint64_t)busy_ms * 1000000u;
		do {
			if (ibv_poll_cq(a.cq, 1, &wc) != 0) {
				printf("FAILED: the initiator's CQ returned a completion (or an error) with nothing "
				       "posted\n");
				goto out;
			}
			polls++;
		} while ((polls & 63) || now_ns() < end);
		progress_stats(&sw1, &cpu1);
		printf("polling: ms=%ld progress_threads=%d switches=%" PRIu64 " cpu_ms=%.3f polls=%" PRIu64 "\n",
		       busy_ms, threads, sw1 - sw0, cpu1 - cpu0, polls);
	}
	rc = 0;
out:
	fflush(stdout);
	if (a.qp)
		ibv_destroy_qp(a.qp);
	if (b.qp)
		ibv_destroy_qp(b.qp);
	if (a.cq)
		ibv_destroy_cq(a.cq);
	if (b.cq)
		ibv_destroy_cq(b.cq);
	if (smr)
		ibv_dereg_mr(smr);
	if (dmr)
		ibv_dereg_mr(dmr);
	if (pd)
		ibv_dealloc_pd(pd);
	if (ctx)
		ibv_close_device(ctx);
	free(src);
	free(dst);
	free(lag);
	return rc;
}
