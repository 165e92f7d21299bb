//! `uiw --help` and `uiw <command> --help`.

pub const MAIN: &str = "\
NAME
    uiw - publish, inspect and use uiw software iWARP RDMA devices

SYNOPSIS
    uiw [--state-dir DIR] COMMAND [OPTIONS]
    uiw up [--rootless] [--transport tcp|packet|xdp] [--netdev NAME]... [--config FILE]
    uiw down [--netdev NAME]... [--config FILE]
    uiw show [-d]
    uiw env
    uiw run [--] CMD [ARGS]...
    uiw stat [qp] [-a] [-j] [-d DEV] [-p PID] [-c COUNTER,...] [--prune]
    uiw install [--provider-dir DIR]
    uiw uninstall [--provider-dir DIR]

DESCRIPTION
    uiw is a userspace software iWARP provider for rdma-core's libibverbs. There
    is no kernel module: `uiw up` plays the part `rdma link add NAME type siw
    netdev DEV` plays for the kernel's siw. It writes a sysfs-shaped description
    of one RDMA device per network device (uiw_<netdev>) into a state directory
    and creates the /dev/infiniband/uverbsN node libibverbs insists on opening.
    Programs then find the device when started with `uiw run` (or with the
    variables `uiw env` prints), and talk iWARP over TCP with other uiw and siw
    peers.

COMMANDS
    up        Publish devices (default: uiw_lo on lo). As root it also creates
              /dev/infiniband nodes; as any other user it publishes in rootless
              mode (no node needed). Idempotent; re-run it after address changes.
    down      Withdraw devices (default: all) and remove the nodes only uiw used.
    show      List published devices, like `rdma link show`.
    env       Print `export VAR=...` lines for a POSIX shell: eval \"$(uiw env)\".
    run       Run a program with the uiw environment (SYSFS_PATH, RDMAV_DRIVERS,
              LD_PRELOAD of the uiw shim).
    stat      Show traffic and error counters of the processes using the
              devices, per device, process and QP, like `rdma statistic`.
    install   Install the provider system-wide (libibverbs provider directory and
              /etc/libibverbs.d/uiw.driver), the shim and the librdmacm drop-in
              (private <libdir>/uiw/; the Debian package installs the same).
    uninstall Reverse `uiw install`.

    `uiw COMMAND --help` describes each command in detail.

GLOBAL OPTIONS
    --state-dir DIR   State directory (default: $UIW_STATE_DIR, else /run/uiw for
                      root, else $XDG_RUNTIME_DIR/uiw or ~/.local/state/uiw; show,
                      env and run fall back to /run/uiw when the user has
                      published nothing and root has).
    -h, --help        Show this help.
    -V, --version     Show the version.

FILES
    /run/uiw/sysfs               the tree SYSFS_PATH points at
    /run/uiw/lib                 libuiw-rdmavN.so (N = 34 57 59 64 65) and
                                 libuiw_preload.so links
    /run/uiw/devices             published devices: <ibdev> <netdev> uverbs<N>
    /run/uiw/stats/<ibdev>.<pid> counters of each process using a device
    /dev/infiniband/uverbsN      device nodes (char 1:3, or a symlink to /dev/null)
    /run/uiw-nodes/uverbsN/      which state directories use each node

ENVIRONMENT
    UIW_STATE_DIR      state directory (default: see --state-dir)
    UIW_ROOTLESS=1     `up` publishes in rootless mode even as root
    VERBS_LOG_LEVEL, VERBS_LOG_FILE, UIW_DEBUG
                       the provider's diagnostics in programs: rdma-core's
                       levels (1 errors, 2 warnings, 3 information, 4 debug)
                       and log file (appended; default stderr); UIW_DEBUG=1
                       is level 4
    UIW_PROGRESS_CPUS  CPUs (a list such as 0,2-3) of a program's uiw progress
                       thread; default: those the process may use minus the
                       CPUs of the thread that created the first QP, and
                       minus the CPU the program polls on once the progress
                       thread keeps finding itself there
    UIW_CRC=1          connections ask for MPA CRC32c (off by default; a peer
                       that asks gets it either way, RFC 5044 §7.1)
    UIW_LIBDIR         colon-separated directories searched first for
                       libuiw_rdmav34.so and libuiw_preload.so
    UIW_NODE_REGISTRY  node ownership registry (default /run/uiw-nodes)
    UIW_INSTALL_ROOT   prefix for install/uninstall (like DESTDIR)
    UIW_DEV_DIR, UIW_HOST_SYSFS
                       testing only: replace /dev/infiniband and /sys. libibverbs
                       itself always opens /dev/infiniband.

EXIT STATUS
    0 on success, 1 on failure, 2 on a usage error; `run` returns the program's.

SEE ALSO
    rdma-link(8), ibv_devices(1), ibv_devinfo(1)
";

pub const UP: &str = "\
NAME
    uiw up - publish uiw devices

SYNOPSIS
    uiw up [--rootless] [--transport tcp|packet|xdp] [--netdev NAME]... [--config FILE]

DESCRIPTION
    Publishes one RDMA device named uiw_<NAME> for each --netdev (default: lo),
    in addition to those already published from this state directory, and
    refreshes all of them: GID table (the netdev's IPv4 addresses as IPv4-mapped
    IPv6 GIDs, ::ffff:a.b.c.d), MTU, link state and the list of mirrored kernel
    RDMA devices. Running it again changes nothing else; it is safe to repeat.

    For each device it writes, under <state>/sysfs:
        class/infiniband_verbs/abi_version                 6
        class/infiniband_verbs/uverbsN/{ibdev,dev,abi_version}
        class/infiniband/uiw_NAME/{node_type,node_guid,sys_image_guid,node_desc,
            fw_ver,board_id,hca_type}
        class/infiniband/uiw_NAME/device -> ../../../devices/virtual/uiw/uiw_NAME
        devices/virtual/uiw/uiw_NAME/{modalias,net/NAME -> /sys/class/net/NAME}
        class/infiniband/uiw_NAME/ports/1/{state,phys_state,link_layer,rate,lid,
            sm_lid,lid_mask_count,sm_sl,cap_mask,gids/I,gid_attrs/types/I,
            gid_attrs/ndevs/I,pkeys/0}
        class/infiniband/uiw_NAME/uiw/{format,netdev,mtu,ifindex,mac,gid_tbl_len,
            active_speed,active_width,uverbs}     (read by the provider)
    and creates /dev/infiniband/uverbsN (N: the lowest index no kernel device
    and no other device of this state directory uses): a character device with
    /dev/null's numbers 1:3, or, where mknod is refused, a symlink to /dev/null.
    `uverbsN/dev` holds the node's real numbers, so libibverbs will not hand a
    real kernel uverbs node that later takes the name to the uiw provider.

    Real kernel RDMA devices found in /sys/class/infiniband{,_verbs} are
    mirrored into the tree as symlinks, so `uiw run` does not hide them
    (best effort: devices that appear later show up after the next `uiw up`).

    Creating /dev/infiniband needs root once, like `rdma link add`.

ROOTLESS MODE
    Whoever cannot write /dev/infiniband (a user; root where /dev is
    read-only, as in many containers), or `--rootless`, publishes without a
    node. A user's state directory defaults to $XDG_RUNTIME_DIR/uiw, else
    ~/.local/state/uiw; `uverbsN/dev` says 1:3 and N is an index that no
    kernel device and no existing file uses. Programs started with `uiw run`
    (or with `uiw env`'s LD_PRELOAD) find the device anyway: the shim answers
    libibverbs' stat/open of an absent /dev/infiniband/uverbsN of a uiw device
    with /dev/null, and redirects reads of /sys/class/infiniband and
    /sys/class/infiniband_verbs to the published tree, so programs that read
    sysfs themselves (rdma-core's tests, hwloc, Open MPI, UCX) see the same
    devices. The devices are private to the user (other users' programs and
    programs started without the shim do not see them); nothing outside the
    state directory is written. Existing nodes and kernel devices are never
    hidden: the shim answers only for nodes that do not exist.

OPTIONS
    --netdev NAME   Network device to attach to; repeatable. Default: lo.
    --rootless      Publish without /dev/infiniband nodes even when able to
                    create them (also: UIW_ROOTLESS=1).
    --transport T   What carries the devices' iWARP streams. `tcp` (default):
                    the kernel's TCP sockets. `xdp` (AF_XDP) and `packet`
                    (AF_PACKET): uiw's own userspace TCP on raw Ethernet frames,
                    bypassing the kernel's TCP; they need --netdev (not lo), and
                    programs using the device need root (CAP_NET_RAW,
                    CAP_NET_ADMIN, CAP_BPF for xdp): each process opens the
                    transport on the netdev when it creates its first QP (one
                    such process per netdev at a time). QP numbers, MPA and RTR
                    connects are as over tcp, and a tcp peer interoperates.
                    rdma_cm (uiw's librdmacm) works over them for IPv4; an
                    active connection's source port is one of the
                    transport's, whatever port the application bound. xdp
                    carries a jumbo MTU (9000) as AF_XDP multi-buffer (kernel
                    6.6+; an older kernel's devices announce an MSS that fits
                    one 4 KiB frame). The devices named take the transport
                    given (tcp if none); `uiw show` prints each device's
                    transport.
    --config FILE   Also the network devices FILE names (white-space separated,
                    `#` starts a comment; a file naming none is an error). The
                    Debian package's uiw.service runs
                    `uiw up --config /etc/uiw/devices` at boot.
";

pub const DOWN: &str = "\
NAME
    uiw down - withdraw uiw devices

SYNOPSIS
    uiw down [--netdev NAME]... [--config FILE]

DESCRIPTION
    Withdraws the devices attached to each --netdev (default: all devices of
    this state directory). Removes a /dev/infiniband/uverbsN node only when no
    other state directory uses it and it is a uiw node (char 1:3 or a symlink to
    /dev/null); kernel nodes are never touched. With no device left, removes the
    tree, the library links and the manifest. Withdrawing nothing is not an
    error.

OPTIONS
    --netdev NAME   Withdraw only uiw_NAME; repeatable.
    --config FILE   Withdraw the devices of the network devices FILE names.
";

pub const SHOW: &str = "\
NAME
    uiw show - list devices

SYNOPSIS
    uiw show [-d|--details]

DESCRIPTION
    Prints one line per port, in the format of `rdma link show`:
        link uiw_lo/1 state ACTIVE physical_state LINK_UP netdev lo transport tcp
    Mirrored kernel devices are listed too, marked `(kernel)`. The state is the
    one recorded by the last `uiw up`.

OPTIONS
    -d, --details   Also print node, GUID, MTU and GIDs.
";

pub const ENV: &str = "\
NAME
    uiw env - print the environment that selects uiw devices

SYNOPSIS
    eval \"$(uiw env)\"

DESCRIPTION
    Prints POSIX shell `export` lines:
        SYSFS_PATH       <state>/sysfs: libibverbs reads devices from there
                         when it cannot open a NETLINK_RDMA socket
        RDMAV_DRIVERS    <state>/lib/libuiw: libibverbs appends its own suffix and
                         loads <state>/lib/libuiw-rdmavN.so (N: its private ABI,
                         34 for rdma-core v36-v56, 57, 59, 64 or 65 after it);
                         omitted when `uiw install` installed the provider
        LD_PRELOAD       appends libuiw_preload.so, which makes NETLINK_RDMA
                         sockets fail (so hosts with an RDMA kernel stack use
                         SYSFS_PATH too), serves completion-channel commands,
                         redirects /sys/class/infiniband{,_verbs} to SYSFS_PATH
                         and answers absent /dev/infiniband/uverbsN of uiw
                         devices (rootless mode)
        LD_LIBRARY_PATH  prepends <libdir>/rdmacm (the librdmacm drop-in), if
                         that directory exists
        FI_OFI_RXM_SAR_LIMIT
                         16384, unless already set: libfabric's rxm (MPI over
                         FI_PROVIDER=\"verbs;ofi_rxm\") then sends messages above
                         its 16 KiB eager limit by rendezvous (one RDMA Read
                         between the applications' buffers) instead of copying
                         them through bounce buffers in 16 KiB Sends; 64 KiB MPI
                         messages move about twice as fast on uiw
";

pub const RUN: &str = "\
NAME
    uiw run - run a program on uiw devices

SYNOPSIS
    uiw run [--] CMD [ARGS]...

DESCRIPTION
    Executes CMD with the variables `uiw env` describes set (an existing
    LD_PRELOAD is kept, the shim is appended; an existing RDMAV_DRIVERS is kept,
    uiw's is appended; an existing FI_OFI_RXM_SAR_LIMIT is left as it is). If
    no device is published yet, publishes uiw_lo first (`uiw up`; rootless mode
    when not root).

EXAMPLES
    uiw run -- ibv_devinfo -v
    uiw run -- ib_write_bw -d uiw_lo -x 0         (server)
    uiw run -- ib_write_bw -d uiw_lo -x 0 127.0.0.1
    uiw run -- ibv_rc_pingpong -d uiw_lo -g 0

EXIT STATUS
    CMD's exit status; 127 if CMD cannot be executed; 1 on uiw's own failures.
";

pub const STAT: &str = "\
NAME
    uiw stat - show the counters of the processes using uiw devices

SYNOPSIS
    uiw stat [show] [-a] [-j] [-d DEV] [-p PID] [-c COUNTER[,COUNTER]...]
    uiw stat qp [-a] [-j] [-d DEV] [-p PID] [-c COUNTER[,COUNTER]...]
    uiw stat --prune

DESCRIPTION
    Every process that creates a QP on a uiw device keeps its counters in a
    small file of the state directory, <state>/stats/<ibdev>.<pid>, which its
    provider updates with atomic adds as traffic flows. `uiw stat` reads those
    files: it shows the counters of running programs at any moment, needs
    nothing from them (no signal, no socket, no thread of theirs), and can run
    as any user who can read the state directory.

    Without `qp`, it prints one line per device with the sum over the
    processes shown, then one line per process, in the spirit of
    `rdma statistic show`:
        link uiw_lo/1 processes 2 tx_bytes 13107200 rx_bytes 0 tx_msgs 200 ...
        link uiw_lo/1 pid 4242 comm ib_write_bw qps 1 tx_bytes 13107200 ...
    A process's line counts every QP it had on the device, destroyed ones
    included. With `qp`, one line per QP (like `rdma statistic qp show`):
        link uiw_lo/1 pid 4242 comm ib_write_bw lqpn 4097 tx_bytes 13107200 ...

COUNTERS
    tx_bytes, rx_bytes   DDP payload bytes of Send, RDMA Write and Read
                         Response messages: the application's bytes, without
                         headers, markers or CRC
    tx_msgs, rx_msgs     RDMAP messages (RFC 5040; RFC 7306's atomics and
                         Immediate Data; Terminates), counted with their last
                         FPDU; the MPA exchange and its RTR are not counted
    tx_fpdus, rx_fpdus   FPDUs (RFC 5044) sent and received
    tx_terminates, rx_terminates
                         Terminate messages (RFC 5040 section 5.2): a protocol
                         error found by this side (tx) or by the peer (rx)
    flushed_wrs          work requests completed with IBV_WC_WR_FLUSH_ERR
    conn_errors          streams that failed: peer unreachable or refused,
                         reset, gone, MPA rejected
    conn_established     streams that completed MPA negotiation
    reader_serves        arrivals on a QP's stream that a thread waiting in
                         ibv_get_cq_event served itself (under `uiw run`), where
                         otherwise the progress thread is woken and then wakes it
    Counters only grow. Sent counts are taken when the provider hands the
    data to the socket.

OPTIONS
    qp                 One line per QP.
    -a, --all          Also processes that have exited (marked `exited`) and
                       destroyed QPs (marked `destroyed`). A file is an exited
                       process's when its pid is gone or belongs to a process
                       started at another time.
    -d, --dev DEV      Only device DEV (uiw_lo or uiw_lo/1).
    -p, --pid PID      Only process PID.
    -c, --counter LIST Only these counters (comma-separated names).
    -j, --json         One JSON array instead of lines, like `rdma -j statistic`:
                       an object per process and device, {\"ifname\", \"port\",
                       \"pid\", \"comm\", \"exited\", \"counters\": {NAME: N, ...},
                       \"qps\": [{\"lqpn\", \"destroyed\", \"counters\"}, ...]}.
    --prune            Remove the files of exited processes. Each new process
                       also removes all but the 32 newest such files.

FILES
    <state>/stats/<ibdev>.<pid>
        Fixed layout, native byte order: a 128-byte header (magic
        \"UIWSTAT1\", version 2, pid, process start time, device name, a fold
        sequence), a device block of 16 u64 counters, then 256 QP slots (a u64
        word: bit 63 live, bit 62 destroyed, bit 61 folded, bits 0-23 the QPN;
        then 16 u64 counters). A live QP counts in its slot; its destroy folds
        the slot into the device block, and a process's totals are the device
        block plus the slots not folded. Version 1 files (the device block the
        sum over every QP) are read as well. The full description is in
        kabi/src/stats.rs. The directory is mode 1777.

EXIT STATUS
    0, also when no process uses a device (a note says so on stderr);
    2 on a usage error.

SEE ALSO
    rdma-statistic(8)
";

pub const INSTALL: &str = "\
NAME
    uiw install - install the uiw provider system-wide

SYNOPSIS
    uiw install [--provider-dir DIR]

DESCRIPTION
    Copies the provider to libibverbs' provider directory as
    libuiw-rdmav34.so (e.g. /usr/lib/x86_64-linux-gnu/libibverbs/), with links
    libuiw-rdmav{57,59,64,65}.so to it (the names rdma-core v57 to v65 load;
    the provider picks the running libibverbs' layout), the shim to
    <libdir>/uiw/libuiw_preload.so, the librdmacm drop-in to
    <libdir>/uiw/rdmacm/librdmacm.so.1, and writes /etc/libibverbs.d/uiw.driver
    (`driver uiw`). Afterwards RDMAV_DRIVERS is not needed. Programs still need
    SYSFS_PATH (and, on hosts where NETLINK_RDMA works, the shim): use `uiw run`,
    which also puts <libdir>/uiw/rdmacm first on LD_LIBRARY_PATH. The system's
    own librdmacm is not replaced: only programs started by `uiw run` use the
    drop-in. This is the layout of the Debian package (packaging/build-deb.sh).
    The provider directory is the first of `pkg-config --variable=libdir
    libibverbs`/libibverbs and the distributions' usual places that already
    holds a lib*-rdmavN.so. UIW_INSTALL_ROOT prefixes every path (DESTDIR).

OPTIONS
    --provider-dir DIR   Install the provider into DIR instead.
";

pub const UNINSTALL: &str = "\
NAME
    uiw uninstall - remove what `uiw install` installed

SYNOPSIS
    uiw uninstall [--provider-dir DIR]

DESCRIPTION
    Removes libuiw-rdmavN.so (every N) from the provider directory, the shim,
    the librdmacm drop-in (and the then empty <libdir>/uiw) and
    /etc/libibverbs.d/uiw.driver. Removing nothing is not an error.
";
