/*
 * mpi_check.c — an MPI correctness and speed check for uiw (two ranks).
 *
 *   mpicc -O2 -Wall -Werror -o mpi_check perftest/mpi/mpi_check.c
 *   mpirun -np 2 ... ./mpi_check
 *
 * Ping-pong (latency) and streaming (bandwidth) between ranks 0 and 1 at sizes from
 * 1 B to 4 MiB, every message filled with a seeded pattern and checked byte for byte by
 * the receiver; then MPI_Allreduce (sum, max over int64 and double vectors) checked
 * against the values computed locally. Output: "ok - ..." / "not ok - ...: why" lines,
 * the figures, and a closing "N passed, N failed" line. Exit status 1 on any failure.
 *
 * Benchmark modes (uiw-bench's mpi_* rows), one measurement each, still checked:
 *
 *   mpi_check lat SIZE ITERS   ping-pong of SIZE bytes, ITERS timed round trips after
 *                              200 untimed ones; every message checked as above. Prints
 *                              "mpi_check: lat SIZE B x ITERS: half round trip median X us
 *                              mean Y us p99 Z us" (each round trip timed, halved).
 *   mpi_check bw SIZE BYTES    rank 0 streams about BYTES in windows of 64 SIZE-byte
 *                              MPI_Isend (rank 1: MPI_Irecv), timed from a barrier to rank
 *                              1's acknowledgement of the last window (as osu_bw). The
 *                              timed windows are not checked (that would time the check);
 *                              one window after them, with fresh patterns, is. Prints
 *                              "mpi_check: bw SIZE B x N messages, 64 in flight: X MB/s"
 *                              (MB = 10^6 bytes).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bench(int argc, char **argv);

static int rank, size, passed, failed;

static void check(int ok, const char *what)
{
	if (ok)
		passed++;
	else
		failed++;
	if (rank == 0 || !ok)
		printf("%s - rank %d: %s\n", ok ? "ok" : "not ok", rank, what);
}

static unsigned char pat(size_t i, unsigned seed)
{
	return (unsigned char)(i * 131u + seed * 7u + (i >> 8));
}

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pat(i, seed);
}

static size_t bad_at(const unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != pat(i, seed))
			return i;
	return n;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 2) {
		if (rank == 0)
			fprintf(stderr, "mpi_check: run with exactly 2 ranks (got %d)\n", size);
		MPI_Finalize();
		return 2;
	}
	if (argc > 1)
		return bench(argc, argv);
	int peer = 1 - rank;
	const size_t max = 4u << 20;
	unsigned char *buf = malloc(max);
	char what[160];
	if (!buf)
		MPI_Abort(MPI_COMM_WORLD, 2);

	/* Ping-pong: rank 0 sends, rank 1 checks and answers with its own pattern. */
	for (size_t n = 1; n <= max; n *= 4) {
		int iters = n <= 65536 ? 200 : 20, bad = 0;
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (int i = 0; i < iters; i++) {
			unsigned seed = (unsigned)(n + i);
			if (rank == 0) {
				fill(buf, n, seed);
				MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
				MPI_Recv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				bad += bad_at(buf, n, seed + 1) != n;
			} else {
				memset(buf, 0, n);
				MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				bad += bad_at(buf, n, seed) != n;
				fill(buf, n, seed + 1);
				MPI_Send(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
			}
		}
		double us = (MPI_Wtime() - t0) / iters / 2 * 1e6;
		snprintf(what, sizeof what, "ping-pong %zu B x %d: data intact (half round trip %.1f us)", n, iters, us);
		check(bad == 0, what);
	}

	/* Streaming: 64 messages in flight from rank 0, rank 1 checks each. */
	for (size_t n = 4096; n <= (1u << 20); n *= 16) {
		enum { W = 16 };
		int reps = 8, bad = 0;
		unsigned char *win = malloc(n * W);
		MPI_Request rq[W];
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (int r = 0; r < reps; r++) {
			for (int w = 0; w < W; w++) {
				if (rank == 0) {
					fill(win + n * w, n, (unsigned)(r * W + w));
					MPI_Isend(win + n * w, (int)n, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &rq[w]);
				} else {
					MPI_Irecv(win + n * w, (int)n, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &rq[w]);
				}
			}
			MPI_Waitall(W, rq, MPI_STATUSES_IGNORE);
			if (rank == 1)
				for (int w = 0; w < W; w++)
					bad += bad_at(win + n * w, n, (unsigned)(r * W + w)) != n;
		}
		MPI_Barrier(MPI_COMM_WORLD);
		double s = MPI_Wtime() - t0;
		MPI_Bcast(&bad, 1, MPI_INT, 1, MPI_COMM_WORLD);
		snprintf(what, sizeof what, "stream %zu B x %d: data intact (%.1f MB/s)", n, reps * W,
			 (double)n * reps * W / s / 1e6);
		check(bad == 0, what);
		free(win);
	}

	/* Allreduce: sum and max of int64 and double vectors, each rank's values known. */
	for (int len = 1; len <= 1 << 16; len *= 16) {
		int64_t *a = malloc(sizeof *a * len), *s = malloc(sizeof *s * len);
		double *d = malloc(sizeof *d * len), *m = malloc(sizeof *m * len);
		for (int i = 0; i < len; i++) {
			a[i] = (int64_t)i * (rank + 1) - rank * 1000003LL;
			d[i] = (double)i * (rank ? -0.5 : 1.25) + rank;
		}
		MPI_Allreduce(a, s, len, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
		MPI_Allreduce(d, m, len, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		int bad = 0;
		for (int i = 0; i < len; i++) {
			int64_t want = (int64_t)i * 1 + (int64_t)i * 2 - 1000003LL;
			double w0 = (double)i * 1.25, w1 = (double)i * -0.5 + 1;
			bad += s[i] != want || m[i] != (w0 > w1 ? w0 : w1);
		}
		snprintf(what, sizeof what, "allreduce sum int64 + max double, %d elements: results exact", len);
		check(bad == 0, what);
		free(a), free(s), free(d), free(m);
	}

	int tot[2] = { passed, failed }, all[2];
	MPI_Reduce(tot, all, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0)
		printf("%d passed, %d failed\n", all[0], all[1]);
	free(buf);
	MPI_Finalize();
	return failed ? 1 : 0;
}

static int summary(void)
{
	int tot[2] = { passed, failed }, all[2];
	MPI_Reduce(tot, all, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0)
		printf("%d passed, %d failed\n", all[0], all[1]);
	MPI_Finalize();
	return failed ? 1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Ping-pong of n bytes: 200 untimed round trips (connections are made lazily), then
 * iters timed ones, each timed on its own; every message checked. */
static void bench_lat(size_t n, long iters)
{
	int peer = 1 - rank, bad = 0;
	const long warm = 200;
	unsigned char *buf = malloc(n ? n : 1);
	double *t = malloc(sizeof *t * (size_t)iters);
	char what[200];
	if (!buf || !t)
		MPI_Abort(MPI_COMM_WORLD, 2);
	MPI_Barrier(MPI_COMM_WORLD);
	for (long i = -warm; i < iters; i++) {
		unsigned seed = (unsigned)(i + warm);
		double t0 = MPI_Wtime();
		if (rank == 0) {
			fill(buf, n, seed);
			MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
			MPI_Recv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad += bad_at(buf, n, seed + 1) != n;
		} else {
			MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			bad += bad_at(buf, n, seed) != n;
			fill(buf, n, seed + 1);
			MPI_Send(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
		}
		if (i >= 0)
			t[i] = MPI_Wtime() - t0;
	}
	snprintf(what, sizeof what, "lat %zu B x %ld: every message intact (%d bad)", n, iters + warm, bad);
	check(bad == 0, what);
	if (rank == 0) {
		double sum = 0;
		for (long i = 0; i < iters; i++)
			sum += t[i];
		qsort(t, (size_t)iters, sizeof *t, cmp_double);
		double med = iters % 2 ? t[iters / 2] : (t[iters / 2 - 1] + t[iters / 2]) / 2;
		long i99 = (long)(0.99 * (double)(iters - 1));
		printf("mpi_check: lat %zu B x %ld: half round trip median %.3f us mean %.3f us p99 %.3f us\n",
		       n, iters, med / 2 * 1e6, sum / (double)iters / 2 * 1e6, t[i99] / 2 * 1e6);
	}
	free(buf);
	free(t);
}

/* One window of W messages of n bytes from rank 0 to rank 1. */
static void window(unsigned char *win, size_t n, int w_count)
{
	MPI_Request rq[64];
	int peer = 1 - rank;
	for (int w = 0; w < w_count; w++) {
		if (rank == 0)
			MPI_Isend(win + n * w, (int)n, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &rq[w]);
		else
			MPI_Irecv(win + n * w, (int)n, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &rq[w]);
	}
	MPI_Waitall(w_count, rq, MPI_STATUSES_IGNORE);
}

/* Streaming bandwidth, osu_bw's way: windows of W sends, rank 1 acknowledges the last. */
static void bench_bw(size_t n, double bytes)
{
	enum { W = 64 };
	int peer = 1 - rank, ack = 0, bad = 0;
	long reps = (long)(bytes / ((double)n * W));
	char what[200];
	if (reps < 2)
		reps = 2;
	unsigned char *win = malloc(n * W);
	if (!win)
		MPI_Abort(MPI_COMM_WORLD, 2);
	if (rank == 0)
		for (int w = 0; w < W; w++)
			fill(win + n * w, n, (unsigned)w);
	else
		memset(win, 0, n * W);
	for (int r = 0; r < 2; r++) /* warm-up: connections, memory registrations */
		window(win, n, W);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (long r = 0; r < reps; r++)
		window(win, n, W);
	if (rank == 0)
		MPI_Recv(&ack, 1, MPI_INT, peer, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	else
		MPI_Send(&ack, 1, MPI_INT, peer, 4, MPI_COMM_WORLD);
	double s = MPI_Wtime() - t0;
	/* The check: a window of fresh patterns into a zeroed buffer. */
	if (rank == 0)
		for (int w = 0; w < W; w++)
			fill(win + n * w, n, (unsigned)(1000 + w));
	else
		memset(win, 0, n * W);
	window(win, n, W);
	if (rank == 1)
		for (int w = 0; w < W; w++)
			bad += bad_at(win + n * w, n, (unsigned)(1000 + w)) != n;
	MPI_Bcast(&bad, 1, MPI_INT, 1, MPI_COMM_WORLD);
	snprintf(what, sizeof what, "bw %zu B: a window of %d messages after the timed ones intact (%d bad)", n, W, bad);
	check(bad == 0, what);
	if (rank == 0)
		printf("mpi_check: bw %zu B x %ld messages, %d in flight: %.1f MB/s\n", n, reps * W, W,
		       (double)n * (double)(reps * W) / s / 1e6);
	free(win);
}

static int bench(int argc, char **argv)
{
	char *end1 = NULL, *end2 = NULL;
	double a = argc == 4 ? strtod(argv[2], &end1) : -1, b = argc == 4 ? strtod(argv[3], &end2) : -1;
	int ok_args = argc == 4 && end1 && !*end1 && end2 && !*end2 && a >= 0 && a <= (1 << 30) && b >= 1;
	if (ok_args && strcmp(argv[1], "lat") == 0 && b <= 1e8)
		bench_lat((size_t)a, (long)b);
	else if (ok_args && strcmp(argv[1], "bw") == 0 && a >= 1 && a <= (16 << 20))
		bench_bw((size_t)a, b);
	else {
		if (rank == 0)
			fprintf(stderr, "usage: mpi_check [lat SIZE ITERS | bw SIZE BYTES] (got %d arguments)\n", argc - 1);
		MPI_Finalize();
		return 2;
	}
	return summary();
}
