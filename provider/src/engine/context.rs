//! One open device context and the verbs objects created on it. Everything here is plain safe
//! Rust: the FFI layer turns C pointers into these objects and back.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::debug;
use super::cm::CmConn;
use super::cq::{CqObj, PolledQp};
use super::datapath::DataPath;
use super::device::{DeviceInfo, TransportKind};
use super::error::{Error, Result};
use super::events::{AsyncSink, ChannelSink};
use super::limits::DeviceLimits;
use super::mr::MrTable;
use super::net::{AcquireError, Endpoint, Net};
use super::qp::{Qp, QpInner, QpSpec};
use super::qp_state;
use super::transport::kernel::KernelStream;
use super::srq::{Srq, SrqObj};
use super::user_memory::UserMemory;

/// Counts of live objects, for the device limits and for `EBUSY` on teardown.
#[derive(Debug, Default)]
struct Counts {
    pds: HashMap<u32, usize>,
    cqs: usize,
    qps: usize,
    srqs: usize,
}

#[derive(Debug)]
pub struct Context {
    pub device: Arc<DeviceInfo>,
    pub limits: DeviceLimits,
    pub mrs: Arc<MrTable>,
    async_sink: Arc<AsyncSink>,
    next_handle: AtomicU32,
    user_mem: &'static dyn UserMemory,
    /// The process's transport, taken by this context's first QP.
    net: Mutex<Option<Arc<Net>>>,
    counts: Mutex<Counts>,
    /// Completion channels created through the command fd: read fd → write end.
    channels: Mutex<HashMap<i32, Arc<ChannelSink>>>,
}

impl std::fmt::Debug for dyn UserMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserMemory")
    }
}

impl Context {
    /// `user_mem` is how the data path reaches application memory (see [`super::user_memory`]).
    pub fn new(device: Arc<DeviceInfo>, limits: DeviceLimits, async_sink: AsyncSink, user_mem: &'static dyn UserMemory) -> Context {
        Context {
            mrs: Arc::new(MrTable::new(limits.max_mr as usize)),
            device,
            limits,
            async_sink: Arc::new(async_sink),
            next_handle: AtomicU32::new(1),
            user_mem,
            net: Mutex::new(None),
            counts: Mutex::new(Counts::default()),
            channels: Mutex::new(HashMap::new()),
        }
    }

    fn net(&self) -> Result<Arc<Net>> {
        let mut n = self.net.lock();
        if let Some(net) = n.as_ref() {
            return Ok(net.clone());
        }
        let net = Net::acquire(self.user_mem, &self.device).map_err(|e| {
            eprintln!("uiw: cannot create a QP: {e}");
            match e {
                AcquireError::Start(_) => Error::NoTransport,
                // Its errno (EPERM without the privileges, ENODEV for a netdev gone).
                AcquireError::Raw(_, e) => Error::Io(e),
            }
        })?;
        *n = Some(net.clone());
        Ok(net)
    }

    /// `uiw_cm_passive_v1`: a stream the librdmacm drop-in accepted; its MPA Request is
    /// reported through `cm`.
    pub fn cm_passive(&self, sock: TcpStream, cm: Arc<CmConn>) -> Result<()> {
        if self.device.transport != TransportKind::Tcp {
            super::transport::cm_refused(&self.device);
            return Err(Error::NotSupported);
        }
        let net = self.net()?;
        Ok(net.cm_passive(Box::new(KernelStream::prepare(sock)?), cm)?)
    }

    /// Whether rdma_cm must connect this device's streams through the engine
    /// ([`Context::cm_listen`], `Qp::cm_connect_to`) rather than hand it kernel sockets: its
    /// streams go over a userspace TCP on raw frames (`--transport xdp|packet`), which the
    /// kernel's sockets cannot reach.
    pub fn cm_in_engine(&self) -> bool {
        self.device.transport != TransportKind::Tcp
    }

    /// `uiw_cm_listen_v2`: rdma_listen on `at` through the device's transport; each stream
    /// accepted is offered to `cm`. Returns the id for [`Context::cm_unlisten`].
    /// Works on any device; the drop-in uses it where [`Context::cm_in_engine`] says so.
    /// Returns the transport and the id to stop it with (`Net::cm_unlisten`).
    pub fn cm_listen(&self, at: std::net::SocketAddrV4, cm: Arc<super::cm::CmListen>) -> Result<(Arc<Net>, u64)> {
        let net = self.net()?;
        let l = net.connector(&self.device).listen(at)?;
        let id = net.cm_listen(l, cm)?;
        Ok((net, id))
    }

    // ---- protection domains ----

    pub fn alloc_pd(&self) -> Result<u32> {
        let mut c = self.counts.lock();
        if c.pds.len() >= self.limits.max_pd as usize {
            debug::refused("ibv_alloc_pd", format_args!("the device limit max_pd = {} is reached", self.limits.max_pd));
            return Err(Error::Exhausted);
        }
        let h = self.next_handle.fetch_add(1, Ordering::Relaxed);
        c.pds.insert(h, 0);
        Ok(h)
    }

    /// Fails with `EBUSY` while QPs or SRQs still use the PD, as the kernel does. Memory
    /// regions still registered under it are deregistered with it, where the kernel would
    /// refuse: perftest 4.5's send tests leak their credit MR unless run with `-R` (a mode no
    /// kernel iWARP device could run them in), and with no QP left in the PD nothing can reach
    /// those regions any more.
    pub fn dealloc_pd(&self, pd: u32) -> Result<()> {
        let mut c = self.counts.lock();
        let Some(users) = c.pds.get(&pd).copied() else {
            debug::refused("ibv_dealloc_pd", format_args!("not a protection domain of this context"));
            return Err(Error::Invalid);
        };
        if users > 0 {
            debug::refused("ibv_dealloc_pd", format_args!("still used by {users} QP/SRQ(s)"));
            return Err(Error::Busy);
        }
        let orphans = self.mrs.deregister_pd(pd);
        if orphans > 0 {
            crate::uiw_log!(Info, "{}: ibv_dealloc_pd: deregistered {orphans} memory region(s) the application left in it", self.device.name);
        }
        c.pds.remove(&pd);
        Ok(())
    }

    fn pd_ref(&self, pd: u32, delta: isize) {
        if let Some(n) = self.counts.lock().pds.get_mut(&pd) {
            *n = n.saturating_add_signed(delta);
        }
    }

    // ---- completion channels ----

    pub fn add_channel(&self, read_fd: i32, sink: ChannelSink) {
        self.channels.lock().insert(read_fd, Arc::new(sink));
    }

    pub fn channel(&self, read_fd: i32) -> Option<Arc<ChannelSink>> {
        self.channels.lock().get(&read_fd).cloned()
    }

    /// The reader of channel `ch` woke: serves the channel's QPs whose streams have input, in
    /// its thread, and returns the first completion event that raised for the channel (see
    /// `EventQueue::serve_ready`).
    pub fn serve_channel_ready(&self, ch: &ChannelSink) -> Option<super::events::CompEvent> {
        let net = self.net.lock().clone();
        ch.serve_ready(&mut |qpn| {
            if let Some(qp) = net.as_ref().and_then(|n| n.lookup(qpn)) {
                qp.serve_for_reader();
            }
        })
    }

    /// A thread goes to sleep reading channel `ch`: it holds the channel's QPs, so that their
    /// arrivals wake it alone (see `lease`).
    pub fn channel_reader_sleeps(&self, ch: &ChannelSink) {
        self.for_channel_qps(ch, &|qp| qp.reader_sleeps());
    }

    /// The thread that slept reading channel `ch` goes back to the application.
    pub fn channel_reader_woke(&self, ch: &ChannelSink) {
        self.for_channel_qps(ch, &|qp| qp.reader_woke());
    }

    fn for_channel_qps(&self, ch: &ChannelSink, f: &dyn Fn(&dyn super::net::Endpoint)) {
        let Some(net) = self.net.lock().clone() else { return };
        for qpn in ch.watched_qps() {
            if let Some(qp) = net.lookup(qpn) {
                f(&*qp);
            }
        }
    }

    /// The read fds of the channels created so far (unregistered from the launcher's shim
    /// when the context goes).
    pub fn channel_fds(&self) -> Vec<i32> {
        self.channels.lock().keys().copied().collect()
    }

    // ---- CQs ----

    pub fn create_cq(&self, cqe: i32, channel: Option<Arc<ChannelSink>>) -> Result<Arc<CqObj>> {
        if cqe < 1 || cqe as u32 > self.limits.max_cqe {
            debug::refused("ibv_create_cq", format_args!("cqe = {cqe} is outside 1..={} (max_cqe)", self.limits.max_cqe));
            return Err(Error::Invalid);
        }
        let mut c = self.counts.lock();
        if c.cqs >= self.limits.max_cq as usize {
            debug::refused("ibv_create_cq", format_args!("the device limit max_cq = {} is reached", self.limits.max_cq));
            return Err(Error::Exhausted);
        }
        c.cqs += 1;
        Ok(Arc::new(CqObj::new(cqe as usize, channel, self.async_sink.clone())))
    }

    pub fn destroy_cq(&self, cq: &CqObj) -> Result<()> {
        let users = cq.users.load(Ordering::Acquire);
        if users > 0 {
            debug::refused("ibv_destroy_cq", format_args!("still the send or receive CQ of {users} QP queue(s)"));
            return Err(Error::Busy);
        }
        self.counts.lock().cqs -= 1;
        Ok(())
    }

    // ---- SRQs ----

    pub fn create_srq(&self, pd: u32, max_wr: u32, max_sge: u32, limit: u32) -> Result<Arc<SrqObj>> {
        let l = &self.limits;
        if max_wr == 0 || max_wr > l.max_srq_wr {
            debug::refused("ibv_create_srq", format_args!("max_wr = {max_wr} is outside 1..={} (max_srq_wr)", l.max_srq_wr));
            return Err(Error::Invalid);
        }
        if max_sge > l.max_srq_sge {
            debug::refused("ibv_create_srq", format_args!("max_sge = {max_sge} exceeds max_srq_sge = {}", l.max_srq_sge));
            return Err(Error::Invalid);
        }
        if limit > max_wr {
            debug::refused("ibv_create_srq", format_args!("srq_limit = {limit} exceeds max_wr = {max_wr}"));
            return Err(Error::Invalid);
        }
        let mut c = self.counts.lock();
        if c.srqs >= self.limits.max_srq as usize {
            debug::refused("ibv_create_srq", format_args!("the device limit max_srq = {} is reached", self.limits.max_srq));
            return Err(Error::Exhausted);
        }
        c.srqs += 1;
        drop(c);
        self.pd_ref(pd, 1);
        let mut srq = Srq::new(max_wr, max_sge.max(1));
        srq.limit = limit;
        Ok(Arc::new(SrqObj {
            handle: AtomicU64::new(0),
            pd,
            inner: Mutex::new(srq),
            async_sink: self.async_sink.clone(),
            async_events_reported: AtomicU32::new(0),
            users: AtomicU32::new(0),
            qps: Mutex::new(Vec::new()),
        }))
    }

    pub fn destroy_srq(&self, srq: &SrqObj) -> Result<()> {
        let users = srq.users.load(Ordering::Acquire);
        if users > 0 {
            debug::refused("ibv_destroy_srq", format_args!("still the SRQ of {users} QP(s)"));
            return Err(Error::Busy);
        }
        self.counts.lock().srqs -= 1;
        self.pd_ref(srq.pd, -1);
        Ok(())
    }

    // ---- QPs ----

    pub fn create_qp(&self, spec: QpSpec) -> Result<Arc<Qp>> {
        let cap = qp_state::validate_create(&spec.cap, spec.qp_type, spec.srq.is_some(), &self.limits).map_err(|e| {
            debug::refused("ibv_create_qp", format_args!("{}", e.describe()));
            Error::Create(e)
        })?;
        let net = self.net()?;
        let mut c = self.counts.lock();
        if c.qps >= self.limits.max_qp as usize {
            debug::refused("ibv_create_qp", format_args!("the device limit max_qp = {} is reached", self.limits.max_qp));
            return Err(Error::Exhausted);
        }
        let Some(qpn) = net.alloc_qpn() else {
            debug::refused("ibv_create_qp", format_args!("this process has no QP number left (4096 per process)"));
            return Err(Error::Exhausted);
        };
        c.qps += 1;
        drop(c);
        self.pd_ref(spec.pd, 1);
        spec.send_cq.users.fetch_add(1, Ordering::AcqRel);
        spec.recv_cq.users.fetch_add(1, Ordering::AcqRel);
        if let Some(s) = &spec.srq {
            s.users.fetch_add(1, Ordering::AcqRel);
        }
        let qp = Arc::new(Qp {
            qpn,
            pd: spec.pd,
            sq_sig_all: spec.sq_sig_all,
            cap,
            send_cq: spec.send_cq,
            recv_cq: spec.recv_cq,
            srq: spec.srq,
            handle: AtomicU64::new(0),
            async_sink: self.async_sink.clone(),
            async_events_reported: AtomicU32::new(0),
            mrs: self.mrs.clone(),
            device: self.device.clone(),
            net: net.clone(),
            destroyed: AtomicBool::new(false),
            kick: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            timer: AtomicBool::new(false),
            local_peer: std::sync::OnceLock::new(),
            hup: AtomicBool::new(false),
            writable: AtomicBool::new(false),
            tx_full: AtomicBool::new(false),
            awaits_answer: AtomicBool::new(false),
            answer_gave_up: AtomicBool::new(false),
            input_fd: std::sync::atomic::AtomicI32::new(-1),
            lease: Default::default(),
            polls_at_post: AtomicU64::new(u64::MAX),
            chain_bytes: AtomicU64::new(0),
            doorbell_waits: AtomicBool::new(false),
            stats: super::stats::QpStats::new(&self.device.name, &self.device.ibdev_path, qpn),
            inner: Mutex::new(QpInner { attrs: qp_state::init_attrs_from_create(&cap), dp: DataPath::default(), parked: Vec::new(), open_at: None, provisional: false, cm: None }),
        });
        let polled: Arc<dyn PolledQp> = qp.clone();
        qp.send_cq.add_qp(polled.clone());
        if !Arc::ptr_eq(&qp.send_cq, &qp.recv_cq) {
            qp.recv_cq.add_qp(polled);
        }
        if let Some(s) = &qp.srq {
            s.qps.lock().push(Arc::downgrade(&qp));
        }
        let endpoint: Arc<dyn Endpoint> = qp.clone();
        net.register(&endpoint);
        Ok(qp)
    }

    pub fn destroy_qp(&self, qp: &Qp) {
        // Like the kernel: outstanding WRs vanish without completions, the stream is closed,
        // and the QP's completions still queued in its CQs are discarded.
        qp.net.unregister(qp.qpn);
        qp.destroyed.store(true, Ordering::Release);
        {
            let mut inner = qp.inner.lock();
            if let Some(l) = inner.dp.link.as_ref() {
                qp.unwatch_link(&*l.stream);
            }
            qp.sync_stats(&mut inner);
            let env = qp.env(inner.attrs.qp_access_flags);
            if let Some(c) = inner.dp.shutdown(&env, false) {
                qp.net.linger(c);
            }
            inner.parked.clear();
            inner.open_at = None;
        }
        for cq in [&qp.send_cq, &qp.recv_cq] {
            cq.remove_qp(qp.qpn);
        }
        qp.send_cq.lock_q().purge_qp(qp.qpn);
        qp.recv_cq.lock_q().purge_qp(qp.qpn);
        qp.send_cq.users.fetch_sub(1, Ordering::AcqRel);
        qp.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
        if let Some(s) = &qp.srq {
            s.users.fetch_sub(1, Ordering::AcqRel);
        }
        self.pd_ref(qp.pd, -1);
        self.counts.lock().qps -= 1;
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.net.get_mut().take().is_some() {
            Net::release();
        }
    }
}
