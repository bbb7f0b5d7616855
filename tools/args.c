/* args.c - the argument parser of every nibble command (rules in args.h). */
#define _POSIX_C_SOURCE 200809L
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nba_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nibble %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see nibble %s --help)\n", cmd);
    va_end(ap);
    return 1;
}

/* Digits with an optional '-', nothing else: strtoll alone would take
 * leading spaces, a '+', and stop at the first character that is not a
 * digit. */
int nba_int(const char *cmd, const char *what, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    const char *d = s[0] == '-' ? s + 1 : s;
    int digits = d[0] != 0;
    for (const char *c = d; *c && digits; c++) digits = *c >= '0' && *c <= '9';
    if (!digits) return nba_usage(cmd, "%s: '%s' is not an integer", what, s);
    errno = 0;
    const long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi)
        return nba_usage(cmd, "%s: %s is out of range (%lld..%lld)", what, s, (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

/* A finite number written whole ("0.5", "1e3"; not "1e3x", " 2", "nan"). */
static int nba_real(const char *cmd, const char *what, const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    const double v = s[0] && s[0] != ' ' && s[0] != '\t' ? strtod(s, &end) : 0.0;
    if (!end || end == s || *end || errno == ERANGE || !isfinite(v))
        return nba_usage(cmd, "%s: '%s' is not a number", what, s);
    if (v < lo || v > hi) return nba_usage(cmd, "%s: %s is out of range (%g..%g)", what, s, lo, hi);
    *out = v;
    return 0;
}

/* "a|b|c": 1 when s is one of them. */
static int is_choice(const char *choices, const char *s) {
    const size_t n = strlen(s);
    for (const char *c = choices; c;) {
        const char *bar = strchr(c, '|');
        const size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && !strncmp(c, s, n)) return 1;
        c = bar ? bar + 1 : NULL;
    }
    return 0;
}

int nba_int_list(const char *cmd, const char *what, const char *s, int64_t lo, int64_t hi, int pairs, int64_t *out,
                 int max) {
    int n = 0;
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item)
            return nba_usage(cmd, "%s: '%s' is not a comma list of %s", what, s, pairs ? "AxB pairs" : "integers"),
                   -1;
        memcpy(item, p, len);
        item[len] = 0;
        char *x = pairs ? strchr(item, 'x') : NULL;
        if (pairs && !x) return nba_usage(cmd, "%s: '%s' is not of the form AxB", what, item), -1;
        if (x) *x = 0;
        if (n + 1 + (pairs != 0) > max) return nba_usage(cmd, "%s: more than %d values", what, pairs ? max / 2 : max), -1;
        if (nba_int(cmd, what, item, lo, hi, &out[n])) return -1;
        if (x && nba_int(cmd, what, x + 1, lo, hi, &out[n + 1])) return -1;
        n += 1 + (pairs != 0);
        if (!comma) return n;
        p = comma + 1;
    }
}

const char *nba_choices(const char *choices, char *buf, size_t n) {
    size_t at = 0;
    for (const char *c = choices; *c && at + 3 < n; c++) {
        if (*c == '|') {
            buf[at++] = ',';
            buf[at++] = ' ';
        } else {
            buf[at++] = *c;
        }
    }
    buf[at] = 0;
    return buf;
}

static nba_opt *find(nba_opt *opts, size_t nopts, const char *name, size_t len) {
    for (size_t i = 0; i < nopts; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len)) return &opts[i];
    return NULL;
}

/* One option's value into its destination: 0, or 1 after a message. */
static int take(const char *cmd, nba_opt *o, const char *v) {
    switch (o->kind) {
    case NBA_FLAG: *(int *)o->dst = 1; return 0;
    case NBA_STRING: *(const char **)o->dst = v; return 0;
    case NBA_CHOICE:
        if (!is_choice(o->choices, v)) {
            char list[256];
            return nba_usage(cmd, "%s: '%s' is not one of %s", o->name, v, nba_choices(o->choices, list, sizeof list));
        }
        *(const char **)o->dst = v;
        return 0;
    case NBA_INT: return nba_int(cmd, o->name, v, o->lo, o->hi, (int64_t *)o->dst);
    case NBA_REAL: return nba_real(cmd, o->name, v, o->rlo, o->rhi, (double *)o->dst);
    case NBA_LIST: ((const char **)o->dst)[(*o->count)++] = v; return 0;
    }
    return 1;
}

int nba_parse(const char *cmd, int argc, char **argv, nba_opt *opts, size_t nopts, nba_pos *pos, void (*help)(void)) {
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help();
            return -1;
        }
    for (size_t i = 0; i < nopts; i++) {
        opts[i].seen = 0;
        if (opts[i].kind == NBA_LIST) *opts[i].count = 0;
    }
    if (pos) pos->n = 0;
    int options = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && !strcmp(a, "--")) {
            options = 0;
            continue;
        }
        if (!options || a[0] != '-' || !a[1]) { /* positional ("-" alone too: a path) */
            if (!pos || pos->n == pos->max)
                return pos && pos->names ? nba_usage(cmd, "unexpected argument '%s' (takes %s)", a, pos->names)
                                         : nba_usage(cmd, "unexpected argument '%s' (takes no arguments)", a);
            pos->pos[pos->n++] = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        nba_opt *o = find(opts, nopts, a, eq ? (size_t)(eq - a) : strlen(a));
        if (!o) {
            if (eq) return nba_usage(cmd, "unknown option '%.*s'", (int)(eq - a), a);
            return nba_usage(cmd, "unknown option '%s'", a);
        }
        if (o->seen && o->kind != NBA_LIST) return nba_usage(cmd, "%s given twice", o->name);
        o->seen = 1;
        const char *v = NULL;
        if (o->kind == NBA_FLAG) {
            if (eq) return nba_usage(cmd, "%s takes no value ('%s')", o->name, a);
        } else if (eq) {
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            return nba_usage(cmd, "%s needs a value", o->name);
        }
        if (v && !v[0]) return nba_usage(cmd, "%s: the value is empty", o->name);
        if (take(cmd, o, v)) return 1;
    }
    if (pos && pos->n < pos->min)
        return nba_usage(cmd, "%s %s required", pos->names, pos->min > 1 ? "are" : "is");
    return 0;
}
