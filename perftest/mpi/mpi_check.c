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
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
