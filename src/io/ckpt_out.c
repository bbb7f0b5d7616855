/* ckpt_out.c - writing a checkpoint directory (declarations and rules in
 * io_internal.h), shared by the quantizer and the converter.
 *
 * MEMORY: nb_st_write needs every tensor of a file in memory at once.  A
 * shard written here needs none: its header is derived from shapes alone, so
 * every offset is known before the first byte of data, and the caller
 * streams tensors into place with pwrite while the source mapping's pages
 * are dropped after use.  The result is byte-identical to nb_st_write's for
 * the same tensors and metadata.
 */
#define _DEFAULT_SOURCE /* madvise(MADV_DONTNEED), flock, fsync, realpath */
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define COPY_CHUNK (16u << 20) /* bytes per pwrite of a copied tensor (pages dropped after each) */

static nb_status pwrite_all(int fd, const void *p, size_t n, uint64_t off) {
    const char *c = (const char *)p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return NB_ERR_IO;
        }
        c += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return NB_OK;
}

void nbio_drop_pages(const void *p, size_t n) {
    if (!n) return;
    uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    uintptr_t lo = a & ~(ps - 1), hi = (a + n + ps - 1) & ~(ps - 1);
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ------------------------------------------------------------ JSON files */

/* All n bytes of fd into buf (a short read is an error: the file shrank). */
static int read_all(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        const ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* The number nodes of j in document order (cJSON keeps members and elements
 * in the order parsed); *n counts them, nodes up to cap are stored. */
static void number_nodes(cJSON *j, cJSON **nodes, size_t cap, size_t *n) {
    for (; j; j = j->next) {
        if (cJSON_IsNumber(j)) {
            if (*n < cap) nodes[*n] = j;
            (*n)++;
        }
        if (j->child) number_nodes(j->child, nodes, cap, n);
    }
}

/* Every number of j becomes a raw node holding its text in `text` (the
 * document j was parsed from), so that a rewritten file keeps each number as
 * it was written: cJSON stores a double and prints 7.0 as 7, which typed
 * readers (transformers' config classes) then refuse as an int.  The number
 * tokens are found by scanning the text outside strings; when their count
 * differs from the tree's numbers (it cannot for text cJSON parsed), j is
 * left as it is.  NB_OK, or out of memory. */
static nb_status keep_number_text(cJSON *j, const char *text, size_t len) {
    size_t count = 0;
    number_nodes(j, NULL, 0, &count);
    if (!count) return NB_OK;
    cJSON **nodes = (cJSON **)malloc(count * sizeof *nodes);
    if (!nodes) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    size_t n = 0;
    number_nodes(j, nodes, count, &n);
    size_t *at = (size_t *)malloc(2 * count * sizeof *at), tokens = 0;
    if (!at) {
        free(nodes);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < len && tokens <= count; i++) {
        const char c = text[i];
        if (c == '"') { /* a string (key or value): skip it, escapes included */
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\') i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t e = i;
            while (e < len && strchr("+-0123456789.eE", text[e]) && text[e]) e++;
            if (tokens < count) at[2 * tokens] = i, at[2 * tokens + 1] = e - i;
            tokens++;
            i = e - 1;
        }
    }
    nb_status st = NB_OK;
    for (size_t t = 0; tokens == count && t < count && st == NB_OK; t++) {
        char *raw = (char *)malloc(at[2 * t + 1] + 1);
        if (!raw) {
            st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        memcpy(raw, text + at[2 * t], at[2 * t + 1]);
        raw[at[2 * t + 1]] = 0;
        nodes[t]->type = cJSON_Raw | (nodes[t]->type & cJSON_StringIsConst);
        nodes[t]->valuestring = raw;
    }
    free(at);
    free(nodes);
    return st;
}

static nb_status read_json(const char *dir, const char *name, size_t max, int keep_numbers, cJSON **out);

nb_status nbio_read_json(const char *dir, const char *name, size_t max, cJSON **out) {
    return read_json(dir, name, max, 0, out);
}

nb_status nbio_read_config(const char *dir, const char *name, size_t max, cJSON **out) {
    return read_json(dir, name, max, 1, out);
}

static nb_status read_json(const char *dir, const char *name, size_t max, int keep_numbers, cJSON **out) {
    *out = NULL;
    char *path = nbio_join(dir, name);
    if (!path) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    struct stat sb;
    if (lstat(path, &sb) != 0 && errno == ENOENT) { /* (a dangling link is reported below) */
        free(path);
        return NB_OK;
    }
    int fd = -1;
    uint64_t size = 0;
    char *buf = NULL;
    nb_status st = nbio_open_regular(path, &fd, &size);
    if (st == NB_OK && size > max)
        st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %llu bytes, over the %zu-byte limit for a config file", path,
                      (unsigned long long)size, max);
    if (st == NB_OK && !(buf = (char *)malloc((size_t)size + 1)))
        st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (st == NB_OK && read_all(fd, buf, (size_t)size))
        st = nbi_fail(NULL, NB_ERR_IO, "%s: short read", path);
    if (st == NB_OK) {
        buf[size] = 0;
        st = nbio_parse_json(path, buf, (size_t)size, out);
        if (st == NB_OK && keep_numbers && (st = keep_number_text(*out, buf, (size_t)size)) != NB_OK) {
            cJSON_Delete(*out);
            *out = NULL;
        }
    }
    if (fd >= 0) close(fd);
    free(buf);
    free(path);
    return st;
}

nb_status nbio_parse_json(const char *label, const char *text, size_t n, cJSON **out) {
    *out = NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: not a JSON object (parse error near byte %lld)", label,
                        end && j == NULL ? (long long)(end - text) : 0LL);
    }
    *out = j;
    return NB_OK;
}

/* ------------------------------------------------------------ fault injection */

static _Thread_local long g_fault_at, g_fault_steps;
static _Thread_local int g_fault_mode;

void nbio_fault_arm(long n, int mode) {
    g_fault_at = n;
    g_fault_mode = n > 0 ? mode : 0;
    g_fault_steps = 0;
}

long nbio_fault_steps(void) { return g_fault_steps; }

nb_status nbio_fault_step(const char *what, const char *path) {
    if (++g_fault_steps != g_fault_at || !g_fault_mode) return NB_OK;
    if (g_fault_mode == NBIO_FAULT_KILL) raise(SIGKILL);
    return nbi_fail(NULL, NB_ERR_IO, "%s: %s: injected failure at step %ld", path, what, g_fault_steps);
}

/* ------------------------------------------------------------ staging directory */

#define STAGE_TAG ".nibble-staging-"
#define LOCK_MAGIC "nibble staging directory v1\nout "
#define STAGE_BASE_MAX 180 /* bytes of OUT's name in the staging names (these stay under NAME_MAX) */

static nb_status oom(void) { return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory"); }

/* fsync a directory (its entries: a created or renamed file survives a crash). */
static int fsync_dir(const char *path) {
    const int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    const int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Remove directory `path` when it holds nothing but regular files (all a
 * staging directory ever holds; anything else means it is not one): 0 when
 * it is gone. */
static int remove_stage_dir(const char *path) {
    const int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0) close(dfd);
        return errno == ENOENT ? 0 : -1;
    }
    int ok = 1;
    struct dirent *e;
    for (int pass = 0; pass < 2 && ok; pass++) { /* check everything, then remove */
        rewinddir(d);
        while (ok && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            struct stat sb;
            if (pass == 0) ok = fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode);
            else ok = unlinkat(dirfd(d), e->d_name, 0) == 0 || errno == ENOENT;
        }
    }
    closedir(d);
    return ok && (rmdir(path) == 0 || errno == ENOENT) ? 0 : -1;
}

/* The contents a marker of OUT named `base` starts with (malloc'ed). */
static char *lock_magic(const char *base) { return nbio_concat(LOCK_MAGIC, base); }

/* A staging directory of OUT left by a run that no longer holds its marker
 * (killed): marker `name` in parent, checked and removed with its
 * directory.  Markers of running writers, and anything that is not exactly
 * what a writer leaves, are left alone. */
static void sweep_one(const char *parent, const char *name, const char *base) {
    char *lock = nbio_join(parent, name), *magic = lock_magic(base);
    const int fd = lock ? open(lock, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    struct stat sb;
    char buf[4096 + 1];
    ssize_t n = -1;
    if (fd >= 0 && magic && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size < (off_t)sizeof buf - 1)
        n = pread(fd, buf, sizeof buf - 1, 0);
    const size_t ml = magic ? strlen(magic) : 0;
    /* an empty marker is one killed before it was written, and then before
     * its directory was created: it goes only when there is no directory */
    const int ours = (n > (ssize_t)ml && !memcmp(buf, magic, ml) && buf[ml] == '\n') || n == 0;
    if (ours && flock(fd, LOCK_EX | LOCK_NB) == 0) {
        lock[strlen(lock) - 5] = 0; /* the directory: the marker without ".lock" */
        struct stat ds;
        const int gone = n == 0 ? lstat(lock, &ds) != 0 && errno == ENOENT : remove_stage_dir(lock) == 0;
        lock[strlen(lock)] = '.';
        if (gone) unlink(lock);
    }
    if (fd >= 0) close(fd); /* (releases the lock) */
    free(lock);
    free(magic);
}

/* 1 when `name` is a marker of OUT's staging: ".<tb>" STAGE_TAG "XXXXXX.lock". */
static int is_marker(const char *name, const char *tb, size_t tbl) {
    const size_t tl = sizeof STAGE_TAG - 1;
    if (name[0] != '.' || strncmp(name + 1, tb, tbl) || strncmp(name + 1 + tbl, STAGE_TAG, tl)) return 0;
    const char *x = name + 1 + tbl + tl;
    for (int i = 0; i < 6; i++)
        if (!((x[i] >= 'a' && x[i] <= 'z') || (x[i] >= '0' && x[i] <= '9'))) return 0;
    return !strcmp(x + 6, ".lock");
}

static void sweep_stale(const char *parent, const char *base) {
    DIR *d = opendir(parent);
    if (!d) return; /* creating the staging directory reports it */
    const size_t tbl = strlen(base) < STAGE_BASE_MAX ? strlen(base) : STAGE_BASE_MAX;
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (is_marker(e->d_name, base, tbl) && !nbio_push_str(&names, &n, nbio_strdup(e->d_name))) break;
    closedir(d);
    for (size_t i = 0; i < n; i++) sweep_one(parent, names[i], base);
    nbio_free_strs(names, n);
}

/* OUT's directory and name (trailing slashes dropped; a symbolic link to a
 * directory is followed), and whether it exists (it must be empty). */
static nb_status resolve_out(nbio_out *o, const char *out) {
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') len--;
    char *path = (char *)malloc(len + 1);
    if (!path) return oom();
    memcpy(path, out, len);
    path[len] = 0;
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real) {
            nb_status st = nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s is a symbolic link to nothing usable: %s",
                                    path, strerror(errno));
            free(path);
            return st;
        }
        free(path);
        path = real;
    }
    o->final = path;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    o->base = nbio_strdup(base);
    o->parent = !slash ? nbio_strdup(".") : slash == path ? nbio_strdup("/") : NULL;
    if (slash && slash != path && (o->parent = (char *)malloc((size_t)(slash - path) + 1))) {
        memcpy(o->parent, path, (size_t)(slash - path));
        o->parent[slash - path] = 0;
    }
    if (!o->base || !o->parent) return oom();
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, ".."))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: name the output directory itself (not /, . or ..)", out);
    if (stat(path, &sb) != 0) {
        if (errno != ENOENT) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", path, strerror(errno));
        return NB_OK;
    }
    if (!S_ISDIR(sb.st_mode))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s exists and is not a directory", path);
    DIR *d = opendir(path);
    if (!d) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", path, strerror(errno));
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    if (!empty)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT,
                        "%s is not empty (the output must be a new or empty directory)", path);
    o->replace = 1;
    o->out_mode = (unsigned)(sb.st_mode & 07777);
    return NB_OK;
}

/* The marker (created exclusively, locked, holding LOCK_MAGIC), then the
 * staging directory: a run killed between the two leaves a marker that the
 * next run removes. */
static nb_status make_stage(nbio_out *o) {
    const size_t tbl = strlen(o->base) < STAGE_BASE_MAX ? strlen(o->base) : STAGE_BASE_MAX;
    const size_t cap = strlen(o->parent) + tbl + 64;
    char *magic = lock_magic(o->base);
    o->lock = (char *)malloc(cap);
    if (!o->lock || !magic) {
        free(magic);
        return oom();
    }
    static const char k36[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t x = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)o ^ (uint64_t)time(NULL) << 20;
    nb_status st = nbio_fault_step("create the staging marker", o->parent);
    for (int attempt = 0; st == NB_OK && o->lock_fd < 0; attempt++) {
        char sfx[7];
        x = x * 6364136223846793005ull + 1442695040888963407ull + (uint64_t)attempt;
        for (int i = 0; i < 6; i++) sfx[i] = k36[(x >> (10 + 6 * i)) % 36];
        sfx[6] = 0;
        snprintf(o->lock, cap, "%s/.%.*s" STAGE_TAG "%s.lock", o->parent, (int)tbl, o->base, sfx);
        o->lock_fd = open(o->lock, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (o->lock_fd < 0 && (errno != EEXIST || attempt == 99))
            st = nbi_fail(NULL, NB_ERR_IO, "cannot create a staging directory next to %s (%s): %s", o->final,
                          o->parent, strerror(errno));
    }
    char line[64];
    snprintf(line, sizeof line, "\npid %ld\n", (long)getpid());
    if (st == NB_OK && flock(o->lock_fd, LOCK_EX | LOCK_NB) != 0)
        st = nbi_fail(NULL, NB_ERR_IO, "%s: flock: %s", o->lock, strerror(errno));
    if (st == NB_OK) st = nbio_fault_step("write the staging marker", o->lock);
    if (st == NB_OK && (pwrite_all(o->lock_fd, magic, strlen(magic), 0) != NB_OK ||
                        pwrite_all(o->lock_fd, line, strlen(line), strlen(magic)) != NB_OK))
        st = nbi_fail(NULL, NB_ERR_IO, "%s: write: %s", o->lock, strerror(errno));
    free(magic);
    if (st == NB_OK && !(o->stage = nbio_strdup(o->lock))) st = oom();
    if (st == NB_OK) {
        o->stage[strlen(o->stage) - 5] = 0;
        st = nbio_fault_step("create the staging directory", o->stage);
    }
    if (st == NB_OK && mkdir(o->stage, 0755) != 0) {
        st = nbi_fail(NULL, NB_ERR_IO, "cannot create %s: %s", o->stage, strerror(errno));
        free(o->stage);
        o->stage = NULL;
    }
    o->dir = o->stage;
    return st;
}

nb_status nbio_out_open(nbio_out *o, const char *out) {
    memset(o, 0, sizeof *o);
    o->lock_fd = -1;
    nb_status st = resolve_out(o, out);
    if (st == NB_OK) {
        sweep_stale(o->parent, o->base);
        st = make_stage(o);
    }
    if (st != NB_OK) nbio_out_finish(o, st);
    return st;
}

/* Publish the finished staging directory as OUT: its files and entries
 * synced, one rename (over an empty OUT, whose permission bits it takes),
 * then the parent synced.  Nothing after the rename can fail the run. */
static nb_status publish(nbio_out *o) {
    nb_status st = nbio_fault_step("sync the staging directory", o->stage);
    if (st == NB_OK && fsync_dir(o->stage) != 0)
        st = nbi_fail(NULL, NB_ERR_IO, "%s: fsync: %s", o->stage, strerror(errno));
    if (st == NB_OK && o->replace && (st = nbio_fault_step("set the permissions", o->stage)) == NB_OK &&
        chmod(o->stage, (mode_t)o->out_mode) != 0)
        st = nbi_fail(NULL, NB_ERR_IO, "%s: chmod: %s", o->stage, strerror(errno));
    if (st == NB_OK) st = nbio_fault_step("publish (rename)", o->final);
    if (st == NB_OK && rename(o->stage, o->final) != 0) {
        const int e = errno;
        st = nbi_fail(NULL, e == ENOTEMPTY || e == EEXIST ? NB_ERR_INVALID_ARGUMENT : NB_ERR_IO,
                      "cannot publish %s: %s%s", o->final, strerror(e),
                      e == ENOTEMPTY || e == EEXIST ? " (something was written into it meanwhile)"
                      : e == EBUSY || e == EXDEV    ? " (a mount point: name a new directory inside it)"
                                                    : "");
    }
    if (st != NB_OK) return st;
    free(o->stage);
    o->stage = NULL;
    if (nbio_fault_step("sync the parent directory", o->parent) == NB_OK) (void)fsync_dir(o->parent);
    return NB_OK;
}

nb_status nbio_out_finish(nbio_out *o, nb_status st) {
    if (st == NB_OK && o->stage) st = publish(o);
    /* a failed run leaves no staging directory (unless something else wrote
     * into it: then the next run's sweep leaves it too, with its marker) */
    const int gone = !o->stage || remove_stage_dir(o->stage) == 0;
    if (o->lock && gone && nbio_fault_step("remove the staging marker", o->lock) == NB_OK) unlink(o->lock);
    if (o->lock_fd >= 0) close(o->lock_fd);
    free(o->final);
    free(o->parent);
    free(o->base);
    free(o->stage);
    free(o->lock);
    nbio_free_strs(o->wm_name, o->nwm);
    nbio_free_strs(o->wm_shard, o->nwm);
    memset(o, 0, sizeof *o);
    o->lock_fd = -1;
    return st;
}

/* Create <staging>/name exclusively; *fd_out open for writing. */
static nb_status create_file(nbio_out *o, const char *name, int *fd_out, char **path_out) {
    char *path = nbio_join(o->dir, name);
    if (!path) return oom();
    nb_status st = nbio_fault_step("create", path);
    const int fd = st == NB_OK ? open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644) : -1;
    if (st == NB_OK && fd < 0) st = nbi_fail(NULL, NB_ERR_IO, "%s: %s", path, strerror(errno));
    if (st != NB_OK) {
        free(path);
        return st;
    }
    *fd_out = fd;
    *path_out = path;
    return NB_OK;
}

/* fsync and close fd (a file of the output), whatever st is; st, or the
 * failure. */
static nb_status sync_close(int fd, const char *path, nb_status st) {
    if (st == NB_OK) st = nbio_fault_step("fsync", path);
    if (st == NB_OK && fsync(fd) != 0) st = nbi_fail(NULL, NB_ERR_IO, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) != 0 && st == NB_OK) st = nbi_fail(NULL, NB_ERR_IO, "%s: close: %s", path, strerror(errno));
    return st;
}

/* n bytes of p at byte off of an output file. */
static nb_status write_at(int fd, const char *path, const void *p, size_t n, uint64_t off) {
    nb_status st = nbio_fault_step("write", path);
    if (st == NB_OK && pwrite_all(fd, p, n, off) != NB_OK)
        st = nbi_fail(NULL, NB_ERR_IO, "%s: write: %s", path, strerror(errno));
    return st;
}

static nb_status write_file(nbio_out *o, const char *name, const char *data, size_t n) {
    int fd;
    char *path;
    nb_status st = create_file(o, name, &fd, &path);
    if (st != NB_OK) return st;
    st = sync_close(fd, path, write_at(fd, path, data, n, 0));
    free(path);
    return st;
}

nb_status nbio_out_write_json(nbio_out *o, const char *name, const cJSON *j) {
    char *s = j ? cJSON_Print(j) : NULL;
    if (!s) return oom();
    size_t n = strlen(s);
    char *t = (char *)realloc(s, n + 2);
    if (!t) {
        free(s);
        return oom();
    }
    t[n] = '\n';
    t[n + 1] = 0;
    nb_status st = write_file(o, name, t, n + 1);
    free(t);
    return st;
}

/* Byte-for-byte copy of src into <staging>/name. */
static nb_status copy_file(nbio_out *o, const char *src, const char *name) {
    int in = -1, fd = -1;
    nb_status st = nbio_open_regular(src, &in, NULL);
    if (st != NB_OK) return st;
    char *buf = (char *)malloc(1u << 20), *path = NULL;
    st = buf ? create_file(o, name, &fd, &path) : oom();
    uint64_t off = 0;
    while (st == NB_OK) {
        ssize_t r = read(in, buf, 1u << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = nbi_fail(NULL, NB_ERR_IO, "%s: read: %s", src, strerror(errno));
        if (r <= 0) break;
        st = write_at(fd, path, buf, (size_t)r, off);
        off += (uint64_t)r;
    }
    if (fd >= 0) st = sync_close(fd, path, st);
    close(in);
    free(buf);
    free(path);
    return st;
}

nb_status nbio_out_copy_others(nbio_out *o, const char *src_dir, const char *const *skip, size_t nskip) {
    DIR *d = opendir(src_dir);
    if (!d) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", src_dir, strerror(errno));
    nb_status st = NB_OK;
    struct dirent *e;
    while (st == NB_OK && (e = readdir(d))) {
        const char *n = e->d_name;
        /* (a staging marker: OUT inside the input's directory) */
        int skipped = !strcmp(n, ".") || !strcmp(n, "..") || nbio_ends_with(n, ".safetensors") ||
                      nbio_ends_with(n, ".safetensors.index.json") ||
                      (strstr(n, STAGE_TAG) && nbio_ends_with(n, ".lock"));
        for (size_t i = 0; i < nskip && !skipped; i++) skipped = !strcmp(n, skip[i]);
        if (skipped) continue;
        char *src = nbio_join(src_dir, n);
        struct stat sb;
        if (!src) st = oom();
        else if (stat(src, &sb) == 0 && S_ISREG(sb.st_mode)) { /* (FIFOs, sockets, devices are not copied) */
            st = copy_file(o, src, n);
            if (st == NB_OK) o->files_copied++;
        }
        free(src);
    }
    closedir(d);
    return st;
}

typedef struct wpair {
    const char *name, *shard;
} wpair;
static int cmp_pair(const void *a, const void *b) {
    return strcmp(((const wpair *)a)->name, ((const wpair *)b)->name);
}

nb_status nbio_out_write_index(nbio_out *o, const char *name) {
    size_t n = o->nwm;
    wpair *p = (wpair *)malloc((n ? n : 1) * sizeof *p);
    if (!p) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++) {
        p[i].name = o->wm_name[i];
        p[i].shard = o->wm_shard[i];
    }
    qsort(p, n, sizeof *p, cmp_pair);
    cJSON *j = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(j, "metadata");
    cJSON_AddNumberToObject(md, "total_size", (double)o->data_bytes);
    cJSON *wm = cJSON_AddObjectToObject(j, "weight_map");
    for (size_t i = 0; i < n; i++) cJSON_AddStringToObject(wm, p[i].name, p[i].shard);
    free(p);
    nb_status st = nbio_out_write_json(o, name, j);
    cJSON_Delete(j);
    return st;
}

/* ------------------------------------------------------------ shards */

/* growable string */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = (char *)realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof tmp) sb_put(b, tmp, (size_t)n);
    else b->oom = 1; /* only used for short numeric pieces */
}

/* A JSON string: names and metadata come from a validated reader or from
 * the caller's ASCII, so only quotes, backslashes and control characters
 * need escaping. */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(b, e, 2);
        } else if (*c < 0x20) {
            sb_printf(b, "\\u%04x", *c);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_oent(const void *a, const void *b) {
    const nbio_oent *x = (const nbio_oent *)a, *y = (const nbio_oent *)b;
    if (x->bits != y->bits) return x->bits > y->bits ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void nbio_oent_like(nbio_oent *e, char *name, const nb_st_tensor *t, size_t src, int role) {
    e->name = name;
    e->dtype = t->dtype;
    e->rank = t->rank;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->bytes = t->bytes;
    e->src = src;
    e->role = role;
}

void nbio_oents_free(nbio_oent *ents, size_t ne) {
    if (!ents) return;
    for (size_t i = 0; i < ne; i++) free(ents[i].name);
    free(ents);
}

/* Stage 1 of nbio_shard_begin: bits per element, no name twice, file order
 * and offsets; the data size. */
static nb_status shard_layout(const char *name, nbio_oent *ents, size_t ne, uint64_t *data_bytes) {
    for (size_t i = 0; i < ne; i++)
        if (nb_st_dtype_info(ents[i].dtype, NULL, &ents[i].bits) != NB_OK)
            return nbi_fail(NULL, NB_ERR_INTERNAL, "%s: tensor \"%.200s\": %s", name, ents[i].name, nb_last_error());
    const char **names = (const char **)malloc((ne ? ne : 1) * sizeof *names);
    if (!names) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < ne; i++) names[i] = ents[i].name;
    qsort(names, ne, sizeof *names, cmp_name);
    for (size_t i = 1; i < ne; i++)
        if (!strcmp(names[i - 1], names[i])) {
            nb_status st = nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%.200s\" would be written twice",
                                    name, names[i]);
            free(names);
            return st;
        }
    free(names);
    qsort(ents, ne, sizeof *ents, cmp_oent);
    uint64_t off = 0;
    for (size_t i = 0; i < ne; i++) {
        ents[i].off = off;
        off += ents[i].bytes;
    }
    *data_bytes = off;
    return NB_OK;
}

/* Stage 2: the header text - the source's metadata ("format" added when
 * absent), then the tensors in data order, space-padded to 8 bytes. */
static nb_status shard_header(const char *name, const nb_st_file *meta_src, const nbio_oent *ents, size_t ne,
                              sbuf *h) {
    size_t nm = 0;
    int has_format = 0;
    nb_status st = meta_src ? nb_st_metadata_count(meta_src, &nm) : NB_OK;
    for (size_t i = 0; i < nm && !has_format && st == NB_OK; i++) {
        const char *key = "";
        st = nb_st_metadata_at(meta_src, i, &key, NULL);
        has_format = !strcmp(key, "format");
    }
    if (st != NB_OK) return st;
    sb_put(h, "{\"__metadata__\":{", 17);
    if (!has_format) sb_put(h, "\"format\":\"pt\"", 13);
    for (size_t i = 0; i < nm; i++) {
        const char *key, *val;
        if ((st = nb_st_metadata_at(meta_src, i, &key, &val)) != NB_OK) return st;
        if (i || !has_format) sb_put(h, ",", 1);
        sb_json_str(h, key);
        sb_put(h, ":", 1);
        sb_json_str(h, val);
    }
    sb_put(h, "}", 1);
    for (size_t i = 0; i < ne; i++) {
        const char *dn = "U8";
        nb_st_dtype_info(ents[i].dtype, &dn, NULL); /* checked by shard_layout */
        sb_put(h, ",", 1);
        sb_json_str(h, ents[i].name);
        sb_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", dn);
        for (int d = 0; d < ents[i].rank; d++) sb_printf(h, d ? ",%lld" : "%lld", (long long)ents[i].shape[d]);
        sb_printf(h, "],\"data_offsets\":[%llu,", (unsigned long long)ents[i].off);
        sb_printf(h, "%llu]}", (unsigned long long)(ents[i].off + ents[i].bytes));
    }
    sb_put(h, "}", 1);
    while (!h->oom && h->n % 8) sb_put(h, " ", 1);
    if (h->oom) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    if (h->n > NB_ST_MAX_HEADER)
        return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: header of %zu bytes is over the limit", name, h->n);
    return NB_OK;
}

/* Stage 3: the file, holding the header and sized for the data. */
static nb_status shard_create(nbio_out *o, nbio_shard *s, const sbuf *h) {
    nb_status st = create_file(o, s->name, &s->fd, &s->path);
    if (st != NB_OK) return st;
    (void)fchmod(s->fd, 0644); /* as nb_st_write (whatever the umask) */
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h->n >> (8 * i));
    s->base = 8 + (uint64_t)h->n;
    if ((st = write_at(s->fd, s->path, len8, 8, 0)) != NB_OK || (st = write_at(s->fd, s->path, h->p, h->n, 8)) != NB_OK)
        return st;
    if ((st = nbio_fault_step("size", s->path)) == NB_OK && ftruncate(s->fd, (off_t)(s->base + s->data_bytes)))
        st = nbi_fail(NULL, NB_ERR_IO, "%s: ftruncate: %s", s->path, strerror(errno));
    return st;
}

nb_status nbio_shard_begin(nbio_out *o, nbio_shard *s, const char *name, const nb_st_file *meta_src, nbio_oent *ents,
                           size_t ne) {
    memset(s, 0, sizeof *s);
    s->o = o;
    s->name = name;
    s->fd = -1;
    sbuf h = {0};
    nb_status st = shard_layout(name, ents, ne, &s->data_bytes);
    if (st == NB_OK) st = shard_header(name, meta_src, ents, ne, &h);
    if (st == NB_OK) st = shard_create(o, s, &h);
    free(h.p);
    if (st != NB_OK) nbio_shard_end(s);
    return st;
}

nb_status nbio_shard_write(nbio_shard *s, const nbio_oent *e, const void *p, size_t n, uint64_t at) {
    if (at > e->bytes || n > e->bytes - at)
        return nbi_fail(NULL, NB_ERR_INTERNAL, "%s: %zu bytes at %llu overflow tensor %s", s->name,
                        n, (unsigned long long)at, e->name);
    return write_at(s->fd, s->path, p, n, s->base + e->off + at);
}

nb_status nbio_shard_copy(nbio_shard *s, const nbio_oent *e, const void *src) {
    const char *p = (const char *)src;
    for (uint64_t done = 0; done < e->bytes;) {
        size_t n = e->bytes - done > COPY_CHUNK ? COPY_CHUNK : (size_t)(e->bytes - done);
        nb_status st = nbio_shard_write(s, e, p + done, n, done);
        if (st != NB_OK) return st;
        nbio_drop_pages(p + done, n);
        done += n;
    }
    return NB_OK;
}

nb_status nbio_shard_commit(nbio_shard *s, const nbio_oent *ents, size_t ne) {
    nbio_out *o = s->o;
    nb_status st = sync_close(s->fd, s->path, NB_OK);
    s->fd = -1;
    if (st != NB_OK) return st;
    o->shards++;
    o->file_bytes += s->base + s->data_bytes;
    o->data_bytes += s->data_bytes;
    for (size_t i = 0; i < ne; i++) {
        char *a = nbio_strdup(ents[i].name), *b = nbio_strdup(s->name);
        if (!nbio_push_str(&o->wm_name, &o->nwm, a) || !b) {
            free(b);
            return oom();
        }
        char **sh = (char **)realloc(o->wm_shard, o->nwm * sizeof *sh);
        if (!sh) {
            free(b);
            o->nwm--;
            free(o->wm_name[o->nwm]);
            return oom();
        }
        o->wm_shard = sh;
        sh[o->nwm - 1] = b;
    }
    return NB_OK;
}

void nbio_shard_end(nbio_shard *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    free(s->path);
    s->path = NULL;
}

/* ------------------------------------------------------------ configs */

static cJSON *str_array(const char *const *a, size_t n) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(a[i]));
    return arr;
}

static void add_producer(cJSON *o) {
    cJSON *prod = cJSON_AddObjectToObject(o, "producer");
    cJSON_AddStringToObject(prod, "name", "nibble");
    cJSON_AddStringToObject(prod, "version", nb_version_string());
}

cJSON *nbio_hf_quant_config(const char *const *excl, size_t n, const char *kv_cache_algo) {
    cJSON *h = cJSON_CreateObject();
    add_producer(h);
    cJSON *qz = cJSON_AddObjectToObject(h, "quantization");
    cJSON_AddStringToObject(qz, "quant_algo", "NVFP4");
    if (kv_cache_algo) cJSON_AddStringToObject(qz, "kv_cache_quant_algo", kv_cache_algo);
    else cJSON_AddNullToObject(qz, "kv_cache_quant_algo");
    cJSON_AddNumberToObject(qz, "group_size", 16);
    cJSON_AddItemToObject(qz, "exclude_modules", str_array(excl, n));
    return h;
}

static cJSON *weights_nvfp4(void) {
    cJSON *w = cJSON_CreateObject();
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "type", "float");
    cJSON_AddNumberToObject(w, "group_size", 16);
    cJSON_AddBoolToObject(w, "dynamic", 0);
    return w;
}

cJSON *nbio_qc_modelopt(const char *const *excl, size_t n) {
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "modelopt");
    cJSON_AddStringToObject(qc, "quant_algo", "NVFP4");
    add_producer(qc);
    cJSON_AddItemToObject(qc, "ignore", str_array(excl, n));
    cJSON_AddNullToObject(qc, "kv_cache_scheme");
    cJSON *g0 = cJSON_AddObjectToObject(cJSON_AddObjectToObject(qc, "config_groups"), "group_0");
    cJSON_AddItemToObject(g0, "weights", weights_nvfp4());
    cJSON_AddItemToObject(g0, "input_activations", weights_nvfp4());
    cJSON *targets = cJSON_AddArrayToObject(g0, "targets");
    cJSON_AddItemToArray(targets, cJSON_CreateString("Linear"));
    return qc;
}

static cJSON *quark_tensor(const char *mode, int dynamic) {
    cJSON *w = cJSON_CreateObject();
    cJSON_AddStringToObject(w, "dtype", "fp4");
    cJSON_AddStringToObject(w, "qscheme", "per_group");
    cJSON_AddNumberToObject(w, "group_size", 32);
    cJSON_AddNumberToObject(w, "ch_axis", -1);
    cJSON_AddStringToObject(w, "scale_format", "e8m0");
    cJSON_AddStringToObject(w, "scale_calculation_mode", mode);
    cJSON_AddStringToObject(w, "round_method", "half_even");
    cJSON_AddBoolToObject(w, "is_dynamic", dynamic);
    cJSON_AddStringToObject(w, "observer_cls", "PerBlockMXObserver");
    cJSON_AddStringToObject(w, "scale_type", "float");
    return w;
}

cJSON *nbio_qc_quark(const char *mode, const char *const *excl, size_t n) {
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "quark");
    cJSON *g = cJSON_AddObjectToObject(qc, "global_quant_config");
    cJSON_AddItemToObject(g, "weight", quark_tensor(mode, 0));
    cJSON_AddItemToObject(g, "input_tensors", quark_tensor(mode, 1));
    cJSON_AddNullToObject(g, "output_tensors");
    cJSON_AddNullToObject(g, "bias");
    cJSON_AddItemToObject(qc, "exclude", str_array(excl, n));
    cJSON *ex = cJSON_AddObjectToObject(qc, "export");
    cJSON_AddStringToObject(ex, "weight_format", "real_quantized");
    cJSON_AddStringToObject(ex, "pack_method", "reorder");
    cJSON_AddArrayToObject(ex, "kv_cache_group");
    cJSON_AddObjectToObject(qc, "layer_quant_config");
    add_producer(qc);
    return qc;
}

/* compressed-tensors QuantizationArgs (quant_scheme.py presets NVFP4,
 * NVFP4A16, MXFP4) of weight format fi: a format with a tensor scale is the
 * "tensor_group" strategy (NVFP4's global scale), dynamic activations
 * "local"; the scale dtype follows the scale type. */
static cJSON *ct_args(const nb_format_info *fi, int dynamic) {
    cJSON *w = cJSON_CreateObject();
    cJSON_AddNumberToObject(w, "num_bits", fi->element_bits);
    cJSON_AddStringToObject(w, "type", "float");
    cJSON_AddStringToObject(w, "strategy", fi->tensor_scale ? "tensor_group" : "group");
    cJSON_AddNumberToObject(w, "group_size", fi->group_size);
    cJSON_AddBoolToObject(w, "symmetric", 1);
    if (dynamic && fi->tensor_scale) cJSON_AddStringToObject(w, "dynamic", "local");
    else cJSON_AddBoolToObject(w, "dynamic", dynamic);
    cJSON_AddStringToObject(w, "scale_dtype", fi->scale_type == NB_SCALE_E4M3 ? "float8_e4m3fn" : "uint8");
    return w;
}

cJSON *nbio_qc_ct(nb_format f, int input_acts, const char *const *ignore, size_t n) {
    nb_format_info fi;
    if (nb_format_get_info(f, &fi) != NB_OK) return NULL; /* the caller names only formats of the table */
    char format[48];
    snprintf(format, sizeof format, "%s-pack-quantized", fi.name);
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(qc, "format", format);
    cJSON_AddStringToObject(qc, "quantization_status", "compressed");
    cJSON *g0 = cJSON_AddObjectToObject(cJSON_AddObjectToObject(qc, "config_groups"), "group_0");
    cJSON *targets = cJSON_AddArrayToObject(g0, "targets");
    cJSON_AddItemToArray(targets, cJSON_CreateString("Linear"));
    cJSON_AddItemToObject(g0, "weights", ct_args(&fi, 0));
    if (input_acts) cJSON_AddItemToObject(g0, "input_activations", ct_args(&fi, 1));
    else cJSON_AddNullToObject(g0, "input_activations");
    cJSON_AddItemToObject(qc, "ignore", str_array(ignore, n));
    cJSON_AddNullToObject(qc, "kv_cache_scheme");
    add_producer(qc);
    return qc;
}

/* transformers' HqqConfig.to_dict() for hqq's 4-bit quantization along
 * axis 1 in groups of `group` (its quantize flags optimize and round_zero
 * written false, as HQQLinear's state_dict does: bookkeeping nobody reads),
 * skip_modules the last components of the unquantized modules' names
 * (sorted, once each), ["lm_head"] when there are none. */
cJSON *nbio_qc_hqq(int32_t group, const char *const *skip, size_t n) {
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "hqq");
    cJSON *c = cJSON_AddObjectToObject(qc, "quant_config");
    cJSON *w = cJSON_AddObjectToObject(c, "weight_quant_params");
    cJSON_AddNumberToObject(w, "nbits", 4);
    cJSON_AddBoolToObject(w, "channel_wise", 1);
    cJSON_AddNumberToObject(w, "group_size", group);
    cJSON_AddBoolToObject(w, "optimize", 0);
    cJSON_AddBoolToObject(w, "round_zero", 0);
    cJSON_AddNumberToObject(w, "axis", 1);
    cJSON_AddBoolToObject(w, "view_as_float", 0);
    cJSON_AddNullToObject(c, "scale_quant_params");
    cJSON_AddNullToObject(c, "zero_quant_params");
    cJSON_AddBoolToObject(c, "offload_meta", 0);
    /* the last components, sorted and unique (skip is sorted by full name) */
    const char **last = (const char **)calloc(n ? n : 1, sizeof *last);
    size_t nl = 0;
    for (size_t i = 0; last && i < n; i++) {
        const char *dot = strrchr(skip[i], '.');
        last[nl++] = dot ? dot + 1 : skip[i];
    }
    for (size_t i = 1; last && i < nl; i++) /* insertion sort: a model has a handful */
        for (size_t j = i; j > 0 && strcmp(last[j - 1], last[j]) > 0; j--) {
            const char *x = last[j];
            last[j] = last[j - 1];
            last[j - 1] = x;
        }
    cJSON *arr = cJSON_AddArrayToObject(qc, "skip_modules");
    for (size_t i = 0; last && i < nl; i++)
        if (i == 0 || strcmp(last[i], last[i - 1])) cJSON_AddItemToArray(arr, cJSON_CreateString(last[i]));
    if (!nl) cJSON_AddItemToArray(arr, cJSON_CreateString("lm_head"));
    free(last);
    return qc;
}

/* transformers' BitsAndBytesConfig for 4-bit weights without double
 * quantization (the absmax stays F32), as its to_dict() writes it: quant
 * type nf4 or fp4, compute dtype, the modules left unquantized in
 * llm_int8_skip_modules (null when none). */
cJSON *nbio_qc_bnb(nb_format f, const char *compute_dtype, const char *const *skip, size_t n) {
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "bitsandbytes");
    cJSON_AddBoolToObject(qc, "_load_in_4bit", 1);
    cJSON_AddBoolToObject(qc, "_load_in_8bit", 0);
    cJSON_AddBoolToObject(qc, "load_in_4bit", 1);
    cJSON_AddBoolToObject(qc, "load_in_8bit", 0);
    cJSON_AddStringToObject(qc, "bnb_4bit_quant_type", f == NB_FORMAT_NF4 ? "nf4" : "fp4");
    cJSON_AddBoolToObject(qc, "bnb_4bit_use_double_quant", 0);
    cJSON_AddStringToObject(qc, "bnb_4bit_compute_dtype", compute_dtype);
    cJSON_AddStringToObject(qc, "bnb_4bit_quant_storage", "uint8");
    cJSON_AddNumberToObject(qc, "llm_int8_threshold", 6.0);
    if (n) cJSON_AddItemToObject(qc, "llm_int8_skip_modules", str_array(skip, n));
    else cJSON_AddNullToObject(qc, "llm_int8_skip_modules");
    cJSON_AddBoolToObject(qc, "llm_int8_enable_fp32_cpu_offload", 0);
    cJSON_AddBoolToObject(qc, "llm_int8_has_fp16_weight", 0);
    return qc;
}

/* compressed-tensors pack-quantized integer weights (docs/formats.md 5.4), as
 * llm-compressor's W4A16 / W4A16_ASYM presets serialize their scheme:
 * weight-only, group or channel strategy, min-max observer. */
cJSON *nbio_qc_ct_int(nb_format f, int32_t group, const char *const *ignore, size_t n) {
    nb_format_info fi;
    if (nb_format_get_info(f, &fi) != NB_OK) return NULL; /* the caller names only formats of the table */
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(qc, "format", "pack-quantized");
    cJSON_AddStringToObject(qc, "quantization_status", "compressed");
    cJSON *g0 = cJSON_AddObjectToObject(cJSON_AddObjectToObject(qc, "config_groups"), "group_0");
    cJSON *targets = cJSON_AddArrayToObject(g0, "targets");
    cJSON_AddItemToArray(targets, cJSON_CreateString("Linear"));
    cJSON *w = cJSON_AddObjectToObject(g0, "weights");
    cJSON_AddNumberToObject(w, "num_bits", fi.element_bits);
    cJSON_AddStringToObject(w, "type", "int");
    cJSON_AddBoolToObject(w, "symmetric", !fi.zero_point);
    if (group > 0) {
        cJSON_AddStringToObject(w, "strategy", "group");
        cJSON_AddNumberToObject(w, "group_size", group);
    } else {
        cJSON_AddStringToObject(w, "strategy", "channel");
        cJSON_AddNullToObject(w, "group_size");
    }
    cJSON_AddBoolToObject(w, "dynamic", 0);
    cJSON_AddStringToObject(w, "observer", "minmax");
    cJSON_AddNullToObject(w, "actorder");
    cJSON_AddNullToObject(g0, "input_activations");
    cJSON_AddNullToObject(g0, "output_activations");
    cJSON_AddItemToObject(qc, "ignore", str_array(ignore, n));
    cJSON_AddNullToObject(qc, "kv_cache_scheme");
    add_producer(qc);
    return qc;
}
