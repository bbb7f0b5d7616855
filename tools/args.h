/* args.h - the one argument parser of every nibble command.
 *
 * A command describes its options in a table and its positional arguments
 * by count; nba_parse then enforces, for all commands alike:
 *   - "--name value" and "--name=value"; a flag takes no value;
 *   - every option at most once (NBA_LIST options: any number of times);
 *   - numbers read whole ("2x", "1e3" and "" are not integers) and checked
 *     against their range, the option named in the message;
 *   - choices checked, the bad value quoted with the valid ones listed;
 *   - unknown options and extra positional arguments refused; "--" ends the
 *     options (a path may then start with '-');
 *   - -h / --help anywhere (before "--") prints the help, whatever else is
 *     wrong.
 * Every refusal is one line on stderr, "nibble CMD: <what> (see nibble CMD
 * --help)", and exit code 1 (cli.h lists the codes). */
#ifndef NB_TOOLS_ARGS_H
#define NB_TOOLS_ARGS_H

#include <stddef.h>
#include <stdint.h>

typedef enum nba_kind {
    NBA_FLAG,   /* dst: int *, set to 1 */
    NBA_STRING, /* dst: const char ** */
    NBA_CHOICE, /* dst: const char **; one of `choices` ("a|b|c") */
    NBA_INT,    /* dst: int64_t *; lo..hi */
    NBA_REAL,   /* dst: double *; finite, rlo..rhi */
    NBA_LIST    /* dst: const char ** with room for argc values; count: their number */
} nba_kind;

typedef struct nba_opt {
    const char *name; /* "--m" */
    nba_kind kind;
    void *dst;
    const char *choices;
    int64_t lo, hi;
    double rlo, rhi;
    size_t *count;
    int seen; /* set by nba_parse */
} nba_opt;

/* The positional arguments a command takes: between min and max of them,
 * stored in pos[]; `names` says what they are in messages ("IN OUT",
 * "PATH"; NULL when the command takes none). */
typedef struct nba_pos {
    const char **pos;
    int min, max;
    const char *names;
    int n; /* set by nba_parse */
} nba_pos;

/* Parse argv[1..argc) of `cmd`: 0 to go on, -1 after help() was called, 1
 * after a usage message. */
int nba_parse(const char *cmd, int argc, char **argv, nba_opt *opts, size_t nopts, nba_pos *pos, void (*help)(void));

/* A usage error found after parsing (a missing option, values that do not
 * go together): the message as nba_parse prints them; returns 1. */
int nba_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "a|b|c" as "a, b, c" in buf (n bytes); returns buf. */
const char *nba_choices(const char *choices, char *buf, size_t n);

/* s as a whole integer in lo..hi (messages name `what`, e.g. "--m"): 0, or
 * 1 after a usage message. */
int nba_int(const char *cmd, const char *what, const char *s, int64_t lo, int64_t hi, int64_t *out);

/* A comma list of integers in lo..hi ("1,2,4"); with `pairs`, of
 * AxB pairs ("4096x14336,..."), stored as A, B, A, B...: the number of values
 * stored (at most max), or -1 after a usage message. */
int nba_int_list(const char *cmd, const char *what, const char *s, int64_t lo, int64_t hi, int pairs, int64_t *out,
                 int max);

#endif
