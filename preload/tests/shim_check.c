/* Run under LD_PRELOAD=libuiw_preload.so by tests/shim.rs.
 * Prints "ok <name>" per check; exits non-zero on the first failure. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/netlink.h>
#include "uiw_preload.h"

#define CHECK(name, cond)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "FAIL %s (line %d, errno %d %s)\n",    \
				name, __LINE__, errno, strerror(errno));       \
			exit(1);                                               \
		}                                                              \
		printf("ok %s\n", name);                                       \
	} while (0)

struct cmd { uint32_t command; uint16_t in_words, out_words; uint64_t response; };
struct resp { uint32_t fd; };

static int calls;
static int last_fd;
static struct cmd last_cmd;

static ssize_t handler(void *ctx, int fd, const void *buf, size_t len)
{
	calls++;
	last_fd = fd;
	if (len != sizeof(struct cmd)) {
		errno = EINVAL;
		return -1;
	}
	memcpy(&last_cmd, buf, sizeof last_cmd);
	((struct resp *)(uintptr_t)last_cmd.response)->fd = *(int *)ctx;
	return (ssize_t)len;
}

static int rcalls;
static int rwait_fd = -1; /* >= 0: the handler asks the shim to wait on it first */
static int rwhy[8];

static ssize_t rhandler(void *ctx, int fd, void *buf, size_t len, int why, int *wait_fd)
{
	(void)fd;
	rwhy[rcalls++ & 7] = why;
	if (rwait_fd >= 0 && why == UIW_READ_FIRST) {
		*wait_fd = rwait_fd;
		return UIW_READ_WAIT;
	}
	memset(buf, *(int *)ctx, len);
	return (ssize_t)len;
}

int main(void)
{
	int sysfs = getenv("SYSFS_PATH") != NULL;
	int s;

	errno = 0;
	s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, 20 /* NETLINK_RDMA */);
	if (sysfs)
		CHECK("netlink_rdma_refused", s == -1 && errno == EPROTONOSUPPORT);
	else {
		/* Not intercepted: whatever the kernel says (EPROTONOSUPPORT on hosts
		 * without RDMA, a socket elsewhere). */
		CHECK("netlink_rdma_passthrough", s >= 0 || errno == EPROTONOSUPPORT);
		if (s >= 0)
			close(s);
	}
	s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	CHECK("netlink_route_works", s >= 0);
	close(s);
	s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK("inet_works", s >= 0);
	close(s);

	uiw_preload_register_cmd_fd_v1_fn reg = (uiw_preload_register_cmd_fd_v1_fn)
		dlsym(RTLD_DEFAULT, "uiw_preload_register_cmd_fd_v1");
	uiw_preload_unregister_cmd_fd_v1_fn unreg = (uiw_preload_unregister_cmd_fd_v1_fn)
		dlsym(RTLD_DEFAULT, "uiw_preload_unregister_cmd_fd_v1");
	CHECK("dlsym", reg && unreg);

	int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	int chan = 42;
	CHECK("register", reg(fd, handler, &chan) == 0);
	CHECK("register_twice_ebusy", reg(fd, handler, &chan) == EBUSY);
	CHECK("register_null_einval", reg(fd + 1, NULL, &chan) == EINVAL);
	CHECK("register_neg_ebadf", reg(-1, handler, &chan) == EBADF);

	struct resp r = { .fd = 0xffffffff };
	struct cmd c = { .command = 6 /* CREATE_COMP_CHANNEL */, .in_words = 4,
			 .out_words = 1, .response = (uintptr_t)&r };
	ssize_t n = write(fd, &c, sizeof c);
	CHECK("write_goes_to_handler", n == (ssize_t)sizeof c && sizeof c == 16 && calls == 1 && last_fd == fd);
	CHECK("handler_saw_bytes", memcmp(&last_cmd, &c, sizeof c) == 0);
	CHECK("response_written", r.fd == 42);
	errno = 0;
	n = write(fd, &c, 3);
	CHECK("handler_error_passthrough", n == -1 && errno == EINVAL && calls == 2);

	int p[2];
	CHECK("pipe", pipe(p) == 0);
	CHECK("other_fd_real_write", write(p[1], "x", 1) == 1 && calls == 2);
	char ch;
	CHECK("other_fd_read", read(p[0], &ch, 1) == 1 && ch == 'x');

	/* close() unregisters: the next fd with that number is a plain fd. */
	close(fd);
	int fd2 = open("/dev/null", O_RDWR | O_CLOEXEC);
	CHECK("fd_reused", fd2 == fd);
	CHECK("close_unregisters", write(fd2, &c, sizeof c) == (ssize_t)sizeof c && calls == 2);

	/* explicit unregister */
	CHECK("register_again", reg(fd2, handler, &chan) == 0);
	unreg(fd2);
	CHECK("unregister", write(fd2, &c, sizeof c) == (ssize_t)sizeof c && calls == 2);
	unreg(fd2); /* no-op */

	/* dup2 onto a registered fd drops the registration */
	CHECK("register_dup2", reg(fd2, handler, &chan) == 0);
	CHECK("dup2", dup2(p[1], fd2) == fd2);
	CHECK("dup2_unregisters", write(fd2, "y", 1) == 1 && calls == 2 &&
				  read(p[0], &ch, 1) == 1 && ch == 'y');
	close(fd2);

	/* read() handlers: a table of their own */
	uiw_preload_register_read_fd_v1_fn rreg = (uiw_preload_register_read_fd_v1_fn)
		dlsym(RTLD_DEFAULT, "uiw_preload_register_read_fd_v1");
	uiw_preload_unregister_read_fd_v1_fn runreg = (uiw_preload_unregister_read_fd_v1_fn)
		dlsym(RTLD_DEFAULT, "uiw_preload_unregister_read_fd_v1");
	CHECK("dlsym_read", rreg && runreg);
	int q[2];
	CHECK("pipe_read", pipe(q) == 0);
	CHECK("read_register", rreg(q[0], rhandler, &chan) == 0);
	CHECK("read_register_twice_ebusy", rreg(q[0], rhandler, &chan) == EBUSY);
	CHECK("read_register_null_einval", rreg(q[1], NULL, &chan) == EINVAL);
	char rb[4] = { 0 };
	CHECK("read_goes_to_handler", read(q[0], rb, sizeof rb) == 4 && rcalls == 1 && rb[0] == 42 && rb[3] == 42);
	CHECK("write_table_apart", write(q[1], "r", 1) == 1 && calls == 2);
	/* a handler that asks the shim to sleep until a descriptor is readable */
	int w[2];
	CHECK("pipe_wait", pipe(w) == 0 && write(w[1], "!", 1) == 1);
	rwait_fd = w[0];
	rcalls = 0;
	CHECK("read_waits_then_calls_again", read(q[0], rb, 2) == 2 && rcalls == 2 &&
		rwhy[0] == UIW_READ_FIRST && rwhy[1] == UIW_READ_WOKEN && rb[0] == 42);
	rwait_fd = -1;
	rcalls = 1;
	close(w[0]);
	close(w[1]);
	runreg(q[0]);
	CHECK("read_unregister", read(q[0], rb, 1) == 1 && rb[0] == 'r' && rcalls == 1);
	CHECK("read_register_dup2", rreg(q[0], rhandler, &chan) == 0);
	int q2[2];
	CHECK("pipe_read2", pipe(q2) == 0);
	CHECK("dup2_read", dup2(q2[0], q[0]) == q[0]);
	CHECK("dup2_unregisters_read", write(q2[1], "s", 1) == 1 && read(q[0], rb, 1) == 1 && rb[0] == 's' && rcalls == 1);
	CHECK("read_register_close", rreg(q[0], rhandler, &chan) == 0);
	close(q[0]);
	int q3 = dup(q2[0]);
	CHECK("fd_reused_read", q3 == q[0]);
	CHECK("close_unregisters_read", write(q2[1], "t", 1) == 1 && read(q3, rb, 1) == 1 && rb[0] == 't' && rcalls == 1);
	close(q3);
	close(q[1]);
	close(q2[0]);
	close(q2[1]);

	/* fds beyond the direct table */
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur < 65601) {
		rl.rlim_cur = 65601;
		if (rl.rlim_max < 65601)
			rl.rlim_max = 65601; /* needs CAP_SYS_RESOURCE */
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	int big = fcntl(p[1], F_DUPFD_CLOEXEC, 65600);
	if (big >= 0) {
		CHECK("register_big", reg(big, handler, &chan) == 0);
		r.fd = 0;
		CHECK("big_write_to_handler", write(big, &c, sizeof c) == (ssize_t)sizeof c && calls == 3 && r.fd == 42 && last_fd == big);
		close(big);
		int big2 = fcntl(p[1], F_DUPFD_CLOEXEC, 65600);
		CHECK("big_close_unregisters", big2 == big && write(big2, "z", 1) == 1 && calls == 3);
		close(big2);
	} else {
		printf("skip big_fd (RLIMIT_NOFILE)\n");
	}
	printf("all ok\n");
	return 0;
}
