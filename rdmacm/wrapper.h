/* The public ABI the drop-in implements: rdma-core's installed headers. */
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>
