/*
 * thread_start.c — when ibv_create_qp returns, the provider's progress thread has
 * finished starting: it no longer runs libc's memory-mapping calls on its own schedule.
 *
 * Why it matters (issue 13): a new thread's first allocation creates its malloc arena
 * (mmap + munmap). libfabric's memory monitor ("memhooks"), started by fi_domain, rewrites
 * the first bytes of mmap/munmap/madvise/brk in place with a jump; a thread inside munmap
 * at that moment resumes in the middle of the patch and the process dies with SIGSEGV.
 * fabtests' servers did, a few milliseconds after opening the device.
 *
 * The program is a fresh process with one thread. It opens the device and creates its
 * first QP (the provider starts its progress thread then; libfabric's verbs provider does
 * exactly this in fi_getinfo, probing the QP capabilities, just before fi_domain) and, at
 * once, counts the malloc arenas in malloc_info(): the thread's arena must already be there
 * (2 arenas, main's and the thread's), i.e. the thread's start-up (TLS set-up, first
 * allocation, its mmap/munmap) happened inside ibv_create_qp. Then it closes everything
 * (the provider joins its thread) and, with -n N, does it all N more times: every time a
 * thread starts again (it reuses the arena) and the QP must work (ibv_query_qp).
 *
 * The process first pins itself to one CPU and takes SCHED_FIFO (it runs as root): a
 * thread it creates inherits both, and does not run before its creator blocks. A provider
 * that returns from ibv_create_qp without waiting for its thread is so caught every time,
 * not only when the scheduler happens to delay the thread. (Nothing here spins: the main
 * thread blocks in the provider, the progress thread in epoll_wait.)
 *
 *   thread_start [-d DEV] [-n N]
 *
 * Output is TAP-like ("ok - ..." / "not ok - ...", then "N passed, N failed"); exit status
 * 1 if any check failed. Meaningful on uiw only (other providers start no thread: the
 * first check fails there, which is what it says).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

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

/* The number of malloc arenas: malloc_info() prints one <heap nr="..."> per arena. */
static int arenas(void)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	int n = 0;
	const char *p;

	if (!f)
		return -1;
	if (malloc_info(0, f)) {
		fclose(f);
		free(buf);
		return -1;
	}
	fclose(f);
	for (p = buf; (p = strstr(p, "<heap nr=")); p++)
		n++;
	free(buf);
	return n;
}

/* Open the device and create a QP (the first of the context starts the provider's thread);
 * *arenas_after: the arena count at once after ibv_create_qp. 0 on success. */
static int open_qp(struct ibv_device *dev, int *arenas_after, char *detail, size_t dlen)
{
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr ia = { .qp_type = IBV_QPT_RC };
	struct ibv_qp_attr qa;
	struct ibv_qp *qp;
	int bad;

	if (!cq) {
		snprintf(detail, dlen, "open/pd/cq failed");
		return -1;
	}
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.cap.max_send_wr = 1;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &ia);
	/* Nothing between the create and the count: this is when fi_domain patches libc. */
	if (arenas_after)
		*arenas_after = arenas();
	if (!qp) {
		snprintf(detail, dlen, "ibv_create_qp failed");
		return -1;
	}
	bad = ibv_query_qp(qp, &qa, IBV_QP_STATE, &ia) != 0;
	bad |= ibv_destroy_qp(qp) != 0;
	bad |= ibv_destroy_cq(cq) != 0;
	bad |= ibv_dealloc_pd(pd) != 0;
	bad |= ibv_close_device(ctx) != 0;
	if (bad)
		snprintf(detail, dlen, "query/destroy/close failed");
	return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
	const char *want = getenv("UIW_DEVICE");
	struct ibv_device **list, *dev = NULL;
	int opt, i, n = 0, before, after = -1, again = 0;
	char detail[96] = "";

	while ((opt = getopt(argc, argv, "d:n:")) != -1) {
		switch (opt) {
		case 'd':
			want = optarg;
			break;
		case 'n':
			n = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: %s [-d DEV] [-n N]\n", argv[0]);
			return 2;
		}
	}
	{
		cpu_set_t all, one;
		struct sched_param sp = { .sched_priority = 1 };
		int c;

		CPU_ZERO(&one);
		if (sched_getaffinity(0, sizeof(all), &all)) {
			check(0, "sched_getaffinity", NULL);
			goto out_nolist;
		}
		for (c = 0; c < CPU_SETSIZE && !CPU_ISSET(c, &all); c++)
			;
		CPU_SET(c, &one);
		if (sched_setaffinity(0, sizeof(one), &one) ||
		    sched_setscheduler(0, SCHED_FIFO, &sp)) {
			check(0, "pinned to one CPU at SCHED_FIFO", strerror(errno));
			goto out_nolist;
		}
	}
	list = ibv_get_device_list(NULL);
	for (i = 0; list && list[i]; i++)
		if (!want || !strcmp(ibv_get_device_name(list[i]), want))
			dev = list[i];
	if (!dev) {
		check(0, "device found", want ? want : "no device");
		goto out;
	}
	before = arenas();
	check(!open_qp(dev, &after, detail, sizeof(detail)), "open, QP, close", detail);
	snprintf(detail, sizeof(detail), "%d arena(s) before, %d after ibv_create_qp", before, after);
	check(before == 1 && after == 2,
	      "the provider's thread has its malloc arena when ibv_create_qp returns", detail);
	for (i = 0; i < n; i++)
		if (!open_qp(dev, NULL, detail, sizeof(detail)))
			again++;
	snprintf(detail, sizeof(detail), "%d of %d", again, n);
	check(again == n, "every further open/QP/close works (a thread started each time)", detail);
out:
	if (list)
		ibv_free_device_list(list);
out_nolist:
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
