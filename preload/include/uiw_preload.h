/* uiw_preload.h - C interface of libuiw_preload.so, the LD_PRELOAD shim that
 * `uiw run` starts programs with.
 *
 * The shim interposes socket(), write(), read(), close(), dup2(), dup3() and
 * close_range():
 *
 *  - socket(AF_NETLINK, *, NETLINK_RDMA) fails with EPROTONOSUPPORT while the
 *    environment variable SYSFS_PATH is set, so libibverbs discovers devices
 *    from $SYSFS_PATH (the tree `uiw up` writes) on every host.
 *
 *  - write() on a file descriptor registered below does not reach the kernel:
 *    the shim calls the registered handler synchronously, on the calling
 *    thread, and returns its result to the caller unchanged (set errno and
 *    return -1 to fail). This is how the provider answers the uverbs commands
 *    libibverbs writes straight to context->cmd_fd, e.g.
 *    ibv_create_comp_channel() (rdma-core 44): a 16-byte write of struct
 *    ib_uverbs_cmd_hdr { u32 command = 6; u16 in_words = 4; u16 out_words =
 *    1; } followed by struct ib_uverbs_create_comp_channel { u64 response; };
 *    the handler stores struct ib_uverbs_create_comp_channel_resp { u32 fd; }
 *    at `response` and returns 16, as the kernel would (libibverbs fails the
 *    call unless write() returns exactly the length it wrote).
 *
 *  - read() on a file descriptor registered with
 *    uiw_preload_register_read_fd_v1() calls that handler the same way. The
 *    provider registers each completion channel's fd: ibv_get_cq_event()
 *    read()s it, and while the read blocks the provider serves the QPs of the
 *    channel's CQs in the reading thread (one wake-up per message instead of
 *    the progress thread's and then the reader's).
 *
 *  - close(), dup2()/dup3() onto, and close_range() over a registered fd
 *    unregister it (then do the real thing), from both tables.
 *
 * The provider should not link against the shim: look the functions up at
 * run time, and treat their absence as "not running under uiw run":
 *
 *     uiw_preload_register_cmd_fd_v1_fn reg =
 *         (uiw_preload_register_cmd_fd_v1_fn)dlsym(RTLD_DEFAULT,
 *                                      "uiw_preload_register_cmd_fd_v1");
 *
 * Names carry a version suffix; an incompatible change gets a new name and the
 * old one stays.
 *
 * Concurrency: registration is serialised internally; the write() and read()
 * paths are lock-free (one atomic load when nothing is registered). The handler and ctx
 * must stay valid until uiw_preload_unregister_cmd_fd_v1() (or close()) of the
 * fd returns and no write() on the fd is in flight. fds closed behind the
 * shim's back (fclose() of a FILE, raw syscalls) are not seen: unregister
 * before closing by those means.
 */
#ifndef UIW_PRELOAD_H
#define UIW_PRELOAD_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called for write(fd, buf, len) on a registered fd; its return value is
 * write()'s. */
typedef ssize_t (*uiw_cmd_handler_v1)(void *ctx, int fd, const void *buf,
				      size_t len);

/* Register h(ctx, ...) for write() on fd.
 * Returns 0, or an errno value: EBADF (fd < 0), EINVAL (h == NULL),
 * EBUSY (fd already registered), ENOSPC (too many registered fds >= 65536). */
int uiw_preload_register_cmd_fd_v1(int fd, uiw_cmd_handler_v1 h, void *ctx);

/* Forget fd's handler; a no-op when fd is not registered. Does not close fd. */
void uiw_preload_unregister_cmd_fd_v1(int fd);

typedef int (*uiw_preload_register_cmd_fd_v1_fn)(int fd, uiw_cmd_handler_v1 h,
						 void *ctx);
typedef void (*uiw_preload_unregister_cmd_fd_v1_fn)(int fd);

/* Called for read(fd, buf, len) on a fd registered below. It must not block:
 * it returns what read() returns, or UIW_READ_WAIT with *wait_fd set — the
 * shim then sleeps in poll() on *wait_fd (a cancellation point, as read() is)
 * and calls again with why = UIW_READ_WOKEN, or UIW_READ_INTERRUPTED if a
 * signal ended the sleep (the handler decides, as read() would, between
 * restarting and failing with EINTR) — or UIW_READ_PLAIN: the shim does the
 * real read(). why is UIW_READ_FIRST on the first call. */
typedef ssize_t (*uiw_read_handler_v1)(void *ctx, int fd, void *buf,
				       size_t len, int why, int *wait_fd);
#define UIW_READ_WAIT ((ssize_t)-2)
#define UIW_READ_PLAIN ((ssize_t)-3)
#define UIW_READ_FIRST 0
#define UIW_READ_WOKEN 1
#define UIW_READ_INTERRUPTED 2

/* Register h(ctx, ...) for read() on fd; returns as
 * uiw_preload_register_cmd_fd_v1(). The read and write tables are apart: a fd
 * may be in both. */
int uiw_preload_register_read_fd_v1(int fd, uiw_read_handler_v1 h, void *ctx);

/* Forget fd's read() handler; a no-op when fd is not registered. */
void uiw_preload_unregister_read_fd_v1(int fd);

typedef int (*uiw_preload_register_read_fd_v1_fn)(int fd, uiw_read_handler_v1 h,
						  void *ctx);
typedef void (*uiw_preload_unregister_read_fd_v1_fn)(int fd);

#ifdef __cplusplus
}
#endif

#endif /* UIW_PRELOAD_H */
