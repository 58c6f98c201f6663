/* nopidfd PROGRAM [ARGS...]: runs PROGRAM as on a kernel without pidfds (before Linux 5.3):
 * pidfd_open fails with ENOSYS and getsockopt(SO_PEERPIDFD) with ENOPROTOOPT, through a
 * seccomp filter (no privilege needed: no_new_privs). tests/agent/test_shoald_reg.sh runs
 * shoald so. Exits 77 where the filter cannot be installed (another architecture, no seccomp). */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define NOPIDFD_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NOPIDFD_ARCH AUDIT_ARCH_AARCH64
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#define NOPIDFD_SO_PEERPIDFD 77

int main(int argc, char **argv)
{
#ifdef NOPIDFD_ARCH
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NOPIDFD_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_open, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getsockopt, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NOPIDFD_SO_PEERPIDFD, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOPROTOOPT),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};

    if (argc < 2) {
        fprintf(stderr, "usage: nopidfd PROGRAM [ARGS...]\n");
        return 2;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("nopidfd: seccomp");
        return 77;
    }
    execvp(argv[1], argv + 1);
    perror("nopidfd: exec");
    return 127;
#else
    (void)argc;
    (void)argv;
    fprintf(stderr, "nopidfd: no seccomp filter for this architecture\n");
    return 77;
#endif
}
