/* The join listeners' circuit breaker (src/tenant/breaker.c): a source opens after
 * SHOAL_TENANT_BREAKER_FAILS failures (a window of inf included, which its log line says as
 * such), a trusted one never, a proof closes it, a table full of open breakers still refuses
 * newcomers (and does not log each of their failures), and one full of trusted addresses
 * grows. */
#include "tenant/breaker.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char test_log_path[64]; /* the WARN lines, for the sentences they say */

/* The last line logged (up to 1 KiB), "" if none. */
static const char *test_last_log(char *buf, size_t len)
{
    FILE *fp = fopen(test_log_path, "r");

    buf[0] = '\0';
    while (fp != NULL && fgets(buf, (int)len, fp) != NULL) {
    }
    if (fp != NULL) {
        fclose(fp);
    }
    return buf;
}

static struct sockaddr_in test_v4(const char *ip, uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

/* 10.a.b.c for the i-th source of a flood. */
static struct sockaddr_in test_nth(int i)
{
    char ip[32];
    snprintf(ip, sizeof(ip), "10.%d.%d.%d", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    return test_v4(ip, 40000);
}

/* n failures of sa; returns how many of them asked for a full log line. */
static int test_fail(const struct sockaddr_in *sa, int n)
{
    int logged = 0;
    for (int i = 0; i < n; i++) {
        logged += shoal_tenant_breaker_note_fail((const struct sockaddr *)sa);
    }
    return logged;
}

static int test_admit(const struct sockaddr_in *sa)
{
    return shoal_tenant_breaker_admit((const struct sockaddr *)sa);
}

int main(void)
{
    struct sockaddr_in a = test_v4("192.0.2.7", 1000), a2 = test_v4("192.0.2.7", 2000);
    struct sockaddr_in t = test_v4("192.0.2.9", 1000), n;
    struct sockaddr_in6 m = {.sin6_family = AF_INET6, .sin6_port = htons(5)};
    shoal_tenant_breaker_stats_t st;
    int logged, refused;
    char line[1024];

    /* a WARN line per opened source: into a file, not the test's output */
    snprintf(test_log_path, sizeof(test_log_path), "/tmp/test_breaker_log.%d", (int)getpid());
    unlink(test_log_path);
    setenv("SHOAL_DEBUG_FILE", test_log_path, 1);
    setenv("SHOAL_DEBUG", "WARN", 1);
    shoal_config_global_init();
    shoal_log_init();
    shoal_tenant_breaker_config.fails = 8;
    shoal_tenant_breaker_config.window_ms = 10000;
    shoal_tenant_breaker_config.cooldown_ms = 60000;

    /* One source: the IP, without the port; an IPv4-mapped IPv6 address is that IPv4. */
    inet_pton(AF_INET6, "::ffff:192.0.2.7", &m.sin6_addr);
    tap_ok(shoal_tenant_breaker_same_source((struct sockaddr *)&a, (struct sockaddr *)&a2) &&
               shoal_tenant_breaker_same_source((struct sockaddr *)&a, (struct sockaddr *)&m) &&
               !shoal_tenant_breaker_same_source((struct sockaddr *)&a, (struct sockaddr *)&t),
           "same source: the IP without the port, v4-mapped as v4");

    logged = test_fail(&a, 7);
    tap_ok(test_admit(&a2) && logged == 1, "7 failures: still admitted, one full log line");
    test_fail(&a, 1);
    tap_ok(!test_admit(&a2) && !test_admit(&a), "the 8th opens it: refused (any port)");
    shoal_tenant_breaker_note_ok((const struct sockaddr *)&a);
    tap_ok(test_admit(&a), "a proof from it closes it");

    shoal_tenant_breaker_trust((const struct sockaddr *)&t, +1);
    test_fail(&t, 20);
    tap_ok(test_admit(&t), "a trusted address never opens");
    shoal_tenant_breaker_trust((const struct sockaddr *)&t, -1);

    /* SHOAL_TENANT_BREAKER_WINDOW=inf (-1): every failure counts (it counted none: the
     * breaker never opened). */
    shoal_tenant_breaker_reset();
    shoal_tenant_breaker_config.window_ms = -1;
    test_fail(&a, 8);
    tap_ok(!test_admit(&a), "window inf: 8 failures open it");
    /* ... and the line that opens it says inf as such: it said 'within -1 ms' and, with
     * SHOAL_TENANT_BREAKER_COOLDOWN=inf too, 'refusing its connections for -1 ms' */
    shoal_tenant_breaker_reset();
    shoal_tenant_breaker_config.cooldown_ms = -1;
    test_fail(&a, 8);
    test_last_log(line, sizeof(line));
    tap_ok(!test_admit(&a) &&
               strstr(line, "192.0.2.7 failed to authenticate 8 times (window inf): refusing "
                            "its connections for good (cooldown inf)") != NULL,
           "window and cooldown inf: refused, and the log line says inf, not -1 ms");
    shoal_tenant_breaker_config.cooldown_ms = 60000;
    shoal_tenant_breaker_config.window_ms = 10000;

    /* Fill the table (256 entries) with open breakers, then newcomers. */
    shoal_tenant_breaker_reset();
    for (int i = 0; i < 256; i++) {
        n = test_nth(i);
        test_fail(&n, 8);
    }
    shoal_tenant_breaker_stats(&st, NULL, 0, NULL);
    tap_is_int(st.open_now, 256, "256 sources opened: the table is full of open breakers");
    logged = refused = 0;
    for (int i = 1000; i < 1040; i++) {
        n = test_nth(i);
        logged += test_fail(&n, 20);
        refused += !test_admit(&n);
    }
    tap_is_int(refused, 40, "40 newcomers failing 20 times each: each is refused");
    tap_is_int(logged, 40, "... with one full log line each, not one per failure");
    shoal_tenant_breaker_stats(&st, NULL, 0, NULL);
    tap_ok(st.sources == 256 && st.open_now == 256, "the table stays at 256 open sources");

    /* Every entry trusted (the peers of a job over 300 hosts): the table grows. A newcomer
     * was not tracked (the breaker was off for it), and a trust that did not fit was
     * dropped, so its release lowered another communicator's trust of that address. */
    shoal_tenant_breaker_reset();
    for (int i = 0; i < 300; i++) {
        n = test_nth(i);
        shoal_tenant_breaker_trust((const struct sockaddr *)&n, +1);
    }
    n = test_nth(5000);
    logged = test_fail(&n, 30);
    tap_ok(!test_admit(&n) && logged == 1,
           "a table of 300 trusted addresses: a newcomer failing 30 times is refused, one line");
    n = test_nth(299);
    shoal_tenant_breaker_trust((const struct sockaddr *)&n, +1); /* a second communicator */
    shoal_tenant_breaker_trust((const struct sockaddr *)&n, -1); /* the first one's end */
    test_fail(&n, 30);
    tap_ok(test_admit(&n), "the 300th trusted address keeps the second communicator's trust");
    shoal_tenant_breaker_stats(&st, NULL, 0, NULL);
    tap_is_int((int)st.sources, 301, "the table holds the 300 trusted addresses and the newcomer");
    for (int i = 0; i < 300; i++) {
        n = test_nth(i);
        shoal_tenant_breaker_trust((const struct sockaddr *)&n, -1);
    }
    shoal_tenant_breaker_reset();
    unlink(test_log_path);
    return tap_done();
}
