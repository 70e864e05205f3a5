/* Attacks on the sandbox's recorder: each tries to change something outside the workspace in
   a way the recorder could miss (tests/test_recorder_attacks.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int blocked(void) { return errno == EROFS || errno == EACCES || errno == EPERM; }

static char flip_buf[32] = "/tmp/d/p";
static void *flip_memory(void *arg) {  /* the path's directory, flipped between /tmp/d and /etc */
    (void)arg;
    for (;;) {
        memcpy(flip_buf, "/etc///", 7);
        memcpy(flip_buf, "/tmp/d/", 7);
    }
    return NULL;
}

static void *flip_fd(void *arg) {  /* descriptor 5: a workspace file, then /etc/passwd */
    (void)arg;
    int inside = open("a.txt", O_RDONLY), outside = open("/etc/passwd", O_RDONLY);
    for (;;) {
        dup2(inside, 5);
        dup2(outside, 5);
    }
    return NULL;
}

/* `tries` creations of p0, p1, ... through `path` while something flips where it leads; prints
   the names whose creation the kernel refused (it was asked to create them in /etc) */
static void race(int tries, const char *path) {
    printf("reached /etc:");
    for (int i = 0; i < tries; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s%d", path, i);
        if (path == flip_buf) snprintf(flip_buf + 7, sizeof flip_buf - 7, "p%d", i);
        int fd = open(path == flip_buf ? flip_buf : name, O_WRONLY | O_CREAT, 0644);
        if (fd >= 0) close(fd); else if (blocked()) printf(" p%d", i);
    }
    printf("\n");
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "", *path = argc > 2 ? argv[2] : "/etc/passwd";
    int fd;
    if (!strcmp(what, "dirfd")) {  /* a directory fd as the dirfd of an *at() call */
        fd = open("/etc", O_RDONLY | O_DIRECTORY);
        return openat(fd, "hosts", O_WRONLY) < 0 ? 0 : 1;
    }
    if (!strcmp(what, "secret") || !strcmp(what, "undumpable")) {  /* a path it cannot read */
        char *p;
        if (!strcmp(what, "secret")) {
            fd = syscall(447, 0);  /* memfd_secret */
            if (fd < 0 || ftruncate(fd, 4096) < 0) { puts("no memfd_secret"); return 0; }
            p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) { puts("no memfd_secret"); return 0; }
        } else {
            prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
            p = malloc(4096);
        }
        strcpy(p, path);
        open(p, O_WRONLY | O_TRUNC);
        return 0;
    }
    if (!strcmp(what, "fchmodat2")) return syscall(452, AT_FDCWD, path, 0777, 0) == 0;
    if (!strcmp(what, "setxattrat")) {
        struct { unsigned long long value; unsigned size, flags; } args = {(unsigned long)"v", 1, 0};
        return syscall(463, AT_FDCWD, path, 0, "user.x", &args, sizeof args) == 0;
    }
    if (!strcmp(what, "removexattrat")) return syscall(466, AT_FDCWD, path, 0, "user.x") == 0;
    if (!strcmp(what, "file_setattr")) {
        unsigned long long attr[3] = {0, 0, 0};
        return syscall(469, AT_FDCWD, path, attr, sizeof attr, 0) == 0;
    }
    if (!strcmp(what, "setflags")) {
        int flags = FS_NODUMP_FL;
        fd = open(path, O_RDONLY);
        return ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
    }
    if (!strcmp(what, "sendmmsg")) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        struct iovec iov = {"x", 1};
        struct mmsghdr m = {.msg_hdr = {.msg_name = &sa, .msg_namelen = sizeof sa, .msg_iov = &iov, .msg_iovlen = 1}};
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        fd = socket(AF_UNIX, SOCK_DGRAM, 0);
        return syscall(SYS_sendmmsg, fd, &m, 1, 0) > 0;
    }
    if (!strcmp(what, "flip")) {  /* a symlink under /tmp flipped between /tmp/d and /etc */
        mkdir("/tmp/d", 0755);
        symlink("/tmp/d", "/tmp/l");
        pid_t child = fork();
        if (child == 0)
            for (int i = 0;; i++) {
                symlink(i % 2 ? "/tmp/d" : "/etc", "/tmp/l.new");
                rename("/tmp/l.new", "/tmp/l");
            }
        race(atoi(path), "/tmp/l/p");
        kill(child, SIGKILL);
        return 0;
    }
    if (!strcmp(what, "memflip")) {  /* the path changed in memory by another thread */
        pthread_t t;
        mkdir("/tmp/d", 0755);
        pthread_create(&t, NULL, flip_memory, NULL);
        race(atoi(path), flip_buf);
        return 0;
    }
    if (!strcmp(what, "fdflip")) {  /* the descriptor swapped by another thread */
        pthread_t t;
        int hits = 0;
        pthread_create(&t, NULL, flip_fd, NULL);
        for (int i = 0; i < atoi(path); i++)
            if (fchmod(5, 0644) < 0 && blocked()) hits++;
        printf("reached /etc:%s\n", hits ? " passwd" : "");
        return 0;
    }
    if (!strcmp(what, "timestamp")) {  /* a socket's receive time: the host's clock */
        int sv[2], on = 1;
        socketpair(AF_UNIX, SOCK_DGRAM, 0, sv);
        int opts[] = {SO_TIMESTAMP, SO_TIMESTAMPNS, SO_TIMESTAMPING, 63, 64, 65};
        for (unsigned i = 0; i < sizeof opts / sizeof opts[0]; i++)
            if (setsockopt(sv[1], SOL_SOCKET, opts[i], &on, sizeof on) == 0) printf("option %d set\n", opts[i]);
        if (write(sv[0], "x", 1) != 1) return 1;
        char data[8], ctl[256];
        struct iovec iov = {data, sizeof data};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
        recvmsg(sv[1], &mh, 0);
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            long sec;
            memcpy(&sec, CMSG_DATA(c), sizeof sec);
            printf("timestamp %ld\n", sec);
        }
        struct timeval tv;
        if (ioctl(sv[1], 0x8906 /* SIOCGSTAMP */, &tv) == 0) printf("timestamp %ld\n", (long)tv.tv_sec);
        /* the clock read by system calls, past the C library (and its clock shim) */
        struct timespec ts;
        if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) == 0) printf("timestamp %ld\n", (long)ts.tv_sec);
        if (syscall(SYS_clock_gettime, CLOCK_TAI, &ts) == 0) printf("timestamp %ld\n", (long)ts.tv_sec);
        if (syscall(SYS_gettimeofday, &tv, NULL) == 0) printf("timestamp %ld\n", (long)tv.tv_sec);
        printf("monotonic %d\n", syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts) == 0);
        return 0;
    }
    fprintf(stderr, "unknown attack %s\n", what);
    return 2;
}
