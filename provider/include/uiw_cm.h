/*
 * uiw_cm.h — the provider's connection-management interface, versions 1 and 2.
 *
 * libuiw-rdmav34.so owns the engine (QPs, sockets, progress thread). The librdmacm
 * drop-in does addressing, ports, listen/connect and the rdma_cm event channel, and hands
 * each TCP stream to the provider, which runs MPA (RFC 5044 / RFC 6581) on it, attaches it
 * to a QP and moves the QP to RTS — what the kernel's iw_cm does for a kernel provider.
 *
 * Find the symbols with dlsym() on the provider's handle (the provider is loaded RTLD_LOCAL
 * by libibverbs: dladdr() on ctx->ops.post_send gives its path; dlopen(path,
 * RTLD_NOW | RTLD_NOLOAD) gives the handle).
 *
 * Ownership: a socket passed in belongs to the provider from then on (also on failure).
 * Callbacks run on the provider's progress thread; they must not block and must not call
 * back into uiw_cm_* for the same connection (queue the event, as an rdma_cm event channel
 * does). After uiw_cm_release_v1() returns, no callback for that connection runs.
 */
#ifndef UIW_CM_H
#define UIW_CM_H

#include <stdint.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

struct uiw_cm_conn; /* opaque */

enum uiw_cm_event_type {
	/* passive side: an MPA Request arrived; answer with accept or reject */
	UIW_CM_CONNECT_REQUEST = 1,
	/* MPA done; the QP is in RTS */
	UIW_CM_ESTABLISHED = 2,
	/* the peer rejected (private data given) */
	UIW_CM_REJECTED = 3,
	/* MPA failed: bad frame, timeout, socket error (status = errno) */
	UIW_CM_CONNECT_ERROR = 4,
	/* an established connection ended: peer close, Terminate, local disconnect;
	 * the QP is in ERROR and its WRs are flushed */
	UIW_CM_DISCONNECTED = 5,
};

struct uiw_cm_event {
	int type;                  /* enum uiw_cm_event_type */
	int status;                /* 0, or an errno for CONNECT_ERROR / DISCONNECTED */
	const void *private_data;  /* valid during the callback only */
	uint16_t private_data_len;
	uint16_t ird;              /* CONNECT_REQUEST: the initiator's IRD/ORD (RFC 6581);
	                            * ESTABLISHED: the negotiated ones */
	uint16_t ord;
};

typedef void (*uiw_cm_cb)(void *user, struct uiw_cm_conn *conn, const struct uiw_cm_event *ev);

/* Passive side: `fd` is an accepted TCP socket. The provider waits for the MPA Request and
 * reports UIW_CM_CONNECT_REQUEST (or UIW_CM_CONNECT_ERROR). NULL + errno on failure. */
struct uiw_cm_conn *uiw_cm_passive_v1(struct ibv_context *ctx, int fd, uiw_cm_cb cb, void *user);

/* Passive side: accept with our private data; `qp` (RC, INIT) gets the stream and moves to
 * RTR/RTS; UIW_CM_ESTABLISHED follows. Returns 0 or an errno. */
int uiw_cm_accept_v1(struct uiw_cm_conn *conn, struct ibv_qp *qp, const void *private_data,
		     uint16_t private_data_len, uint16_t ird, uint16_t ord);

/* Passive side: reject with private data (MPA Reply with R=1). Returns 0 or an errno. */
int uiw_cm_reject_v1(struct uiw_cm_conn *conn, const void *private_data, uint16_t private_data_len);

/* Active side: `fd` is a TCP socket, connected (or connecting, non-blocking); `qp` is RC in
 * INIT. Sends the MPA Request; UIW_CM_ESTABLISHED / UIW_CM_REJECTED / UIW_CM_CONNECT_ERROR
 * follows. NULL + errno on failure. */
struct uiw_cm_conn *uiw_cm_active_v1(struct ibv_qp *qp, int fd, const void *private_data,
				     uint16_t private_data_len, uint16_t ird, uint16_t ord,
				     uiw_cm_cb cb, void *user);

/* Either side: orderly disconnect (QP to ERROR, WRs flushed, stream closed);
 * UIW_CM_DISCONNECTED follows. Returns 0 or an errno. */
int uiw_cm_disconnect_v1(struct uiw_cm_conn *conn);

/* Forget the connection: no callback after this returns. Does not disconnect. */
void uiw_cm_release_v1(struct uiw_cm_conn *conn);

/* ---- version 2: listen and connect through the device's transport ----
 *
 * A device published with `uiw up --transport xdp|packet` carries its streams over uiw's
 * userspace TCP on raw frames: the kernel's sockets cannot reach them (its peer's segments
 * are steered to the raw socket), so the v1 calls, which take kernel sockets, refuse such a
 * device with EOPNOTSUPP. rdma_cm then listens and connects through the engine, over the
 * same transport (the engine's Connector) the QPs' non-rdma_cm connects use; MPA, events,
 * accept/reject/disconnect/release are v1's. The v2 calls work on kernel-TCP devices too,
 * but the drop-in keeps v1 there. Addresses are IPv4 (sockaddr_in, or an IPv4-mapped
 * sockaddr_in6). */

struct uiw_cm_listener; /* opaque */

/* 1 when rdma_cm must use uiw_cm_listen_v2/uiw_cm_connect_v2 for this device's streams, 0
 * when it hands the provider kernel sockets (v1); -1 + errno on failure. */
int uiw_cm_transport_v2(struct ibv_context *ctx);

/* A connection the listener accepted (called on the provider's progress thread; must not
 * block): `conn` is its handle (the caller's to release, as from uiw_cm_passive_v1, once it
 * returns 0), `local`/`remote` its addresses. Return 0 and set *cb and *conn_user to take it
 * (its UIW_CM_CONNECT_REQUEST and later events go to them); non-zero (or *cb NULL) refuses
 * it: the stream is closed and `conn` must not be used. */
typedef int (*uiw_cm_incoming_cb)(void *user, struct uiw_cm_conn *conn, const struct sockaddr *local,
				  const struct sockaddr *remote, uiw_cm_cb *cb, void **conn_user);

/* rdma_listen on `addr` (the device's address, a port) through the device's transport.
 * NULL + errno on failure (EADDRINUSE: that port has a listener). */
struct uiw_cm_listener *uiw_cm_listen_v2(struct ibv_context *ctx, const struct sockaddr *addr,
					 socklen_t addr_len, uiw_cm_incoming_cb cb, void *user);

/* Stop listening: no incoming callback after this returns (do not call it from one).
 * Connections already handed out are not affected. */
void uiw_cm_unlisten_v2(struct uiw_cm_listener *l);

/* Active side: opens the stream to `dst` through the QP's device's transport (the source
 * port is the transport's) and sends the MPA Request as uiw_cm_active_v1 does; `local`
 * (may be NULL) receives the stream's source address. NULL + errno on failure. */
struct uiw_cm_conn *uiw_cm_connect_v2(struct ibv_qp *qp, const struct sockaddr *dst, socklen_t dst_len,
				      const void *private_data, uint16_t private_data_len, uint16_t ird,
				      uint16_t ord, uiw_cm_cb cb, void *user, struct sockaddr_storage *local);

#ifdef __cplusplus
}
#endif

#endif
