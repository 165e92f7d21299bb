//! The sysfs-shaped tree libibverbs reads when `SYSFS_PATH` points at it.
//!
//! [`render`] is a pure function from a device description to (path, bytes)
//! pairs, in the formats the kernel's `drivers/infiniband/core/sysfs.c` and
//! `uverbs_main.c` print (every file ends in `\n`, as sysfs files do; libibverbs
//! strips it). [`publish`] writes a whole tree next to the live one and swaps it
//! in with one `renameat2(RENAME_EXCHANGE)`, so a reader never sees half a tree.

use crate::netdev::{ib_speed_width, rate_text, Netdev};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// `IB_USER_VERBS_ABI_VERSION`: the class-wide uverbs ABI (libibverbs accepts 3..=6).
pub const CLASS_ABI_VERSION: &str = "6";
/// The per-device driver ABI (`uverbsN/abi_version`, siw's `SIW_ABI_VERSION` is 1 too).
/// The provider's `match_{min,max}_abi_version` must include it.
pub const DEVICE_ABI_VERSION: &str = "1";
/// Version of the `uiw/` directory layout the provider reads.
pub const UIW_FORMAT: &str = "1";
/// siw's port_cap_flags: IB_PORT_CM_SUP | IB_PORT_DEVICE_MGMT_SUP.
pub const CAP_MASK: u32 = (1 << 16) | (1 << 19);

#[derive(Debug, Clone)]
pub struct Device {
    pub ibdev: String,
    pub uverbs: u32,
    /// (major, minor) of /dev/infiniband/uverbsN as stat(2) reports it.
    pub rdev: (u32, u32),
    pub netdev: Netdev,
    /// What carries its QPs' streams (`tcp`, `xdp`, `packet`).
    pub transport: String,
}

/// The node GUID, like siw: the MAC in the first six bytes and zeros after it. Netdevs
/// without a MAC (lo, tun, wireguard): like siw, the first six bytes of the IB device
/// name when it is at most six bytes long ("uiw_lo"), else a 64-bit FNV-1a hash of it.
/// Never zero.
pub fn node_guid(ibdev: &str, mac: &[u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    if mac.iter().any(|&x| x != 0) {
        b[..6].copy_from_slice(mac);
        return u64::from_be_bytes(b);
    }
    let name = ibdev.as_bytes();
    if !name.is_empty() && name.len() <= 6 {
        b[..name.len()].copy_from_slice(name);
        return u64::from_be_bytes(b);
    }
    let h = fnv1a64(name);
    if h == 0 {
        1
    } else {
        h
    }
}

pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in data {
        h ^= x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `xxxx:xxxx:xxxx:xxxx`, as the kernel prints node_guid / sys_image_guid.
pub fn guid_text(g: u64) -> String {
    format!("{:04x}:{:04x}:{:04x}:{:04x}", (g >> 48) & 0xffff, (g >> 32) & 0xffff, (g >> 16) & 0xffff, g & 0xffff)
}

/// A GID as `ports/<p>/gids/<i>` prints it (`%pI6`: 8 groups of 4 hex digits).
pub fn gid_text(raw: &[u8; 16]) -> String {
    let groups: Vec<String> =
        raw.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect();
    groups.join(":")
}

/// The GID table: the netdev's IPv4 addresses as IPv4-mapped IPv6 addresses.
/// A netdev with no IPv4 address gets one all-zero entry (the table is never empty).
pub fn gid_table(nd: &Netdev) -> Vec<[u8; 16]> {
    let mut t: Vec<[u8; 16]> = nd.ipv4.iter().map(|a| a.to_ipv6_mapped().octets()).collect();
    if t.is_empty() {
        t.push([0; 16]);
    }
    t
}

/// The device's parent, as the kernel's `<ibdev>/device` symlink names a PCI function or,
/// for software devices, a `/virtual/` one: `devices/virtual/uiw/<ibdev>`, holding
/// `modalias` and `net/<netdev>`. hwloc places an RDMA device by that link (virtual ones
/// near the root, with `--whole-io`), rdma-core's tests/base.py lists `device/net/`.
pub fn parent_dir(ibdev: &str) -> String {
    format!("devices/virtual/uiw/{ibdev}")
}

/// All files of one device, paths relative to the tree root (`$SYSFS_PATH`).
pub fn render(dev: &Device) -> Vec<(String, String)> {
    let nd = &dev.netdev;
    let d = format!("class/infiniband/{}", dev.ibdev);
    let u = format!("class/infiniband_verbs/uverbs{}", dev.uverbs);
    let p = format!("{d}/ports/1");
    let guid = guid_text(node_guid(&dev.ibdev, &nd.mac));
    let (speed, width) = ib_speed_width(nd.speed_mbps);
    let (state, phys) = if nd.running { ("4: ACTIVE", "5: LinkUp") } else { ("1: DOWN", "3: Disabled") };
    let mac = nd.mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    let gids = gid_table(nd);

    let mut f: Vec<(String, String)> = vec![
        (format!("{u}/ibdev"), dev.ibdev.clone()),
        (format!("{u}/dev"), format!("{}:{}", dev.rdev.0, dev.rdev.1)),
        (format!("{u}/abi_version"), DEVICE_ABI_VERSION.into()),
        (format!("{d}/node_type"), "4: RNIC".into()),
        (format!("{d}/node_guid"), guid.clone()),
        (format!("{d}/sys_image_guid"), guid),
        (format!("{d}/node_desc"), format!("uiw {}", nd.name)),
        (format!("{d}/fw_ver"), env!("CARGO_PKG_VERSION").into()),
        (format!("{d}/board_id"), "uiw".into()),
        (format!("{d}/hca_type"), "uiw".into()),
        (format!("{}/modalias", parent_dir(&dev.ibdev)), format!("uiw:{}", nd.name)),
        (format!("{p}/state"), state.into()),
        (format!("{p}/phys_state"), phys.into()),
        (format!("{p}/link_layer"), "Ethernet".into()),
        (format!("{p}/rate"), rate_text(speed, width)),
        (format!("{p}/lid"), "0x0".into()),
        (format!("{p}/sm_lid"), "0x0".into()),
        (format!("{p}/lid_mask_count"), "0".into()),
        (format!("{p}/sm_sl"), "0".into()),
        (format!("{p}/cap_mask"), format!("0x{CAP_MASK:08x}")),
        (format!("{p}/pkeys/0"), "0xffff".into()),
    ];
    for (i, g) in gids.iter().enumerate() {
        f.push((format!("{p}/gids/{i}"), gid_text(g)));
        // iWARP GIDs live in the kernel's GID cache as IB_GID_TYPE_IB, which prints as
        // "IB/RoCE v1". The file must exist for every index: libibverbs fails the whole
        // GID-table query (EFAULT) when gid_attrs/ exists but a types/<i> file is missing.
        f.push((format!("{p}/gid_attrs/types/{i}"), "IB/RoCE v1".into()));
        // The kernel answers EINVAL for an empty entry's ndev; a missing file reads as
        // "no netdev" (ifindex 0) in libibverbs, which is the same thing.
        if g.iter().any(|&b| b != 0) {
            f.push((format!("{p}/gid_attrs/ndevs/{i}"), nd.name.clone()));
        }
    }
    // Machine-readable facts for the provider (read through ibdev_path).
    f.extend([
        (format!("{d}/uiw/format"), UIW_FORMAT.into()),
        (format!("{d}/uiw/netdev"), nd.name.clone()),
        // What carries the streams (`uiw up --transport`): the provider reads it.
        (format!("{d}/uiw/transport"), dev.transport.clone()),
        (format!("{d}/uiw/mtu"), nd.mtu.to_string()),
        (format!("{d}/uiw/ifindex"), nd.ifindex.to_string()),
        (format!("{d}/uiw/mac"), mac),
        (format!("{d}/uiw/gid_tbl_len"), gids.len().to_string()),
        (format!("{d}/uiw/active_speed"), speed.to_string()),
        (format!("{d}/uiw/active_width"), width.to_string()),
        (format!("{d}/uiw/uverbs"), format!("uverbs{}", dev.uverbs)),
    ]);
    for e in f.iter_mut() {
        e.1.push('\n');
    }
    f
}

/// Real kernel RDMA devices to mirror (symlinks into the host's /sys).
#[derive(Debug, Default)]
pub struct Mirror {
    /// (entry name under class/infiniband_verbs, absolute target)
    pub verbs: Vec<(String, PathBuf)>,
    /// (ibdev name, absolute target)
    pub ibdevs: Vec<(String, PathBuf)>,
}

/// Kernel devices under `<host_sysfs>/class/infiniband{,_verbs}`, skipping names ours use.
pub fn scan_kernel(host_sysfs: &Path, ours: &[Device]) -> Mirror {
    let mut m = Mirror::default();
    let list = |sub: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(host_sysfs.join(sub))
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    for n in list("class/infiniband_verbs") {
        if n.starts_with('.') || n == "abi_version" || ours.iter().any(|d| format!("uverbs{}", d.uverbs) == n) {
            continue;
        }
        m.verbs.push((n.clone(), host_sysfs.join("class/infiniband_verbs").join(&n)));
    }
    for n in list("class/infiniband") {
        if n.starts_with('.') || ours.iter().any(|d| d.ibdev == n) {
            continue;
        }
        m.ibdevs.push((n.clone(), host_sysfs.join("class/infiniband").join(&n)));
    }
    m
}

/// Indices N of the host kernel's `uverbsN` devices.
pub fn kernel_uverbs(host_sysfs: &Path) -> Vec<u32> {
    fs::read_dir(host_sysfs.join("class/infiniband_verbs"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.strip_prefix("uverbs")).and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

fn write_file(path: &Path, content: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, content)
}

/// Build the complete tree in `<root>.new` and swap it into place at `root`.
/// `<ibdev>/device` links to [`parent_dir`], whose `net/<netdev>` links to
/// `<host_sysfs>/class/net/<netdev>` (host_sysfs is normally /sys), as the kernel's
/// `device/net/` lists the parent device's netdevs (rdma-core's tests/base.py finds a
/// device's netdev, and so its IP address, there).
pub fn publish(root: &Path, devices: &[Device], mirror: &Mirror, host_sysfs: &Path) -> io::Result<()> {
    let name = root.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "sysfs".into());
    let tmp = root.with_file_name(format!(".{name}.new"));
    let old = root.with_file_name(format!(".{name}.old"));
    let _ = fs::remove_dir_all(&tmp);
    let _ = fs::remove_dir_all(&old);
    fs::create_dir_all(tmp.join("class/infiniband_verbs"))?;
    fs::create_dir_all(tmp.join("class/infiniband"))?;
    write_file(&tmp.join("class/infiniband_verbs/abi_version"), &format!("{CLASS_ABI_VERSION}\n"))?;
    for d in devices {
        for (rel, content) in render(d) {
            write_file(&tmp.join(rel), &content)?;
        }
        let parent = parent_dir(&d.ibdev);
        let net = tmp.join(&parent).join("net");
        fs::create_dir_all(&net)?;
        std::os::unix::fs::symlink(host_sysfs.join("class/net").join(&d.netdev.name), net.join(&d.netdev.name))?;
        std::os::unix::fs::symlink(format!("../../../{parent}"), tmp.join(format!("class/infiniband/{}/device", d.ibdev)))?;
    }
    for (n, target) in &mirror.verbs {
        std::os::unix::fs::symlink(target, tmp.join("class/infiniband_verbs").join(n))?;
    }
    for (n, target) in &mirror.ibdevs {
        std::os::unix::fs::symlink(target, tmp.join("class/infiniband").join(n))?;
    }
    if root.exists() {
        if exchange(&tmp, root).is_err() {
            fs::rename(root, &old)?;
            fs::rename(&tmp, root)?;
            let _ = fs::remove_dir_all(&old);
        } else {
            fs::remove_dir_all(&tmp)?;
        }
    } else {
        fs::rename(&tmp, root)?;
    }
    Ok(())
}

use uiw_kabi::sys::rename_exchange as exchange;

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn guids() {
        assert_eq!(guid_text(node_guid("uiw_lo", &[0; 6])), "7569:775f:6c6f:0000");
        assert_eq!(guid_text(node_guid("uiw_eth0", &[0x52, 0x54, 0, 0x12, 0x34, 0x56])), "5254:0012:3456:0000");
        assert_ne!(node_guid("uiw_wireguard0", &[0; 6]), 0);
        assert_ne!(node_guid("uiw_tun0", &[0; 6]), node_guid("uiw_tun1", &[0; 6]));
    }
    #[test]
    fn gids() {
        let a: std::net::Ipv4Addr = "127.0.0.1".parse().unwrap();
        assert_eq!(gid_text(&a.to_ipv6_mapped().octets()), "0000:0000:0000:0000:0000:ffff:7f00:0001");
    }
}
