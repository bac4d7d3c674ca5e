"""Kernel layers of the code sandbox (stdlib only). `_harness.py` loads this file from its own
directory; the trainer never imports it except in tests.

Each layer is enforced by the kernel, not by the interpreter that runs the untrusted program:
  * namespaces: a user namespace (so that an unprivileged trainer may create the others, and so
    that RLIMIT_NPROC counts this sandbox's processes only), a PID namespace whose init's death
    kills every process in it, and a network namespace (only a loopback device, which is down);
  * ids: as root, uid/gid 65534 without supplementary groups, so that RLIMIT_NPROC binds;
  * rlimits: CPU, address space, file size, open files, processes, no core dumps;
  * Landlock (ABI >= 1): reads only below an allowlist (the interpreter's files, the sandbox
    directory), writes only where the harness says, no TCP (ABI >= 4), no signals or abstract
    Unix sockets out of the domain (ABI >= 6);
  * seccomp-BPF: no socket(2) of any family (pathname Unix sockets included), no io_uring (it
    would bypass the socket rule), no new namespaces, mounts, ptrace, bpf or keyrings, and only
    the native system-call ABI.
Functions return None when the layer is in place, else a one-line reason.
"""

import ctypes
import os
import resource
import select
import signal
import struct
import sysconfig

LIBC = ctypes.CDLL(None, use_errno=True)
NOBODY = 65534  # the uid/gid a root trainer's sandbox runs as
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NEW_ANY = 0x7E020080  # every CLONE_NEW* flag (NS, CGROUP, UTS, IPC, USER, PID, NET, TIME)
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38

# Landlock (linux/landlock.h); its syscall numbers are the same on x86_64 and arm64.
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_FILE, FS_MAKE_REG, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 5, 1 << 8, 1 << 14, 1 << 15
READ = FS_READ_FILE | FS_READ_DIR
WRITE_IN_DIR = FS_WRITE_FILE | FS_TRUNCATE | FS_MAKE_REG | FS_REMOVE_FILE
READ_FILES = ("/etc/ld.so.cache", "/dev/urandom")  # dlopen's cache; a random source by path

# seccomp: (audit arch, syscalls denied with EPERM, clone, clone3) per machine.
SECCOMP_ABI = {
    "x86_64": (0xC000003E, (41, 425, 426, 427, 272, 308, 165, 166, 155, 161, 101, 310, 311, 321,
                            250, 248, 249, 298, 323, 428, 429, 430, 431, 432, 433, 438, 303, 304,
                            442), 56, 435),
    "aarch64": (0xC00000B7, (198, 425, 426, 427, 97, 268, 40, 39, 41, 51, 117, 270, 271, 280,
                             219, 217, 218, 241, 282, 428, 429, 430, 431, 432, 433, 438, 264,
                             265, 442), 220, 435),
}  # socket, io_uring_{setup,enter,register}, unshare, setns, mount, umount2, pivot_root, chroot,
#    ptrace, process_vm_{readv,writev}, bpf, keyctl, add_key, request_key, perf_event_open,
#    userfaultfd, open_tree, move_mount, fs{open,config,mount,pick}, pidfd_getfd,
#    name_to_handle_at, open_by_handle_at, mount_setattr
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def _errno_reason(what):
    return f"{what}: {os.strerror(ctypes.get_errno())}"


def _prctl(option, arg2=0):
    return LIBC.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(0),
                      ctypes.c_ulong(0), ctypes.c_ulong(0))


def die_with_parent(alive_fd):
    """SIGKILL when the parent dies. `alive_fd`: the read end of a pipe whose write end only the
    parent holds; at EOF the parent died before PR_SET_PDEATHSIG took effect. Must be called
    again after any change of uid (the kernel clears the setting)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if select.select([alive_fd], [], [], 0)[0]:
        os._exit(70)


def unshare(flags):
    return None if LIBC.unshare(ctypes.c_int(flags)) == 0 else _errno_reason("unshare")


def write_id_maps(pid, inside, outer_uid, outer_gid):
    """Maps `inside` to the outer ids in `pid`'s new user namespace (setgroups denied first, as
    the kernel requires of an unprivileged writer)."""
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{inside} {outer_uid} 1"),
                           ("gid_map", f"{inside} {outer_gid} 1")):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
    except OSError as e:
        return f"writing /proc/{pid}/{name}: {e.strerror}"
    return None


def become(uid, gid, *, clear_groups):
    try:
        if clear_groups:
            os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as e:
        return f"setresuid({uid}): {e.strerror}"
    return None


def count_user_tasks(uid):
    """Tasks (threads) the user runs now: what RLIMIT_NPROC counts outside a user namespace.
    Zombies are left out: a killed sandbox's tasks may still await reaping when the next one
    starts, and counting them would loosen the limit once they are reaped."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        dying = fields.get("State", "").split()[:1] in (["Z"], ["X"])
        if int(fields.get("Uid", "-1").split()[0]) == uid and not dying:
            total += int(fields.get("Threads", "1"))
    return total


def set_rlimits(timeout_s, memory_bytes, max_output_bytes, nproc):
    """`nproc`: processes and threads the user may have (None: leave as is)."""
    cpu = int(timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_output_bytes, max_output_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def landlock_abi():
    """The kernel's Landlock ABI version, 0 without Landlock."""
    c = ctypes.c_long
    return max(0, LIBC.syscall(c(SYS_CREATE_RULESET), None, c(0), c(1)))  # ..._VERSION flag


def read_allowlist():
    """Paths the program may read: the interpreter's library directories (sysconfig) and the
    directory of every file mapped into this process (libpython, libc, extension modules)."""
    paths = {p for k, p in sysconfig.get_paths().items() if k in
             ("stdlib", "platstdlib", "purelib", "platlib")}
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/"):
                paths.add(os.path.dirname(fields[5].strip()))
    return sorted(p for p in paths | set(READ_FILES) if os.path.exists(p))


def open_rules(read_paths, write_dir):
    """(program's rules, harness's rules) for `landlock`, as [(O_PATH fd, rights)], opened now
    while every path is reachable: reads below `read_paths`, /dev/null; the harness may also
    read and write files in `write_dir`."""
    rules = [(os.open(p, os.O_PATH | os.O_CLOEXEC), READ if os.path.isdir(p) else FS_READ_FILE)
             for p in read_paths]
    rules.append((os.open("/dev/null", os.O_PATH | os.O_CLOEXEC),
                  FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV))
    own = (os.open(write_dir, os.O_PATH | os.O_CLOEXEC), READ | WRITE_IN_DIR)
    return rules, rules + [own]


def landlock(rules):
    """Applies a Landlock domain to the calling process: only `rules` [(O_PATH fd, rights)] grant
    file access (rights the kernel does not know are dropped); no TCP bind or connect; signals
    and abstract Unix sockets scoped to the domain. Returns (ABI applied, None) or (0, reason)."""
    c = ctypes.c_long
    abi = landlock_abi()
    if abi < 1:
        return 0, "the kernel offers no Landlock"
    fs = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) | (
        FS_IOCTL_DEV if abi >= 5 else 0)
    net = 0b11 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP: no rule allows any port
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL
    attr = struct.pack("=QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = LIBC.syscall(c(SYS_CREATE_RULESET), ctypes.c_char_p(attr), c(len(attr)), c(0))
    if ruleset < 0:
        return 0, _errno_reason("landlock_create_ruleset")
    try:
        for fd, rights in rules:
            rule = struct.pack("=Qi", rights & fs, fd)  # landlock_path_beneath_attr (packed)
            if LIBC.syscall(c(SYS_ADD_RULE), c(ruleset), c(1), ctypes.c_char_p(rule), c(0)):
                return 0, _errno_reason("landlock_add_rule")
        _prctl(PR_SET_NO_NEW_PRIVS, 1)  # required by restrict_self without CAP_SYS_ADMIN
        if LIBC.syscall(c(SYS_RESTRICT_SELF), c(ruleset), c(0)):
            return 0, _errno_reason("landlock_restrict_self")
        return abi, None
    finally:
        os.close(ruleset)


def seccomp_program(machine):
    """The BPF program (bytes) for `machine`: kill foreign ABIs (i386, x32, arm32), EPERM for the
    denied syscalls and for clone with a CLONE_NEW* flag, ENOSYS for clone3 (its flags are in
    memory, out of BPF's reach; libc then falls back to clone), allow the rest."""
    arch, denied, clone, clone3 = SECCOMP_ABI[machine]
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    n_body = 5 + len(denied) + 5  # instructions before the two shared returns
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, RET_KILL_PROCESS), (ld_abs, 0, 0, 0)]
    prog.append((jge, n_body + 1 - len(prog) - 1, 0, 0x40000000))  # x32 numbers: deny
    for nr in denied:
        prog.append((jeq, n_body + 1 - len(prog) - 1, 0, nr))
    prog += [(jeq, 0, 1, clone3), (ret, 0, 0, RET_ERRNO | 38)]  # ENOSYS
    prog += [(jeq, 0, 2, clone), (ld_abs, 0, 0, 16)]  # args[0], low 32 bits (little endian)
    prog.append((jset, n_body + 1 - len(prog) - 1, 0, CLONE_NEW_ANY))
    prog += [(ret, 0, 0, RET_ALLOW), (ret, 0, 0, RET_ERRNO | 1)]  # n_body: allow; +1: EPERM
    assert len(prog) == n_body + 2
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def seccomp():
    """Installs `seccomp_program` for this machine on the calling process."""
    machine = os.uname().machine
    if machine not in SECCOMP_ABI:
        return f"no seccomp syscall table for {machine}"
    code = seccomp_program(machine)
    buf = ctypes.create_string_buffer(code, len(code))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(code) // 8, ctypes.addressof(buf))
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if LIBC.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(2), ctypes.byref(prog),
                  ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:  # SECCOMP_MODE_FILTER
        return _errno_reason("prctl(PR_SET_SECCOMP)")
    return None
