/* Replays inputs through a fuzz target without libFuzzer (every build): each argument is a
 * file or a directory whose regular files (sorted by name) are fed, one call each, to
 * LLVMFuzzerTestOneInput. Prints one line per input to stderr before running it (so a crash
 * names its input) and the count on stdout. Exit 0, or 2 if an input could not be read; a
 * finding crashes the process (sanitizers, or the target's fuzz_require). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int shoal_replay_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, n;

    if (fp == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    do {
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap == 0 ? 4096 : 2 * cap);
            if (nb == NULL) {
                fprintf(stderr, "replay: %s: out of memory\n", path);
                free(buf);
                fclose(fp);
                return -1;
            }
            buf = nb;
            cap = cap == 0 ? 4096 : 2 * cap;
        }
        n = fread(buf + len, 1, cap - len, fp);
        len += n;
    } while (n > 0);
    fclose(fp);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    /* An exact-size copy, so that ASan sees a read past the input's end. */
    uint8_t *in = malloc(len > 0 ? len : 1);
    if (in == NULL) {
        free(buf);
        return -1;
    }
    memcpy(in, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(in, len);
    free(in);
    return 0;
}

static int shoal_replay_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int shoal_replay_dir(const char *dir, int *count_p)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;

    if (d == NULL) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            continue;
        }
        if (n == cap) {
            char **nn = realloc(names, (cap = cap == 0 ? 64 : 2 * cap) * sizeof(*names));
            if (nn == NULL) {
                rc = -1;
                break;
            }
            names = nn;
        }
        names[n] = strdup(path);
        if (names[n] == NULL) {
            rc = -1;
            break;
        }
        n++;
    }
    closedir(d);
    if (n > 0) {
        qsort(names, n, sizeof(*names), shoal_replay_cmp);
    }
    for (size_t i = 0; i < n; i++) {
        if (rc == 0 && shoal_replay_file(names[i]) != 0) {
            rc = -1;
        }
        (*count_p)++;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    int count = 0, rc = 0;

    if (LLVMFuzzerInitialize != NULL) {
        LLVMFuzzerInitialize(&argc, &argv);
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            rc = 2;
        } else if (S_ISDIR(st.st_mode)) {
            rc = shoal_replay_dir(argv[i], &count) != 0 ? 2 : rc;
        } else {
            rc = shoal_replay_file(argv[i]) != 0 ? 2 : rc;
            count++;
        }
    }
    printf("%d\n", count);
    return rc;
}
