/*
 * libibverbs calls that are `static inline` in <infiniband/verbs.h> and so have no symbol
 * to bind to from Rust. Compiled against the installed headers, so they do exactly what an
 * application compiled on this machine would do. Part of the FFI surface; no logic here.
 */
#include <errno.h>
#include <infiniband/verbs.h>

struct ibv_qp *uiw_rdmacm_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
	return ibv_create_qp_ex(ctx, attr);
}

struct ibv_srq *uiw_rdmacm_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *attr)
{
	return ibv_create_srq_ex(ctx, attr);
}

int uiw_rdmacm_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

/* The provider's post_send: dladdr() on it names the provider's shared object. */
void *uiw_rdmacm_post_send_fn(struct ibv_context *ctx)
{
	return (void *)ctx->ops.post_send;
}
