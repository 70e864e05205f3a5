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
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "unsupported architecture"
#endif

#define MAX_RECORDS 256
#define WRITE_FLAGS (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)
#define LD_NR BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define LD_ARG(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define NOTIFY_IF(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), RET(SECCOMP_RET_USER_NOTIF)

/* kinds of path arguments: which argument holds it and whether a final symlink is followed */
enum { NONE, PATH0, AT1, PATH1_AT0, OPEN_AT, OPEN0, SOCKADDR, MSGHDR, FD0 };

static int out_fd = -1, records = 0;

static int scratch(const char *p);

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
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) > 0 ? 0 : -1;
}

static int read_str(pid_t pid, unsigned long addr, char *buf, size_t len) {
    /* page by page: a string near the end of a mapping must not fail the whole read */
    size_t got = 0;
    if (!addr) return -1;
    while (got < len - 1) {
        size_t chunk = 4096 - ((addr + got) % 4096);
        if (chunk > len - 1 - got) chunk = len - 1 - got;
        struct iovec local = {buf + got, chunk}, remote = {(void *)(addr + got), chunk};
        ssize_t r = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (r <= 0) break;
        if (memchr(buf + got, 0, r)) { got += r; buf[len - 1] = 0; return 0; }
        got += r;
    }
    buf[got < len ? got : len - 1] = 0;
    return got ? 0 : -1;
}

/* The absolute path `path` names for process `pid` relative to `dirfd`, as the kernel resolves
   it (one O_PATH open from the caller's cwd or dirfd, then its name; the final symlink
   followed when `follow`); a lexical join where the directory does not exist. */
static void resolve(pid_t pid, long dirfd, const char *path, int follow, char *out) {
    char link[64], dir[PATH_MAX], got[PATH_MAX];
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    int base = AT_FDCWD, fd = -1;
    out[0] = 0;
    if (path[0] != '/') {
        if (dirfd == AT_FDCWD) snprintf(link, sizeof link, "/proc/%d/cwd", pid);
        else snprintf(link, sizeof link, "/proc/%d/fd/%ld", pid, dirfd);
        base = open(link, O_PATH | O_CLOEXEC);
    }
    if (follow && (fd = openat(base, path, O_PATH | O_CLOEXEC)) >= 0) name = "";
    if (fd < 0) {
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 0, path);
        fd = openat(base, slash ? (dir[0] ? dir : "/") : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = fd >= 0 ? readlink(link, got, sizeof got - 1) : -1;
    if (n > 0) {
        got[n] = 0;
        snprintf(out, PATH_MAX, "%.*s%s%.*s", PATH_MAX / 2, strcmp(got, "/") ? got : "",
                 name[0] ? "/" : "", PATH_MAX / 2 - 2, name);
    } else {  /* no such directory: the path as written, from the caller's cwd or dirfd */
        snprintf(link, sizeof link, "/proc/self/fd/%d", base);
        n = path[0] != '/' && base >= 0 ? readlink(link, got, sizeof got - 1) : -1;
        got[n > 0 ? n : 0] = 0;
        snprintf(out, PATH_MAX, "%.*s%s%.*s", PATH_MAX / 2, got, n > 0 ? "/" : "",
                 PATH_MAX / 2 - 2, path);
    }
    if (fd >= 0) close(fd);
    if (base >= 0) close(base);
}

/* Writes the host compares anyway (the workspace) or throws away (scratch, the null device):
   not reported, so they never crowd out the rest. pivotrl.sandbox.watch classifies the rest. */
static int scratch(const char *p) {
    static const char *tops[] = {"/work", "/tmp", "/dev/shm", NULL};
    for (int i = 0; tops[i]; i++) {
        size_t n = strlen(tops[i]);
        if (!strncmp(p, tops[i], n) && (p[n] == 0 || p[n] == '/')) return 1;
    }
    return !strcmp(p, "/dev/null") || !strcmp(p, "/dev/tty");
}

static void sockaddr_record(pid_t pid, const char *op, unsigned long addr, unsigned long len) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    if (!addr) return;
    if (len > sizeof sa) len = sizeof sa;
    if (read_mem(pid, addr, &sa, len) < 0) { emit(op, "?"); return; }
    if (sa.sun_family == AF_UNIX) {
        char path[sizeof sa.sun_path + 2] = "@", out[PATH_MAX];
        if (len <= offsetof(struct sockaddr_un, sun_path)) { emit(op, "unix:unnamed"); return; }
        if (sa.sun_path[0] == 0) {  /* abstract name */
            memcpy(path + 1, sa.sun_path + 1, sizeof sa.sun_path - 1);
            path[sizeof path - 1] = 0;
            emit(op, path);
            return;
        }
        memcpy(path, sa.sun_path, sizeof sa.sun_path);
        path[sizeof sa.sun_path] = 0;
        resolve(pid, AT_FDCWD, path, 1, out);
        emit(op, out);
    } else {
        char what[32];
        snprintf(what, sizeof what, "<network> family %d", sa.sun_family);
        emit(op, what);
    }
}

static void handle(int listener) {
    struct seccomp_notif req;
    struct seccomp_notif_resp resp;
    memset(&req, 0, sizeof req);
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &req) < 0) return;
    pid_t pid = req.pid;
    unsigned long *a = (unsigned long *)req.data.args;
    char path[PATH_MAX], path2[PATH_MAX], out[PATH_MAX];
    const char *op = "?";
    int kind = NONE, follow = 1, arg = 0;
    long nr = req.data.nr;
    switch (nr) {
#ifdef SYS_open
    case SYS_open: op = "open-write"; kind = OPEN0; break;
    case SYS_creat: op = "open-write"; kind = PATH0; break;
    case SYS_unlink: op = "unlink"; kind = PATH0; follow = 0; break;
    case SYS_rmdir: op = "rmdir"; kind = PATH0; follow = 0; break;
    case SYS_rename: op = "rename"; kind = PATH0; follow = 0; break;
    case SYS_mkdir: op = "mkdir"; kind = PATH0; follow = 0; break;
    case SYS_link: op = "link"; kind = PATH0; follow = 0; break;
    case SYS_symlink: op = "symlink"; kind = PATH1_AT0; follow = 0; break;
    case SYS_chmod: op = "chmod"; kind = PATH0; break;
    case SYS_chown: op = "chown"; kind = PATH0; break;
    case SYS_lchown: op = "chown"; kind = PATH0; follow = 0; break;
    case SYS_mknod: op = "mknod"; kind = PATH0; follow = 0; break;
    case SYS_utime: case SYS_utimes: op = "utime"; kind = PATH0; break;
    case SYS_futimesat: op = "utime"; kind = AT1; break;
#endif
    case SYS_openat: op = "open-write"; kind = OPEN_AT; break;
    case SYS_openat2: op = "open"; kind = AT1; break;
    case SYS_truncate: op = "truncate"; kind = PATH0; break;
    case SYS_unlinkat: op = a[2] & 0x200 ? "rmdir" : "unlink"; kind = AT1; follow = 0; break;
    case SYS_renameat: case SYS_renameat2: op = "rename"; kind = AT1; follow = 0; break;
    case SYS_mkdirat: op = "mkdir"; kind = AT1; follow = 0; break;
    case SYS_linkat: op = "link"; kind = AT1; follow = 0; break;
    case SYS_symlinkat: op = "symlink"; kind = PATH1_AT0; follow = 0; break;
    case SYS_fchmodat: op = "chmod"; kind = AT1; break;
    case SYS_fchownat: op = "chown"; kind = AT1; break;
    case SYS_mknodat: op = "mknod"; kind = AT1; follow = 0; break;
    case SYS_utimensat: op = "utime"; kind = a[1] ? AT1 : FD0; break;
    case SYS_setxattr: case SYS_removexattr: op = "xattr"; kind = PATH0; break;
    case SYS_lsetxattr: case SYS_lremovexattr: op = "xattr"; kind = PATH0; follow = 0; break;
    case SYS_fchmod: op = "chmod"; kind = FD0; break;
    case SYS_fchown: op = "chown"; kind = FD0; break;
    case SYS_fsetxattr: case SYS_fremovexattr: op = "xattr"; kind = FD0; break;
    case SYS_mount: case SYS_umount2: case SYS_swapon: case SYS_swapoff: case SYS_reboot:
    case SYS_sethostname: case SYS_setdomainname: case SYS_init_module:
    case SYS_finit_module: case SYS_delete_module: case SYS_kexec_load:
        op = "system"; snprintf(out, sizeof out, "syscall %ld", nr); emit(op, out); goto done;
    case SYS_socket:
        snprintf(out, sizeof out, "<network> family %lu", a[0]); emit("socket", out); goto done;
    case SYS_connect: op = "connect"; kind = SOCKADDR; break;
    case SYS_bind: op = "bind"; kind = SOCKADDR; break;
    case SYS_sendto: op = "sendto"; kind = SOCKADDR; arg = 4; break;
    case SYS_sendmsg: op = "sendto"; kind = MSGHDR; break;
    default: snprintf(out, sizeof out, "syscall %ld", nr); emit("other", out); goto done;
    }
    if (kind == OPEN0 || kind == OPEN_AT) {
        unsigned long flags = kind == OPEN0 ? a[1] : a[2];
        follow = !(flags & O_NOFOLLOW) && !((flags & O_CREAT) && (flags & O_EXCL));
    }
    if (kind == SOCKADDR) {
        sockaddr_record(pid, op, a[arg ? arg : 1], a[arg ? arg + 1 : 2]);
    } else if (kind == MSGHDR) {
        struct msghdr mh;
        if (read_mem(pid, a[1], &mh, sizeof mh) == 0 && mh.msg_name)
            sockaddr_record(pid, op, (unsigned long)mh.msg_name, mh.msg_namelen);
    } else if (kind == FD0) {
        char link[64];
        snprintf(link, sizeof link, "/proc/%d/fd/%lu", pid, a[0]);
        ssize_t n = readlink(link, out, sizeof out - 1);
        out[n > 0 ? n : 0] = 0;
        emit(op, out);
    } else if (kind == PATH0 || kind == OPEN0) {
        if (read_str(pid, a[0], path, sizeof path) == 0) {
            resolve(pid, AT_FDCWD, path, follow, out); emit(op, out);
        }
        if ((nr == SYS_rename || nr == SYS_link) && read_str(pid, a[1], path2, sizeof path2) == 0) {
            resolve(pid, AT_FDCWD, path2, 0, out); emit(op, out);
        }
    } else if (kind == PATH1_AT0) {
        long dirfd = nr == SYS_symlinkat ? (long)(int)a[1] : AT_FDCWD;
        if (read_str(pid, nr == SYS_symlinkat ? a[2] : a[1], path, sizeof path) == 0) {
            resolve(pid, dirfd, path, 0, out); emit(op, out);
        }
    } else if (kind == AT1 || kind == OPEN_AT) {
        if (read_str(pid, a[1], path, sizeof path) == 0) {
            resolve(pid, (long)(int)a[0], path, follow, out); emit(op, out);
        }
        if ((nr == SYS_renameat || nr == SYS_renameat2 || nr == SYS_linkat)
            && read_str(pid, a[3], path2, sizeof path2) == 0) {
            resolve(pid, (long)(int)a[2], path2, 0, out); emit(op, out);
        }
    }
done:
    memset(&resp, 0, sizeof resp);
    resp.id = req.id;
    resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
}

static int install(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        RET(SECCOMP_RET_ERRNO | ENOSYS),
        LD_NR,
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1),  /* x32 */
        RET(SECCOMP_RET_ERRNO | ENOSYS),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup, 0, 1),  /* bypasses seccomp */
        RET(SECCOMP_RET_ERRNO | ENOSYS),
        /* openat: notify only when it may write */
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
        /* sendto: only with a destination address */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sendto, 0, 5),
        LD_ARG(4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0),
        RET(SECCOMP_RET_USER_NOTIF),
        LD_NR,
#ifdef SYS_open
        NOTIFY_IF(SYS_creat), NOTIFY_IF(SYS_unlink), NOTIFY_IF(SYS_rmdir), NOTIFY_IF(SYS_rename),
        NOTIFY_IF(SYS_mkdir), NOTIFY_IF(SYS_link), NOTIFY_IF(SYS_symlink), NOTIFY_IF(SYS_chmod),
        NOTIFY_IF(SYS_chown), NOTIFY_IF(SYS_lchown), NOTIFY_IF(SYS_mknod), NOTIFY_IF(SYS_utime),
        NOTIFY_IF(SYS_utimes), NOTIFY_IF(SYS_futimesat),
#endif
        NOTIFY_IF(SYS_openat2), NOTIFY_IF(SYS_truncate), NOTIFY_IF(SYS_unlinkat),
        NOTIFY_IF(SYS_renameat), NOTIFY_IF(SYS_renameat2), NOTIFY_IF(SYS_mkdirat),
        NOTIFY_IF(SYS_linkat), NOTIFY_IF(SYS_symlinkat), NOTIFY_IF(SYS_fchmodat),
        NOTIFY_IF(SYS_fchownat), NOTIFY_IF(SYS_mknodat), NOTIFY_IF(SYS_utimensat),
        NOTIFY_IF(SYS_setxattr), NOTIFY_IF(SYS_lsetxattr), NOTIFY_IF(SYS_removexattr),
        NOTIFY_IF(SYS_lremovexattr), NOTIFY_IF(SYS_fchmod), NOTIFY_IF(SYS_fchown),
        NOTIFY_IF(SYS_fsetxattr), NOTIFY_IF(SYS_fremovexattr), NOTIFY_IF(SYS_mount),
        NOTIFY_IF(SYS_umount2), NOTIFY_IF(SYS_swapon), NOTIFY_IF(SYS_swapoff),
        NOTIFY_IF(SYS_reboot), NOTIFY_IF(SYS_sethostname), NOTIFY_IF(SYS_setdomainname),
        NOTIFY_IF(SYS_init_module), NOTIFY_IF(SYS_finit_module), NOTIFY_IF(SYS_delete_module),
        NOTIFY_IF(SYS_kexec_load), NOTIFY_IF(SYS_connect), NOTIFY_IF(SYS_bind),
        NOTIFY_IF(SYS_sendmsg),
        RET(SECCOMP_RET_ALLOW),
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
