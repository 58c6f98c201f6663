/* Host identity: short hostname and a 64-bit host id (SHOAL_HOSTID, or hostname + boot id). */
#include "util/util.h"

#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHOAL_HOST_NAME_MAX 256

static char shoal_host_name[SHOAL_HOST_NAME_MAX];
static uint64_t shoal_host_id_val;
static pthread_once_t shoal_host_name_once = PTHREAD_ONCE_INIT;
static pthread_once_t shoal_host_id_once = PTHREAD_ONCE_INIT;

static void shoal_host_name_init(void)
{
    char *dot;

    if (gethostname(shoal_host_name, sizeof(shoal_host_name) - 1) != 0 ||
        shoal_host_name[0] == '\0') {
        strcpy(shoal_host_name, "localhost");
    }
    shoal_host_name[sizeof(shoal_host_name) - 1] = '\0';
    dot = strchr(shoal_host_name, '.');
    if (dot != NULL && dot != shoal_host_name)
        *dot = '\0';
}

const char *shoal_hostname(void)
{
    pthread_once(&shoal_host_name_once, shoal_host_name_init);
    return shoal_host_name;
}

/* Reads the kernel boot id (36 characters); len 0 where unavailable (containers hide it). */
static size_t shoal_host_boot_id(char *buf, size_t size)
{
    ssize_t ret;
    int fd;

    fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ret = read(fd, buf, size);
    close(fd);
    if (ret <= 0)
        return 0;
    while (ret > 0 && (buf[ret - 1] == '\n' || buf[ret - 1] == ' '))
        ret--;
    return (size_t)ret;
}

static void shoal_host_id_init(void)
{
    const char *override;
    const char *name;
    char boot_id[64];
    size_t len;
    uint64_t h;

    shoal_config_global_init();
    override = shoal_util_config.hostid;
    if (override != NULL && override[0] != '\0') {
        shoal_host_id_val = shoal_hash64(override, strlen(override), 0);
        shoal_info(INIT, "host id %016llx from SHOAL_HOSTID=%s",
                   (unsigned long long)shoal_host_id_val, override);
        return;
    }
    name = shoal_hostname();
    h = shoal_hash64(name, strlen(name), 0);
    len = shoal_host_boot_id(boot_id, sizeof(boot_id));
    h = shoal_hash64(boot_id, len, h);
    shoal_host_id_val = h;
    shoal_info(INIT, "host id %016llx (host %s, boot id %s)", (unsigned long long)h, name,
               len > 0 ? "read" : "unavailable");
}

uint64_t shoal_host_id(void)
{
    pthread_once(&shoal_host_id_once, shoal_host_id_init);
    return shoal_host_id_val;
}

uint32_t shoal_pid_ns(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint32_t)sb.st_ino : 0;
}
