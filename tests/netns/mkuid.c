/*
 * mkuid: makes a shoal unique id for ranks that are started by hand (tests/netns/netns.sh)
 * and prints it as hex on one line of stdout.
 *
 * The rendezvous root runs in a thread of this process, so the process stays alive until the
 * ranks have joined: it returns when its stdin reaches end of file (when stdin is a pipe, a
 * FIFO or a socket), on SIGTERM/SIGINT/SIGHUP, or after SECONDS (default 300), whichever comes
 * first. Run it where the ranks can reach the address it publishes (the first non-loopback
 * IPv4 address that is up, else loopback).
 *
 * usage: mkuid [SECONDS]
 */
#include <shoal.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t mkuid_stop;

static void mkuid_on_signal(int signo)
{
    (void)signo;
    mkuid_stop = 1;
}

static double mkuid_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 1 when stdin can tell us that our caller is done (end of file on a pipe or socket). */
static int mkuid_stdin_watchable(void)
{
    struct stat st;

    return fstat(0, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
}

/* Waits for end of file on stdin (if watchable), a signal, or the deadline. */
static void mkuid_wait(double seconds)
{
    double deadline = mkuid_now() + seconds;
    int watch = mkuid_stdin_watchable();
    char buf[256];

    while (mkuid_stop == 0) {
        double left = deadline - mkuid_now();
        struct pollfd pfd = {.fd = watch ? 0 : -1, .events = POLLIN};
        int rc;

        if (left <= 0) {
            return;
        }
        rc = poll(&pfd, 1, left > 1.0 ? 1000 : (int)(left * 1000) + 1);
        if (rc > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
            ssize_t n = read(0, buf, sizeof(buf));

            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
                return; /* end of file: the caller is done */
            }
        }
    }
}

int main(int argc, char **argv)
{
    static const char digits[] = "0123456789abcdef";
    struct sigaction sa = {.sa_handler = mkuid_on_signal};
    char hex[2 * SHOAL_UID_BYTES + 2];
    double seconds = 300;
    shoal_uid_t uid;
    shoal_status_t st;

    if (argc > 2 || (argc == 2 && (seconds = strtod(argv[1], NULL)) <= 0)) {
        fprintf(stderr, "usage: mkuid [SECONDS]\n");
        return 2;
    }
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    st = shoal_get_unique_id(&uid);
    if (st != SHOAL_OK) {
        fprintf(stderr, "mkuid: shoal_get_unique_id failed: %s\n", shoal_strerror(st));
        return 1;
    }
    for (size_t i = 0; i < SHOAL_UID_BYTES; i++) {
        unsigned char b = (unsigned char)uid.internal[i];

        hex[2 * i] = digits[b >> 4];
        hex[2 * i + 1] = digits[b & 0xf];
    }
    hex[2 * SHOAL_UID_BYTES] = '\n';
    hex[2 * SHOAL_UID_BYTES + 1] = '\0';
    if (fputs(hex, stdout) == EOF || fflush(stdout) != 0) {
        fprintf(stderr, "mkuid: cannot write the id: %s\n", strerror(errno));
        return 1;
    }
    memset(hex, 0, sizeof(hex));
    memset(&uid, 0, sizeof(uid));
    mkuid_wait(seconds);
    return 0;
}
