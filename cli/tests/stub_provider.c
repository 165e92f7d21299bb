/* A do-nothing libibverbs provider (private ABI 34) used by tests/cli.rs to check
 * that libibverbs itself discovers the tree `uiw up` writes, independently of the
 * real provider: it claims every device and never opens one. The struct prefix
 * below mirrors rdma-core's struct verbs_device_ops (v34..v56). */
#include <stdbool.h>
#include <stdlib.h>

struct stub_device_ops {
	const char *name;
	int match_min_abi_version, match_max_abi_version;
	const void *match_table;
	const void **static_providers;
	bool (*match_device)(void *sysfs_dev);
	void *alloc_context, *import_context;
	void *(*alloc_device)(void *sysfs_dev);
	void (*uninit_device)(void *verbs_device);
};

static bool match(void *sysfs_dev) { (void)sysfs_dev; return true; }
/* struct verbs_device is far smaller than this; libibverbs fills it in. */
static void *alloc_device(void *sysfs_dev) { (void)sysfs_dev; return calloc(1, 4096); }
static void uninit_device(void *d) { free(d); }

static const struct stub_device_ops ops = {
	.name = "uiwstub",
	.match_min_abi_version = 1, /* uverbsN/abi_version written by uiw up */
	.match_max_abi_version = 1,
	.match_device = match,
	.alloc_device = alloc_device,
	.uninit_device = uninit_device,
};

extern void verbs_register_driver_34(const void *ops);

__attribute__((constructor)) static void register_stub(void)
{
	verbs_register_driver_34(&ops);
}
