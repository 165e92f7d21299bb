//! `enum ibv_access_flags` (verbs.h) and which of them memory regions and QPs accept.

pub const LOCAL_WRITE: u32 = 1 << 0;
pub const REMOTE_WRITE: u32 = 1 << 1;
pub const REMOTE_READ: u32 = 1 << 2;
pub const REMOTE_ATOMIC: u32 = 1 << 3;
pub const MW_BIND: u32 = 1 << 4;
pub const ZERO_BASED: u32 = 1 << 5;
pub const ON_DEMAND: u32 = 1 << 6;
pub const HUGETLB: u32 = 1 << 7;
/// `IBV_ACCESS_FLUSH_GLOBAL` / `IBV_ACCESS_FLUSH_PERSISTENT` (rdma-core v45+).
pub const FLUSH_GLOBAL: u32 = 1 << 8;
pub const FLUSH_PERSISTENT: u32 = 1 << 9;
pub const RELAXED_ORDERING: u32 = 1 << 20;
/// `IBV_ACCESS_OPTIONAL_RANGE` (bits 20..=29): by rdma-core contract a
/// provider that does not understand an optional bit ignores it.
pub const OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// Flags uiw honours when registering a memory region.
pub const MR_SUPPORTED: u32 =
    LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC | MW_BIND | ZERO_BASED | HUGETLB | RELAXED_ORDERING;
/// Every flag libibverbs defines up to v56: an MR flag outside it is EINVAL.
pub const MR_KNOWN: u32 = MR_SUPPORTED | ON_DEMAND | FLUSH_GLOBAL | FLUSH_PERSISTENT;

/// Every bit `qp_state::validate_modify` accepts in `qp_access_flags`. `REMOTE_ATOMIC` is
/// accepted (and stored) although `atomic_cap` is NONE: rxe accepts it, iw_cm and many
/// applications set it unconditionally, and an incoming atomic is refused by the engine at run
/// time anyway. `MW_BIND`, `ZERO_BASED`, `ON_DEMAND` and `HUGETLB` are MR flags with no QP
/// meaning; they are tolerated (siw ignores unknown bits) so sloppy callers keep working.
pub const QP_ACCEPTED: u32 =
    LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC | MW_BIND | ZERO_BASED | ON_DEMAND | HUGETLB | OPTIONAL_RANGE;
