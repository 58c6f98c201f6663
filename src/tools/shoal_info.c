/* shoal_info: what was built in, what is usable now, and every SHOAL_* variable.
 *   -v  version           -b  built-in components (transports, optional dependencies)
 *   -c  config variables  -m  with -c: the Markdown table for the README
 *   -h  help
 * A tool, not the library: it prints to stdout. */
#include "core/tl.h"
#include "util/util.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define SHOAL_INFO_VALUE_MAX 512

static void shoal_info_usage(FILE *fp)
{
    fprintf(fp,
            "usage: shoal_info [-v] [-b] [-c [-m]] [-h]\n"
            "  -v  print the version\n"
            "  -b  print built-in components: transports (and whether usable now),\n"
            "      optional dependencies\n"
            "  -c  print every SHOAL_* variable: value, default, source and meaning\n"
            "      (the output is a valid SHOAL_CONF_FILE)\n"
            "  -m  with -c: print a Markdown table (Variable | Default | Meaning)\n"
            "  -h  print this help\n"
            "With no option, -v is assumed.\n");
}

static void shoal_info_print_version(void)
{
    printf("# %s (API %d.%d.%d, transport ABI %d)\n", shoal_version_string(), SHOAL_VERSION_MAJOR,
           SHOAL_VERSION_MINOR, SHOAL_VERSION_PATCH, SHOAL_TL_ABI_VERSION);
}

static void shoal_info_print_transports(void)
{
    size_t i, n = shoal_tl_count();

    printf("# transports, in order of preference\n");
    for (i = 0; i < n; i++) {
        const shoal_tl_ops_t *tl = shoal_tl_get(i);
        const char *usable = tl->query == NULL ? "unknown" : (tl->query() ? "yes" : "no");

        printf("#   %-6s usable: %-7s scope: %s%s\n", tl->name, usable,
               tl->intra_node_only ? "same host" : "any host",
               (tl->caps & SHOAL_TL_CAP_SHARED_AREA) != 0 ? ", shared area" : "");
    }
}

static void shoal_info_print_built(void)
{
    /* found: configure found the dependency; used_by: the layer of shoal that uses it, or
     * NULL while that layer is not written yet (then nothing of it is in this build). */
    static const struct {
        const char *name;
        int found;
        const char *used_by;
    } deps[] = {
        {.name = "hwloc", .found = SHOAL_HAVE_HWLOC, .used_by = NULL},
        {.name = "ucx", .found = SHOAL_HAVE_UCX, .used_by = NULL},
        {.name = "verbs", .found = SHOAL_HAVE_VERBS, .used_by = NULL},
        {.name = "cuda", .found = SHOAL_HAVE_CUDA, .used_by = NULL},
        {.name = "nccl", .found = SHOAL_HAVE_NCCL, .used_by = NULL},
        {.name = "mpi", .found = SHOAL_HAVE_MPI, .used_by = NULL},
    };
    static const char *const levels[] = {"none", "version", "warn", "info", "trace"};
    size_t i;

    shoal_info_print_transports();
    printf("# optional dependencies (found by configure; built in only where a layer uses them)\n");
    for (i = 0; i < SHOAL_ARRAY_SIZE(deps); i++)
        printf("#   %-6s found: %-3s built in: %s\n", deps[i].name, deps[i].found ? "yes" : "no",
               deps[i].found && deps[i].used_by != NULL ? deps[i].used_by : "no");
    printf("# build\n");
    printf("#   logging up to: %s\n", levels[SHOAL_LOG_MAX_LEVEL]);
#ifdef SHOAL_DEBUG_BUILD
    printf("#   debug build: yes\n");
#else
    printf("#   debug build: no\n");
#endif
}

static const void *shoal_info_field_src(const shoal_cfg_table_t *t, const shoal_cfg_field_t *f)
{
    return (const char *)t->dst + f->offset;
}

static void shoal_info_print_config(void)
{
    char value[SHOAL_INFO_VALUE_MAX];
    size_t t, i;

    for (t = 0; t < shoal_cfg_ntables; t++) {
        const shoal_cfg_table_t *tab = shoal_cfg_tables[t];

        printf("#\n# module %s\n#\n", tab->module);
        for (i = 0; i < tab->nfields; i++) {
            const shoal_cfg_field_t *f = &tab->fields[i];

            shoal_cfg_format_value(f, shoal_info_field_src(tab, f), value, sizeof(value));
            printf("# %s\n# default: '%s', set by: %s\nSHOAL_%s=%s\n", f->doc, f->dflt,
                   shoal_cfg_source(f), f->name, value);
        }
    }
}

/* A Markdown table cell: '|' escaped, newlines flattened. */
static void shoal_info_md_cell(const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '|')
            fputs("\\|", stdout);
        else if (*s == '\n')
            fputc(' ', stdout);
        else
            fputc(*s, stdout);
    }
}

static void shoal_info_print_config_md(void)
{
    size_t t, i;

    printf("| Variable | Default | Meaning |\n");
    printf("|---|---|---|\n");
    for (t = 0; t < shoal_cfg_ntables; t++) {
        const shoal_cfg_table_t *tab = shoal_cfg_tables[t];

        for (i = 0; i < tab->nfields; i++) {
            const shoal_cfg_field_t *f = &tab->fields[i];

            printf("| `SHOAL_%s` | ", f->name);
            if (f->dflt[0] == '\0') {
                printf("*unset*");
            } else {
                printf("`");
                shoal_info_md_cell(f->dflt);
                printf("`");
            }
            printf(" | ");
            shoal_info_md_cell(f->doc);
            printf(" |\n");
        }
    }
}

int main(int argc, char **argv)
{
    int opt, version = 0, built = 0, config = 0, markdown = 0;

    opterr = 0;
    while ((opt = getopt(argc, argv, "vbcmh")) != -1) {
        switch (opt) {
        case 'v': version = 1; break;
        case 'b': built = 1; break;
        case 'c': config = 1; break;
        case 'm': markdown = 1; break;
        case 'h':
            shoal_info_usage(stdout);
            return 0;
        default:
            fprintf(stderr, "shoal_info: unknown option '-%c'\n", optopt);
            shoal_info_usage(stderr);
            return 2;
        }
    }
    if (optind < argc || (markdown && !config)) {
        fprintf(stderr, "shoal_info: %s\n",
                optind < argc ? "unexpected argument" : "-m goes with -c");
        shoal_info_usage(stderr);
        return 2;
    }
    if (!version && !built && !config)
        version = 1;
    shoal_config_global_init();
    if (version)
        shoal_info_print_version();
    if (built)
        shoal_info_print_built();
    if (config && markdown)
        shoal_info_print_config_md();
    else if (config)
        shoal_info_print_config();
    return fflush(stdout) == 0 ? 0 : 1;
}
