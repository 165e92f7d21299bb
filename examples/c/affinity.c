/*
 * affinity.c — where uiw's progress thread runs when the thread that starts it is pinned.
 *
 *   affinity [-d DEV]
 *
 * A polling runtime (SPDK's reactor) pins the thread that makes its QPs to one core. This
 * program does the same: its main thread stays on every CPU the process may use, a second
 * thread pins itself to the first of them, opens DEV (default uiw_lo, or $UIW_DEVICE) and
 * creates an RC QP, which starts the progress thread. With the QP still alive it finds the
 * progress thread (comm "uiw-progress") in /proc/self/task and prints
 *   PINNED <cpu>
 *   PROGRESS <the progress thread's Cpus_allowed_list>
 * and exits 0; or "ONE_CPU" when the process may use a single CPU (nothing to test); 2 on
 * a setup error.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *dev_name = "uiw_lo";
static int pinned = -1;
static int status = 2;

/* The Cpus_allowed_list of the thread named "uiw-progress", into out; 0 when found. */
static int progress_cpus(char *out, size_t len)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int found = -1;

	if (!d)
		return -1;
	while (found && (e = readdir(d))) {
		char path[300], line[512];
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(line, sizeof(line), f) || strcmp(line, "uiw-progress\n")) {
			fclose(f);
			continue;
		}
		fclose(f);
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "Cpus_allowed_list:", 18)) {
				char *v = line + 18;
				v += strspn(v, " \t");
				v[strcspn(v, "\n")] = 0;
				snprintf(out, len, "%s", v);
				found = 0;
			}
		fclose(f);
	}
	closedir(d);
	return found;
}

static void *pinned_thread(void *arg)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	cpu_set_t one;
	char cpus[256];
	(void)arg;

	CPU_ZERO(&one);
	CPU_SET(pinned, &one);
	if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one)) {
		fprintf(stderr, "affinity: cannot pin to CPU %d\n", pinned);
		return NULL;
	}
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), dev_name))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx) {
		fprintf(stderr, "affinity: cannot open %s\n", dev_name);
		return NULL;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = cq ? ibv_create_qp(pd, &qa) : NULL;
	if (!qp) {
		perror("affinity: pd/cq/qp");
		return NULL;
	}
	/* The thread names itself once it runs (its mask was set when it was created): look
	 * until it has, for at most 10 s. */
	int found = -1;
	for (int i = 0; i < 1000 && (found = progress_cpus(cpus, sizeof(cpus))); i++)
		usleep(10000);
	if (found) {
		fprintf(stderr, "affinity: no uiw-progress thread in /proc/self/task\n");
	} else {
		printf("PINNED %d\nPROGRESS %s\n", pinned, cpus);
		status = 0;
	}
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return NULL;
}

int main(int argc, char **argv)
{
	cpu_set_t all;
	pthread_t t;
	int opt;

	if (getenv("UIW_DEVICE"))
		dev_name = getenv("UIW_DEVICE");
	while ((opt = getopt(argc, argv, "d:")) != -1) {
		if (opt != 'd') {
			fprintf(stderr, "usage: affinity [-d DEV]\n");
			return 2;
		}
		dev_name = optarg;
	}
	if (sched_getaffinity(0, sizeof(all), &all)) {
		perror("sched_getaffinity");
		return 2;
	}
	if (CPU_COUNT(&all) < 2) {
		printf("ONE_CPU\n");
		return 0;
	}
	for (int c = 0; c < CPU_SETSIZE && pinned < 0; c++)
		if (CPU_ISSET(c, &all))
			pinned = c;
	if (pthread_create(&t, NULL, pinned_thread, NULL) || pthread_join(t, NULL))
		return 2;
	return status;
}
