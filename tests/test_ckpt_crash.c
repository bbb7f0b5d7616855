/* test_ckpt_crash.c - crash consistency of nb_ckpt_quantize and
 * nb_ckpt_convert (src/io/ckpt_out.c): whatever step of writing OUT fails or
 * is killed, OUT is left as it was (absent, or the empty directory it was) or
 * complete - never a partial checkpoint that nb_ckpt_open (nibble inspect, a
 * loader) accepts - and a rerun into the same OUT works.
 *
 * Every step that creates, writes, syncs, renames or removes a file of the
 * output calls the fault hook (nbio_fault_step, io_internal.h).  For each
 * scenario the test counts the steps S of a clean run, then for every
 * N = 1..S:
 *   fail  step N returns NB_ERR_IO in this process: the call fails with the
 *         injected message and nothing is left next to OUT (or, for the steps
 *         after the publishing rename, which cannot fail the run, it succeeds
 *         and OUT is complete);
 *   kill  a forked child raises SIGKILL at step N: OUT is absent (or still
 *         empty) and refused by nb_ckpt_open, or complete; then a rerun into
 *         OUT (after removing a complete one) succeeds, gives the reference
 *         bytes and removes the killed run's staging directory.
 * Scenarios: quantize a sharded BF16 checkpoint (NVFP4) into a new OUT and
 * into an existing empty one, quantize a single file (MXFP4), convert the
 * sharded NVFP4 result to compressed-tensors, convert a GGUF file to Quark,
 * quantize to compressed-tensors int4 (sharded, groups of 32) and int4_sym
 * (a single file into an existing empty OUT, one group per row).
 * Then the sweep's limits: a staging directory whose marker is held (a
 * running writer), one whose marker has other contents, one holding a
 * subdirectory, a look-alike without a marker, and an empty marker next to
 * a directory are all left alone.
 *
 *   test_ckpt_crash [DIR]   fixtures in DIR (default: a temporary directory)
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* flock */
#include "ckpt_testlib.h"
#include "io_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ files */

/* The regular files of a directory, sorted by name, with their contents. */
typedef struct listing {
    char *name[64];
    char *data[64];
    size_t size[64];
    size_t n;
} listing;

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Names in dir (not . and ..), sorted; how many (at most max). */
static size_t names_in(const char *dir, char **names, size_t max) {
    DIR *d = opendir(dir);
    size_t n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && n < max) names[n++] = strdup(e->d_name);
    if (d) closedir(d);
    qsort(names, n, sizeof *names, cmp_cstr);
    return n;
}

static void list_free(listing *l) {
    for (size_t i = 0; i < l->n; i++) {
        free(l->name[i]);
        free(l->data[i]);
    }
    l->n = 0;
}

static void list_dir(const char *dir, listing *l) {
    l->n = names_in(dir, l->name, 64);
    for (size_t i = 0; i < l->n; i++) {
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, l->name[i]);
        l->data[i] = read_file_all(p, &l->size[i]);
    }
}

/* 1 when dir holds exactly ref's files with ref's bytes. */
static int same_files(const char *dir, const listing *ref) {
    listing l;
    list_dir(dir, &l);
    int same = l.n == ref->n;
    for (size_t i = 0; same && i < l.n; i++)
        same = !strcmp(l.name[i], ref->name[i]) && l.data[i] && l.size[i] == ref->size[i] &&
               !memcmp(l.data[i], ref->data[i], l.size[i]);
    list_free(&l);
    return same;
}

static void rm_rf(const char *path) {
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) printf("note: could not remove %s\n", path);
}

/* ------------------------------------------------------------ fixtures */

static const char *k_config = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64}\n";

/* A BF16 checkpoint in g_dir/sub: two shards and an index (sharded), or
 * model.safetensors; config.json and tokenizer.json next to it. */
static void write_bf16(const char *sub, int sharded) {
    static const char *const names[] = {"model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight",
                                        "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"};
    tset s[2] = {{.n = 0}, {.n = 0}};
    for (int i = 0; i < 4; i++) {
        const int64_t shape[2] = {i == 3 ? 64 : 32, 64};
        uint16_t w[32 * 64];
        for (int j = 0; j < 32 * 64; j++) w[j] = ref_bf16((float)(rnd_unit() - 0.5));
        add(&s[sharded ? i % 2 : 0], names[i], NB_ST_BF16, i == 3 ? 1 : 2, shape, w, 0, 0);
    }
    if (sharded) {
        write_set(&s[0], sub, "model-00001-of-00002.safetensors");
        write_set(&s[1], sub, "model-00002-of-00002.safetensors");
        char idx[1024] = "{\"metadata\": {}, \"weight_map\": {";
        for (int i = 0; i < 4; i++) {
            size_t l = strlen(idx);
            snprintf(idx + l, sizeof idx - l, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                     names[i], i % 2 + 1);
        }
        strcat(idx, "}}\n");
        write_text(sub, "model.safetensors.index.json", idx);
    } else {
        write_set(&s[0], sub, "model.safetensors");
    }
    write_text(sub, "config.json", k_config);
    write_text(sub, "tokenizer.json", "{\"model\": {}}\n");
    free_set(&s[0]);
    free_set(&s[1]);
}

static void put_u32(uint8_t **p, uint32_t v) {
    for (int i = 0; i < 4; i++) *(*p)++ = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t **p, uint64_t v) {
    for (int i = 0; i < 8; i++) *(*p)++ = (uint8_t)(v >> (8 * i));
}
static void put_str(uint8_t **p, const char *s) {
    put_u64(p, strlen(s));
    memcpy(*p, s, strlen(s));
    *p += strlen(s);
}

/* g_dir/<name>: GGUF v3 with an MXFP4 weight [4, 64] and an F32 [2, 8]. */
static void write_gguf(const char *name) {
    uint8_t file[1024] = {0}, *p = file;
    memcpy(p, "GGUF", 4);
    p += 4;
    put_u32(&p, 3);
    put_u64(&p, 2); /* tensors */
    put_u64(&p, 0); /* keys */
    put_str(&p, "blk.0.ffn_down.weight");
    put_u32(&p, 2);
    put_u64(&p, 64);
    put_u64(&p, 4);
    put_u32(&p, NB_GGML_TYPE_MXFP4);
    put_u64(&p, 0);
    put_str(&p, "token_embd.weight");
    put_u32(&p, 2);
    put_u64(&p, 8);
    put_u64(&p, 2);
    put_u32(&p, NB_GGML_TYPE_F32);
    put_u64(&p, 160); /* 8 blocks of 17 bytes, padded to 32 */
    const size_t data = ((size_t)(p - file) + 31) / 32 * 32;
    for (int b = 0; b < 8; b++) {
        file[data + 17 * b] = (uint8_t)(120 + b);
        for (int j = 1; j < 17; j++) file[data + 17 * b + j] = (uint8_t)rnd_u64();
    }
    for (int i = 0; i < 16; i++) {
        float v = (float)i / 8.0f;
        memcpy(file + data + 160 + 4 * i, &v, 4);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(file, 1, data + 224, f) == data + 224, "write %s", path);
    if (f) fclose(f);
}

/* ------------------------------------------------------------ scenarios */

typedef struct scenario {
    const char *name;
    const char *in;    /* under g_dir */
    int convert;       /* 0: quantize */
    nb_format format;  /* quantize */
    nb_ckpt_target to; /* convert */
    int out_exists;    /* OUT is an existing empty directory */
    int32_t group;     /* quantize: opts.group_size (the integer formats) */
} scenario;

static nb_status run_op(const scenario *sc, const char *out) {
    char in[1024];
    snprintf(in, sizeof in, "%s/%s", g_dir, sc->in);
    if (sc->convert) {
        nb_ckpt_convert_opts o;
        nb_ckpt_convert_opts_init(&o);
        o.target = sc->to;
        return nb_ckpt_convert(in, out, &o, NULL);
    }
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.format = sc->format;
    o.group_size = sc->group;
    o.device = NB_CKPT_DEVICE_CPU; /* no CUDA in a forked child */
    return nb_ckpt_quantize(in, out, &o, NULL);
}

/* A fresh parent directory g_dir/<sc->name>_<tag> with OUT inside
 * (created empty when the scenario says so). */
enum { PARENT_MAX = 1024, OUT_MAX = PARENT_MAX + 8 };
static void fresh_parent(const scenario *sc, const char *tag, char parent[PARENT_MAX], char out[OUT_MAX]) {
    snprintf(parent, PARENT_MAX, "%s/%s_%s", g_dir, sc->name, tag);
    rm_rf(parent);
    mkdir(parent, 0755);
    snprintf(out, OUT_MAX, "%s/out", parent);
    if (sc->out_exists) mkdir(out, 0755);
}

/* What a stopped run left: 0 nothing (OUT as it was: absent or empty, and
 * refused as a checkpoint), 1 complete (OUT holds the reference bytes), -1
 * anything else.  Entries next to OUT other than OUT must be hidden staging
 * leftovers. */
static int outcome(const scenario *sc, const char *parent, const char *out, const listing *ref, char *why, size_t n) {
    char *names[64];
    const size_t k = names_in(parent, names, 64);
    int bad_entry = 0;
    for (size_t i = 0; i < k; i++) {
        if (strcmp(names[i], "out") && strncmp(names[i], ".out.nibble-staging-", 20)) bad_entry = 1;
        free(names[i]);
    }
    if (bad_entry) {
        snprintf(why, n, "an entry next to OUT that is neither OUT nor a staging leftover");
        return -1;
    }
    if (same_files(out, ref)) return 1;
    struct stat sb;
    const int exists = stat(out, &sb) == 0;
    char *inner[4];
    const size_t ninner = exists ? names_in(out, inner, 4) : 0;
    for (size_t i = 0; i < ninner; i++) free(inner[i]);
    if (exists != sc->out_exists || (exists && (!S_ISDIR(sb.st_mode) || ninner))) {
        snprintf(why, n, "OUT %s", exists ? "partial" : "removed");
        return -1;
    }
    nb_ckpt *c = NULL;
    if (nb_ckpt_open(out, &c) == NB_OK) {
        nb_ckpt_close(c);
        snprintf(why, n, "nb_ckpt_open accepts an unfinished OUT");
        return -1;
    }
    return 0;
}

/* Only OUT next to OUT (every staging leftover swept). */
static int parent_clean(const char *parent) {
    char *names[64];
    const size_t k = names_in(parent, names, 64);
    const int ok = k == 1 && !strcmp(names[0], "out");
    for (size_t i = 0; i < k; i++) free(names[i]);
    return ok;
}

/* Rerun without faults into OUT (a complete one removed first): the
 * reference bytes, and the killed run's leftovers gone. */
static void rerun(const scenario *sc, const char *parent, const char *out, const listing *ref, int complete, long step,
                  const char *mode) {
    if (complete) {
        rm_rf(out);
        if (sc->out_exists) mkdir(out, 0755);
    }
    const nb_status st = run_op(sc, out);
    CHECK(st == NB_OK && same_files(out, ref) && parent_clean(parent), "%s, %s at step %ld: rerun %s (%s)%s", sc->name,
          mode, step, nb_status_name(st), st == NB_OK ? "" : nb_last_error(),
          st == NB_OK && !parent_clean(parent) ? ": leftovers next to OUT" : "");
}

static void run_scenario(const scenario *sc) {
    char parent[PARENT_MAX], out[OUT_MAX], why[128];
    listing ref;
    fresh_parent(sc, "ref", parent, out);
    nbio_fault_arm(0, 0);
    nb_status st = run_op(sc, out);
    const long steps = nbio_fault_steps();
    CHECK(st == NB_OK && steps > 5, "%s: reference run %s (%s), %ld steps", sc->name, nb_status_name(st),
          nb_last_error(), steps);
    if (st != NB_OK) return;
    list_dir(out, &ref);
    int fails = 0, kills_nothing = 0, kills_complete = 0;
    for (long n = 1; n <= steps; n++) {
        /* fail: in this process */
        fresh_parent(sc, "fail", parent, out);
        nbio_fault_arm(n, NBIO_FAULT_FAIL);
        st = run_op(sc, out);
        const long ran = nbio_fault_steps();
        char msg[NB_ERRBUF];
        snprintf(msg, sizeof msg, "%s", nb_last_error());
        nbio_fault_arm(0, 0);
        const int oc = outcome(sc, parent, out, &ref, why, sizeof why);
        if (st != NB_OK) {
            fails++;
            CHECK(st == NB_ERR_IO && strstr(msg, "injected failure") && oc == 0 && ran >= n,
                  "%s, failure at step %ld: %s (%s), outcome %d %s", sc->name, n, nb_status_name(st), msg, oc,
                  oc < 0 ? why : "");
            char *names[4];
            const size_t k = names_in(parent, names, 4);
            CHECK(k == (size_t)sc->out_exists, "%s, failure at step %ld: %zu entries left next to OUT (%s)", sc->name, n,
                  k, k ? names[0] : "");
            for (size_t i = 0; i < k; i++) free(names[i]);
        } else {
            CHECK(oc == 1, "%s, failure at step %ld after publishing: OUT not complete (%s)", sc->name, n, why);
        }
        rerun(sc, parent, out, &ref, oc == 1, n, "failure");
        /* kill: a child raises SIGKILL at step n */
        fresh_parent(sc, "kill", parent, out);
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            nbio_fault_arm(n, NBIO_FAULT_KILL);
            _exit(run_op(sc, out) == NB_OK ? 0 : 1);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "%s, kill at step %ld: the child was not killed (%d)",
              sc->name, n, status);
        const int ok = outcome(sc, parent, out, &ref, why, sizeof why);
        CHECK(ok >= 0, "%s, kill at step %ld: %s", sc->name, n, why);
        kills_nothing += ok == 0;
        kills_complete += ok == 1;
        rerun(sc, parent, out, &ref, ok == 1, n, "kill");
    }
    printf("%s: %ld steps; each failed (%d runs failed, the rest had published) and killed (%d left nothing, %d a "
           "complete OUT)\n", sc->name, steps, fails, kills_nothing, kills_complete);
    CHECK(kills_nothing > 0 && kills_complete > 0, "%s: kills before and after publishing", sc->name);
    list_free(&ref);
}

/* ------------------------------------------------------------ the sweep's limits */

#define MARKER "nibble staging directory v1\nout out\npid 1\n"

static void test_sweep_limits(void) {
    char parent[PARENT_MAX], out[OUT_MAX], p[PARENT_MAX + 64];
    const scenario sc = {"sweep", "bf16_one", 0, NB_FORMAT_NVFP4, 0, 0, 0};
    fresh_parent(&sc, "x", parent, out);
    /* what lies next to OUT (text NULL: a directory), and whether the run
     * must leave it: a running writer's (its marker held below), a marker
     * with other contents, a stale one whose directory holds a
     * subdirectory, a look-alike without a marker, another OUT's marker, an
     * empty marker next to a directory; and a killed run's, which goes */
    static const struct {
        const char *name, *text;
        int kept;
    } k[] = {
        {".out.nibble-staging-aaaaaa", NULL, 1},
        {".out.nibble-staging-aaaaaa/model.safetensors", "partial", 1},
        {".out.nibble-staging-aaaaaa.lock", MARKER, 1},
        {".out.nibble-staging-bbbbbb", NULL, 1},
        {".out.nibble-staging-bbbbbb.lock", "my notes\n", 1},
        {".out.nibble-staging-cccccc", NULL, 1},
        {".out.nibble-staging-cccccc/sub", NULL, 1},
        {".out.nibble-staging-cccccc.lock", MARKER, 1},
        {".out.nibble-staging-dddddd", NULL, 1},
        {".out.nibble-staging-eeeeee.lock", "nibble staging directory v1\nout other\npid 1\n", 1},
        {".out.nibble-staging-ffffff", NULL, 0},
        {".out.nibble-staging-ffffff/.model.safetensors.tmp.x", "partial", 0},
        {".out.nibble-staging-ffffff.lock", MARKER, 0},
        {".out.nibble-staging-gggggg.lock", "", 0}, /* killed before writing its marker */
        {".out.nibble-staging-hhhhhh", NULL, 1},    /* an empty marker does not vouch for a directory */
        {".out.nibble-staging-hhhhhh.lock", "", 1},
    };
    const size_t nk = sizeof k / sizeof k[0];
    for (size_t i = 0; i < nk; i++) {
        snprintf(p, sizeof p, "%s/%s", parent, k[i].name);
        FILE *f = k[i].text ? fopen(p, "wb") : NULL;
        if (f) {
            fputs(k[i].text, f);
            fclose(f);
        }
        CHECK(k[i].text ? f != NULL : mkdir(p, 0755) == 0, "create %s", p);
    }
    snprintf(p, sizeof p, "%s/%s", parent, k[2].name);
    const int held = open(p, O_RDONLY);
    CHECK(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0, "hold a marker");
    const nb_status st = run_op(&sc, out);
    CHECK(st == NB_OK, "run next to foreign staging directories: %s (%s)", nb_status_name(st), nb_last_error());
    for (size_t i = 0; i < nk; i++) {
        snprintf(p, sizeof p, "%s/%s", parent, k[i].name);
        CHECK((access(p, F_OK) == 0) == k[i].kept, "%s was %s", k[i].name, k[i].kept ? "removed" : "left");
    }
    if (held >= 0) close(held);
}

int main(int argc, char **argv) {
    if (argc > 2) {
        printf("usage: test_ckpt_crash [DIR]\n");
        return 2;
    }
    char *keep_argv[3] = {argv[0], "--keep", argc == 2 ? argv[1] : NULL};
    int keep = fixture_dir_open(argc == 2 ? 3 : 1, keep_argv, "nb_ckpt_crash");
    if (keep < 0) return 2;
    write_bf16("bf16", 1);
    write_bf16("bf16_one", 0);
    write_gguf("mx.gguf");
    char in[1024], out[1024];
    snprintf(in, sizeof in, "%s/bf16", g_dir);
    snprintf(out, sizeof out, "%s/nvfp4", g_dir);
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.device = NB_CKPT_DEVICE_CPU;
    CHECK(nb_ckpt_quantize(in, out, &o, NULL) == NB_OK, "quantize the convert input: %s", nb_last_error());
    static const scenario k[] = {
        {"quantize_sharded", "bf16", 0, NB_FORMAT_NVFP4, 0, 0, 0},
        {"quantize_into_empty", "bf16", 0, NB_FORMAT_NVFP4, 0, 1, 0},
        {"quantize_single", "bf16_one", 0, NB_FORMAT_MXFP4, 0, 0, 0},
        {"convert_sharded", "nvfp4", 1, 0, NB_CKPT_TARGET_CT, 0, 0},
        {"convert_gguf", "mx.gguf", 1, 0, NB_CKPT_TARGET_QUARK, 0, 0},
        {"quantize_int4_sharded", "bf16", 0, NB_FORMAT_INT4, 0, 0, 32},
        {"quantize_int4_sym_into_empty", "bf16_one", 0, NB_FORMAT_INT4_SYM, 0, 1, NB_CKPT_GROUP_PER_CHANNEL},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) run_scenario(&k[i]);
    test_sweep_limits();
    return fixture_dir_close(keep);
}
