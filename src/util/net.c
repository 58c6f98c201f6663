/* Interface-name lists with NCCL's SOCKET_IFNAME semantics. */
#include "util/util.h"

#include <string.h>

int shoal_ifname_match(const char *spec, const char *ifname)
{
    int exclude = 0, exact = 0, hit = 0;
    if (*spec == '^') {
        exclude = 1;
        spec++;
    }
    if (*spec == '=') {
        exact = 1;
        spec++;
    }
    while (*spec != '\0' && !hit) {
        size_t n = strcspn(spec, ",");
        if (n > 0) {
            hit = exact ? strlen(ifname) == n && strncmp(ifname, spec, n) == 0
                        : strncmp(ifname, spec, n) == 0;
        }
        spec += n;
        if (*spec == ',') {
            spec++;
        }
    }
    return exclude ? !hit : hit;
}
