/* The sandbox's supervisor: pid 1, records every attempt outside the workspace (pivotrl.sandbox.watch). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "unsupported architecture"
#endif
/* system calls newer than some C libraries' headers (the same number on every architecture) */
#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif
#define SYS_setxattrat_ 463
#define SYS_getxattrat_ 464
#define SYS_listxattrat_ 465
#define SYS_removexattrat_ 466
#define SYS_file_getattr_ 468
#define SYS_file_setattr_ 469
#ifdef SYS_utime
#define SYS_utime_ SYS_utime
#else
#define SYS_utime_ -1
#endif
#define PROC_MAGIC 0x9fa0

#define MAX_RECORDS 256
#define MAX_LINKS 40
#define WRITE_FLAGS (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)
#define LD_NR BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define LD_ARG(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define ALLOW_IF(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), RET(SECCOMP_RET_ALLOW)
#define RET_IF(v, r) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (v), 0, 1), RET(r)

static int out_fd = -1, records = 0;

/* Where a write is compared anyway (the workspace, HOME) or thrown away (scratch, the null
   device): not reported, so they never crowd out the rest; pivotrl.sandbox.watch classifies
   the rest. Writes here are done by the supervisor itself (`emulate`). */
static int scratch(const char *p) {
    static const char *tops[] = {"/work", "/tmp", "/dev/shm", "/home/user", NULL};
    for (int i = 0; tops[i]; i++) {
        size_t n = strlen(tops[i]);
        if (!strncmp(p, tops[i], n) && (p[n] == 0 || p[n] == '/')) return 1;
    }
    return !strcmp(p, "/dev/null") || !strcmp(p, "/dev/tty");
}

static void emit(const char *op, const char *path) {
    char line[PATH_MAX * 4 + 64];
    size_t n = 0;
    if (scratch(path) || records++ >= MAX_RECORDS) return;
    n += snprintf(line, sizeof line, "%s\t", op);
    for (const unsigned char *p = (const unsigned char *)path; *p && n < sizeof line - 8; p++) {
        if (*p < 0x20 || *p == '\\' || *p >= 0x7f) n += snprintf(line + n, 5, "\\x%02x", *p);
        else line[n++] = *p;
    }
    line[n++] = '\n';
    ssize_t w = write(out_fd, line, n);
    (void)w;
}

static int read_mem(pid_t pid, unsigned long addr, void *buf, size_t len) {
    struct iovec local = {buf, len}, remote = {(void *)addr, len};
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)len ? 0 : -1;
}

/* A NUL-terminated string of the caller's; -1 when unreadable or longer than `len` (the
   kernel would refuse it too). Page by page: a string near the end of a mapping must not fail
   the whole read. */
static int read_str(pid_t pid, unsigned long addr, char *buf, size_t len) {
    size_t got = 0;
    if (!addr) return -1;
    while (got < len) {
        size_t chunk = 4096 - ((addr + got) % 4096);
        if (chunk > len - got) chunk = len - got;
        struct iovec local = {buf + got, chunk}, remote = {(void *)(addr + got), chunk};
        ssize_t r = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (r <= 0) return -1;
        if (memchr(buf + got, 0, r)) return 0;
        got += r;
    }
    return -1;
}

static void fd_path(int fd, char *out) {
    char link[40];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_MAX - 1);
    out[n > 0 ? n : 0] = 0;
}

#include "watch_paths.c"  /* walk, emulate: resolution in the caller's context */

static void sockaddr_record(pid_t tid, const char *op, unsigned long addr, unsigned long len) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    if (!addr) return;
    if (len > sizeof sa) len = sizeof sa;
    if (len < sizeof sa.sun_family || read_mem(tid, addr, &sa, len) < 0) { emit(op, "<unreadable> address"); return; }
    if (sa.sun_family != AF_UNIX) {
        char what[32];
        snprintf(what, sizeof what, "<network> family %d", sa.sun_family);
        emit(op, what);
        return;
    }
    char path[sizeof sa.sun_path + 2] = "@";
    if (len <= offsetof(struct sockaddr_un, sun_path)) { emit(op, "unix:unnamed"); return; }
    if (sa.sun_path[0] == 0) {  /* abstract name */
        memcpy(path + 1, sa.sun_path + 1, sizeof sa.sun_path - 1);
        path[sizeof path - 1] = 0;
        emit(op, path);
        return;
    }
    memcpy(path, sa.sun_path, sizeof sa.sun_path);
    path[sizeof sa.sun_path] = 0;
    struct where w;
    walk(tid, AT_FDCWD, path, 1, 0, &w);
    where_path(&w);
    emit(op, w.path);
    where_close(&w);
}

static void msg_record(pid_t tid, unsigned long addr, unsigned long count, size_t stride) {
    if (count > 1024) { emit("sendto", "<unreadable> too many messages"); return; }
    for (unsigned long i = 0; i < count; i++) {
        struct msghdr mh;
        if (read_mem(tid, addr + i * stride, &mh, sizeof mh) < 0) { emit("sendto", "<unreadable> message"); return; }
        sockaddr_record(tid, "sendto", (unsigned long)mh.msg_name, mh.msg_namelen);
    }
}

static void fd_record(pid_t tid, const char *op, unsigned long fd, const char *what) {
    char link[64], got[PATH_MAX], out[PATH_MAX + 64];
    snprintf(link, sizeof link, "/proc/%d/fd/%d", tid, (int)fd);
    ssize_t n = readlink(link, got, sizeof got - 1);
    if (n < 0) snprintf(got, sizeof got, "<unresolved> fd %d", (int)fd);
    else got[n] = 0;
    snprintf(out, sizeof out, "%s%s", what, got);
    emit(op, out);
}

/* One call on a path (CALLS): record it where it lands outside, and do it here where it lands
   inside (`emulate`); returns 1 when it answered the call itself. */
static int path_call(int listener, struct seccomp_notif *req, const struct call *c) {
    pid_t tid = req->pid;
    const unsigned long *a = (const unsigned long *)req->data.args;
    long nr = c->nr;
    char path[PATH_MAX], path2[PATH_MAX], text[PATH_MAX];
    unsigned long oflags = 0;
    mode_t mode = c->emul == E_OPEN ? 0 : (mode_t)a[c->path + 1];
    int follow = c->follow, empty_ok = 0, own = c->emul != E_NONE, at = c->flags >= 0 ? (int)a[c->flags] : 0;
    if (c->emul == E_OPEN) {
        if (nr == SYS_openat2) {
            struct { unsigned long long flags, mode, resolve; } how;
            if (a[3] < sizeof how || read_mem(tid, a[2], &how, sizeof how) < 0) { emit(c->op, "<unreadable> open_how"); return 0; }
            oflags = how.flags; mode = how.mode;
            if (how.resolve) {  /* a lookup of its own rules: not one the supervisor redoes */
                if (how.flags & WRITE_FLAGS) emit("other", "openat2 with RESOLVE_* flags");
                return 0;
            }
        }
#ifdef SYS_creat
        else if (nr == SYS_creat) { oflags = O_CREAT | O_WRONLY | O_TRUNC; mode = a[1]; }
#endif
        else { oflags = a[c->path + 1]; mode = a[c->path + 2]; }
        if (!(oflags & WRITE_FLAGS)) return 0;
        follow = !(oflags & O_NOFOLLOW) && !((oflags & O_CREAT) && (oflags & O_EXCL));
    }
    if (c->flags >= 0) {
        follow = nr == SYS_linkat ? !!(at & AT_SYMLINK_FOLLOW) : !(at & AT_SYMLINK_NOFOLLOW);
        empty_ok = !!(at & AT_EMPTY_PATH);
    }
    int on_fd = c->dirfd == -2 || (nr == SYS_utimensat && !a[1]);
    if (c->emul == E_SYMLINK && read_str(tid, a[0], text, sizeof text) < 0) { emit(c->op, "<unreadable> path"); return 0; }
    if ((!on_fd && read_str(tid, a[c->path], path, sizeof path) < 0)
        || (c->path2 >= 0 && read_str(tid, a[c->path2], path2, sizeof path2) < 0)) {
        emit(c->op, "<unreadable> path");
        return 0;
    }
    struct where w, w2 = {.dir = -1, .obj = -1};
    if (on_fd) held(tid, (long)(int)a[0], &w);
    else walk(tid, c->dirfd >= 0 ? (long)(int)a[c->dirfd] : AT_FDCWD, path, follow, empty_ok, &w);
    where_path(&w);
    emit(c->op, w.path);
    int ok = w.err ? w.inside : emulable(&w, c->emul);
    if (c->path2 >= 0) {
        walk(tid, c->dirfd2 >= 0 ? (long)(int)a[c->dirfd2] : AT_FDCWD, path2, 0, 0, &w2);
        where_path(&w2);
        emit(c->op, w2.path);
        ok = ok && (w2.err ? w2.inside : emulable(&w2, c->emul));
    }
    int answered = 0;
    if (own && ok && ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &req->id) == 0) {
        int newfd = -1;
        if (c->emul == E_OPEN && !w.err && fifo(&w)) {  /* may wait for a reader: a helper's */
            pid_t helper = fork();
            if (helper > 0) { where_close(&w); return 1; }
            may_block = helper == 0;
        }
        long r = w.err ? -w.err : w2.err ? -w2.err
                 : emulate(c->emul, tid, a, c, &w, &w2, oflags, mode, text, &newfd);
        struct seccomp_notif_resp resp = {.id = req->id, .val = r < 0 ? 0 : r, .error = r < 0 ? (int)r : 0};
        if (newfd >= 0) {
            struct seccomp_notif_addfd add = {.id = req->id, .flags = SECCOMP_ADDFD_FLAG_SEND,
                                              .srcfd = newfd, .newfd_flags = oflags & O_CLOEXEC};
            if (ioctl(listener, SECCOMP_IOCTL_NOTIF_ADDFD, &add) < 0) {
                resp.val = 0; resp.error = -errno;
                ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
            }
            close(newfd);
        } else {
            ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
        }
        answered = 1;
        if (may_block) _exit(0);  /* the helper: its one call answered */
    }
    where_close(&w);
    where_close(&w2);
    return answered;
}

static void handle(int listener) {
    struct seccomp_notif req;
    memset(&req, 0, sizeof req);
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &req) < 0) return;
    pid_t tid = req.pid;
    unsigned long *a = (unsigned long *)req.data.args;
    long nr = req.data.nr;
    char out[64];
    for (size_t i = 0; i < sizeof CALLS / sizeof CALLS[0]; i++)
        if (CALLS[i].nr == nr) {
            if (path_call(listener, &req, &CALLS[i])) return;
            goto done;
        }
    switch (nr) {
    case SYS_ioctl:
        snprintf(out, sizeof out, "ioctl 0x%x on ", (unsigned)a[1]);
        fd_record(tid, "other", a[0], out);
        break;
    case SYS_mount: case SYS_umount2: case SYS_swapon: case SYS_swapoff: case SYS_reboot:
    case SYS_sethostname: case SYS_setdomainname: case SYS_init_module:
    case SYS_finit_module: case SYS_delete_module: case SYS_kexec_load:
        snprintf(out, sizeof out, "syscall %ld", nr); emit("system", out); break;
    case SYS_socket:
        snprintf(out, sizeof out, "<network> family %lu", a[0]); emit("socket", out); break;
    case SYS_connect: sockaddr_record(tid, "connect", a[1], a[2]); break;
    case SYS_bind: sockaddr_record(tid, "bind", a[1], a[2]); break;
    case SYS_sendto: sockaddr_record(tid, "sendto", a[4], a[5]); break;
    case SYS_sendmsg: msg_record(tid, a[1], 1, sizeof(struct msghdr)); break;
    case SYS_sendmmsg: msg_record(tid, a[1], a[2], sizeof(struct mmsghdr)); break;
    default:  /* a call not known to be harmless: an attempt, whatever it does */
        snprintf(out, sizeof out, "syscall %ld", nr); emit("other", out); break;
    }
done:;
    struct seccomp_notif_resp resp = {.id = req.id, .flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE};
    ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
}

/* The filter: every call not known to change nothing outside the process asks the supervisor
   (an allow-list: a call missing here is recorded as an attempt, never let through unseen). */
static int install(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        RET(SECCOMP_RET_ERRNO | ENOSYS),
        LD_NR,
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1),  /* x32 */
        RET(SECCOMP_RET_ERRNO | ENOSYS),
        /* io_uring bypasses seccomp */
        RET_IF(SYS_io_uring_setup, SECCOMP_RET_ERRNO | ENOSYS),
        RET_IF(SYS_io_uring_enter, SECCOMP_RET_ERRNO | ENOSYS),
        RET_IF(SYS_io_uring_register, SECCOMP_RET_ERRNO | ENOSYS),
        /* openat: asks only when it may write */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 0, 4),
        LD_ARG(2),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, WRITE_FLAGS, 0, 1),
        RET(SECCOMP_RET_USER_NOTIF),
        RET(SECCOMP_RET_ALLOW),
#ifdef SYS_open
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_open, 0, 4),
        LD_ARG(1),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, WRITE_FLAGS, 0, 1),
        RET(SECCOMP_RET_USER_NOTIF),
        RET(SECCOMP_RET_ALLOW),
#endif
        /* socket: every family but AF_UNIX is the network */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 4),
        LD_ARG(0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 1, 0),
        RET(SECCOMP_RET_USER_NOTIF),
        RET(SECCOMP_RET_ALLOW),
        /* sendto: asks only with a destination address */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sendto, 0, 6),
        LD_ARG(4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 1),
        RET(SECCOMP_RET_ALLOW),
        RET(SECCOMP_RET_USER_NOTIF),
        /* setsockopt: no socket timestamps (they are the host's real time) */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_setsockopt, 0, 10),
        LD_ARG(1),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SOL_SOCKET, 0, 6),
        LD_ARG(2),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 29, 5, 0),  /* SO_TIMESTAMP_OLD */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 35, 4, 0),  /* SO_TIMESTAMPNS_OLD */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 37, 3, 0),  /* SO_TIMESTAMPING_OLD */
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 63, 0, 1),  /* SO_TIMESTAMP{,NS,ING}_NEW: 63..65 */
        BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 65, 0, 1),
        RET(SECCOMP_RET_ALLOW),
        RET(SECCOMP_RET_ERRNO | ENOPROTOOPT),
        /* the wall clock read by a system call, not the vDSO the clock shim covers: refused */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clock_gettime, 0, 7),
        LD_ARG(0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_REALTIME, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_REALTIME_COARSE, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_REALTIME_ALARM, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_TAI, 1, 0),
        RET(SECCOMP_RET_ALLOW),
        RET(SECCOMP_RET_ERRNO | EPERM),
        RET_IF(SYS_gettimeofday, SECCOMP_RET_ERRNO | EPERM),
#ifdef SYS_time
        RET_IF(SYS_time, SECCOMP_RET_ERRNO | EPERM),
#endif
        /* ioctl: only requests that read, or act on the process's own descriptors */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 2 * 19 + 2),  /* 19 requests */
        LD_ARG(1),
        ALLOW_IF(TCGETS), ALLOW_IF(TIOCGWINSZ), ALLOW_IF(TIOCGPGRP), ALLOW_IF(TIOCGSID),
        ALLOW_IF(FIONREAD), ALLOW_IF(TIOCOUTQ), ALLOW_IF(FIONBIO), ALLOW_IF(FIOASYNC),
        ALLOW_IF(FIOCLEX), ALLOW_IF(FIONCLEX), ALLOW_IF(FIOQSIZE), ALLOW_IF(0x802c542a) /* TCGETS2 */,
        ALLOW_IF(0x40049409) /* FICLONE (into a descriptor open for writing) */,
        ALLOW_IF(0x4020940d) /* FICLONERANGE */, ALLOW_IF(0xc0189436) /* FIDEDUPERANGE */,
        ALLOW_IF(0x80086601) /* FS_IOC_GETFLAGS */, ALLOW_IF(0x801c581f) /* FS_IOC_FSGETXATTR */,
        ALLOW_IF(0xc020660b) /* FS_IOC_FIEMAP */, ALLOW_IF(2) /* FIGETBSZ */,
        RET(SECCOMP_RET_USER_NOTIF),
        LD_NR,
#ifdef SYS_open
        ALLOW_IF(SYS_stat), ALLOW_IF(SYS_lstat), ALLOW_IF(SYS_access), ALLOW_IF(SYS_pipe),
        ALLOW_IF(SYS_select), ALLOW_IF(SYS_poll), ALLOW_IF(SYS_dup2), ALLOW_IF(SYS_pause),
        ALLOW_IF(SYS_alarm), ALLOW_IF(SYS_fork), ALLOW_IF(SYS_vfork), ALLOW_IF(SYS_getdents),
        ALLOW_IF(SYS_readlink), ALLOW_IF(SYS_getpgrp), ALLOW_IF(SYS_epoll_create),
        ALLOW_IF(SYS_epoll_wait), ALLOW_IF(SYS_inotify_init), ALLOW_IF(SYS_signalfd),
        ALLOW_IF(SYS_eventfd), ALLOW_IF(SYS_arch_prctl),
#endif
        ALLOW_IF(SYS_read), ALLOW_IF(SYS_write), ALLOW_IF(SYS_readv), ALLOW_IF(SYS_writev),
        ALLOW_IF(SYS_pread64), ALLOW_IF(SYS_pwrite64), ALLOW_IF(SYS_preadv), ALLOW_IF(SYS_pwritev),
        ALLOW_IF(SYS_preadv2), ALLOW_IF(SYS_pwritev2), ALLOW_IF(SYS_close), ALLOW_IF(SYS_close_range),
        ALLOW_IF(SYS_fstat), ALLOW_IF(SYS_newfstatat), ALLOW_IF(SYS_statx), ALLOW_IF(SYS_statfs),
        ALLOW_IF(SYS_fstatfs), ALLOW_IF(SYS_lseek), ALLOW_IF(SYS_mmap), ALLOW_IF(SYS_mprotect),
        ALLOW_IF(SYS_munmap), ALLOW_IF(SYS_mremap), ALLOW_IF(SYS_madvise), ALLOW_IF(SYS_msync),
        ALLOW_IF(SYS_mincore), ALLOW_IF(SYS_mlock), ALLOW_IF(SYS_mlock2), ALLOW_IF(SYS_munlock),
        ALLOW_IF(SYS_mlockall), ALLOW_IF(SYS_munlockall), ALLOW_IF(SYS_brk),
        ALLOW_IF(SYS_rt_sigaction), ALLOW_IF(SYS_rt_sigprocmask), ALLOW_IF(SYS_rt_sigreturn),
        ALLOW_IF(SYS_rt_sigpending), ALLOW_IF(SYS_rt_sigtimedwait), ALLOW_IF(SYS_rt_sigsuspend),
        ALLOW_IF(SYS_rt_sigqueueinfo), ALLOW_IF(SYS_rt_tgsigqueueinfo), ALLOW_IF(SYS_sigaltstack),
        ALLOW_IF(SYS_kill), ALLOW_IF(SYS_tkill), ALLOW_IF(SYS_tgkill), ALLOW_IF(SYS_pidfd_open),
        ALLOW_IF(SYS_pidfd_send_signal), ALLOW_IF(SYS_pidfd_getfd), ALLOW_IF(SYS_faccessat),
        ALLOW_IF(SYS_faccessat2), ALLOW_IF(SYS_pipe2), ALLOW_IF(SYS_dup), ALLOW_IF(SYS_dup3),
        ALLOW_IF(SYS_fcntl), ALLOW_IF(SYS_flock), ALLOW_IF(SYS_fsync), ALLOW_IF(SYS_fdatasync),
        ALLOW_IF(SYS_sync), ALLOW_IF(SYS_syncfs), ALLOW_IF(SYS_sync_file_range),
        ALLOW_IF(SYS_ftruncate), ALLOW_IF(SYS_fallocate), ALLOW_IF(SYS_fadvise64),
        ALLOW_IF(SYS_readahead), ALLOW_IF(SYS_copy_file_range), ALLOW_IF(SYS_sendfile),
        ALLOW_IF(SYS_splice), ALLOW_IF(SYS_tee), ALLOW_IF(SYS_vmsplice), ALLOW_IF(SYS_getdents64),
        ALLOW_IF(SYS_readlinkat), ALLOW_IF(SYS_getcwd), ALLOW_IF(SYS_chdir), ALLOW_IF(SYS_fchdir),
        ALLOW_IF(SYS_umask), ALLOW_IF(SYS_getxattr), ALLOW_IF(SYS_lgetxattr),
        ALLOW_IF(SYS_fgetxattr), ALLOW_IF(SYS_listxattr), ALLOW_IF(SYS_llistxattr),
        ALLOW_IF(SYS_flistxattr), ALLOW_IF(SYS_getxattrat_), ALLOW_IF(SYS_listxattrat_),
        ALLOW_IF(SYS_file_getattr_), ALLOW_IF(SYS_name_to_handle_at),
        ALLOW_IF(SYS_ppoll), ALLOW_IF(SYS_pselect6), ALLOW_IF(SYS_epoll_create1),
        ALLOW_IF(SYS_epoll_ctl), ALLOW_IF(SYS_epoll_pwait), ALLOW_IF(SYS_epoll_pwait2),
        ALLOW_IF(SYS_eventfd2), ALLOW_IF(SYS_signalfd4), ALLOW_IF(SYS_timerfd_create),
        ALLOW_IF(SYS_timerfd_settime), ALLOW_IF(SYS_timerfd_gettime), ALLOW_IF(SYS_inotify_init1),
        ALLOW_IF(SYS_inotify_add_watch), ALLOW_IF(SYS_inotify_rm_watch), ALLOW_IF(SYS_memfd_create),
        ALLOW_IF(SYS_memfd_secret), ALLOW_IF(SYS_socketpair), ALLOW_IF(SYS_getsockname),
        ALLOW_IF(SYS_getpeername), ALLOW_IF(SYS_getsockopt), ALLOW_IF(SYS_shutdown),
        ALLOW_IF(SYS_listen), ALLOW_IF(SYS_accept), ALLOW_IF(SYS_accept4), ALLOW_IF(SYS_recvfrom),
        ALLOW_IF(SYS_recvmsg), ALLOW_IF(SYS_recvmmsg), ALLOW_IF(SYS_nanosleep),
        ALLOW_IF(SYS_clock_nanosleep), ALLOW_IF(SYS_clock_getres), ALLOW_IF(SYS_getitimer), ALLOW_IF(SYS_setitimer),
        ALLOW_IF(SYS_timer_create), ALLOW_IF(SYS_timer_settime), ALLOW_IF(SYS_timer_gettime),
        ALLOW_IF(SYS_timer_getoverrun), ALLOW_IF(SYS_timer_delete), ALLOW_IF(SYS_getpid),
        ALLOW_IF(SYS_getppid), ALLOW_IF(SYS_gettid), ALLOW_IF(SYS_getuid), ALLOW_IF(SYS_geteuid),
        ALLOW_IF(SYS_getgid), ALLOW_IF(SYS_getegid), ALLOW_IF(SYS_getgroups),
        ALLOW_IF(SYS_getresuid), ALLOW_IF(SYS_getresgid), ALLOW_IF(SYS_getpgid),
        ALLOW_IF(SYS_getsid), ALLOW_IF(SYS_setpgid), ALLOW_IF(SYS_setsid), ALLOW_IF(SYS_getrlimit),
        ALLOW_IF(SYS_setrlimit), ALLOW_IF(SYS_prlimit64), ALLOW_IF(SYS_getrusage),
        ALLOW_IF(SYS_times), ALLOW_IF(SYS_sysinfo), ALLOW_IF(SYS_uname), ALLOW_IF(SYS_getcpu),
        ALLOW_IF(SYS_getpriority), ALLOW_IF(SYS_setpriority), ALLOW_IF(SYS_sched_yield),
        ALLOW_IF(SYS_sched_getaffinity), ALLOW_IF(SYS_sched_setaffinity),
        ALLOW_IF(SYS_sched_getparam), ALLOW_IF(SYS_sched_getscheduler),
        ALLOW_IF(SYS_sched_get_priority_max), ALLOW_IF(SYS_sched_get_priority_min),
        ALLOW_IF(SYS_sched_rr_get_interval), ALLOW_IF(SYS_sched_getattr),
        ALLOW_IF(SYS_ioprio_get), ALLOW_IF(SYS_wait4), ALLOW_IF(SYS_waitid), ALLOW_IF(SYS_exit),
        ALLOW_IF(SYS_exit_group), ALLOW_IF(SYS_execve), ALLOW_IF(SYS_execveat), ALLOW_IF(SYS_clone),
        ALLOW_IF(SYS_clone3), ALLOW_IF(SYS_set_tid_address), ALLOW_IF(SYS_set_robust_list),
        ALLOW_IF(SYS_get_robust_list), ALLOW_IF(SYS_futex), ALLOW_IF(SYS_futex_waitv),
        ALLOW_IF(SYS_rseq), ALLOW_IF(SYS_restart_syscall), ALLOW_IF(SYS_getrandom),
        ALLOW_IF(SYS_prctl), ALLOW_IF(SYS_capget), ALLOW_IF(SYS_personality),
        ALLOW_IF(SYS_membarrier), ALLOW_IF(SYS_get_mempolicy), ALLOW_IF(SYS_set_mempolicy),
        ALLOW_IF(SYS_mbind), ALLOW_IF(SYS_kcmp), ALLOW_IF(SYS_process_vm_readv),
        ALLOW_IF(SYS_pkey_alloc), ALLOW_IF(SYS_pkey_free), ALLOW_IF(SYS_pkey_mprotect),
        ALLOW_IF(SYS_landlock_create_ruleset), ALLOW_IF(SYS_landlock_add_rule),
        ALLOW_IF(SYS_landlock_restrict_self),
        RET(SECCOMP_RET_USER_NOTIF),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -1;
    return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
}

/* watch COMMAND...: run COMMAND with every attempt to change something reported as a line
   "op<TAB>path" on the descriptor named by $PIVOTRL_WATCH_FD (not an argument: `ps` shows
   pid 1's arguments, and the number differs between runs), then "done<TAB>STATUS". As pid 1 of
   the sandbox it also reaps orphans, and signals from inside the sandbox cannot end it. */
int main(int argc, char **argv) {
    const char *fd_env = getenv("PIVOTRL_WATCH_FD");
    if (argc < 2 || !fd_env) { fprintf(stderr, "usage: PIVOTRL_WATCH_FD=N watch COMMAND...\n"); return 125; }
    out_fd = atoi(fd_env);
    unsetenv("PIVOTRL_WATCH_FD");
    fcntl(out_fd, F_SETFD, FD_CLOEXEC);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  /* /proc/1/{fd,mem} unreadable to the command */
    /* every page resident: its RSS, which `ps` shows, is the same in every run */
    mlockall(MCL_CURRENT | MCL_FUTURE);
    int up[2], down[2];  /* the child says its listener's number, the parent says it took it */
    if (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0) return 125;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    pid_t child = fork();
    if (child < 0) return 125;
    if (child == 0) {
        char ack;
        sigprocmask(SIG_UNBLOCK, &chld, NULL);
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        personality(ADDR_NO_RANDOMIZE);  /* the same memory layout (and `ps` sizes) every run */
        /* read and write are never notified: the listener cannot be sent with sendmsg */
        int listener = install();
        if (write(up[1], &listener, sizeof listener) != sizeof listener
            || read(down[0], &ack, 1) != 1 || listener < 0) _exit(125);
        close(listener);
        execvp(argv[1], argv + 1);
        _exit(127);
    }
    int number = -1, listener = -1;
    if (read(up[0], &number, sizeof number) == sizeof number && number >= 0) {
        int pidfd = syscall(SYS_pidfd_open, child, 0);
        listener = pidfd < 0 ? -1 : syscall(SYS_pidfd_getfd, pidfd, number, 0);
        if (pidfd >= 0) close(pidfd);
    }
    if (write(down[1], "k", 1) != 1) listener = -1;
    if (listener < 0) dprintf(out_fd, "failed\tlistener\n");
    int status = 0, code = 125;
    for (;;) {
        pid_t w;
        while ((w = waitpid(-1, &status, WNOHANG)) > 0) {
            if (w == child) {
                code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                goto finish;
            }
        }
        if (w < 0 && errno == ECHILD) goto finish;
        struct pollfd p[2] = {{sfd, POLLIN, 0}, {listener, POLLIN, 0}};
        if (poll(p, listener >= 0 ? 2 : 1, -1) < 0 && errno != EINTR) goto finish;
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {}
        }
        if (listener >= 0 && (p[1].revents & POLLIN)) handle(listener);
    }
finish:
    if (listener >= 0) {
        struct pollfd p = {listener, POLLIN, 0};
        while (poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) handle(listener);
    }
    if (records > MAX_RECORDS) dprintf(out_fd, "more\t%d\n", records - MAX_RECORDS);
    dprintf(out_fd, "done\t%d\n", code);
    return code;
}
