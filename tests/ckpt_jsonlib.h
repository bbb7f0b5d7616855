/* ckpt_jsonlib.h - cJSON helpers of the checkpoint writer tests: a nested
 * member, a string's value, an array holding a string, and a written
 * checkpoint's config.json.  Includes ckpt_testlib.h. */
#ifndef NB_CKPT_JSONLIB_H
#define NB_CKPT_JSONLIB_H

#include "ckpt_testlib.h"

#include <cjson/cJSON.h>

/* o[a][b][c], each of b and c only when not NULL. */
static inline const cJSON *jget(const cJSON *o, const char *a, const char *b, const char *c) {
    o = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) o = cJSON_GetObjectItemCaseSensitive(o, b);
    if (c) o = cJSON_GetObjectItemCaseSensitive(o, c);
    return o;
}

static inline int jis(const cJSON *o, const char *s) { return cJSON_IsString(o) && !strcmp(o->valuestring, s); }

static inline int has(const cJSON *a, const char *s) {
    const cJSON *e;
    cJSON_ArrayForEach(e, a) if (jis(e, s)) return 1;
    return 0;
}

/* g_dir/<out>/config.json parsed (the caller deletes it), or NULL after a
 * failed check; the input's other keys kept (the fixtures' hidden_size
 * 64); its quantization_config in *qc. */
static inline cJSON *read_config(const char *out, const cJSON **qc) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/config.json", g_dir, out);
    size_t n = 0;
    char *txt = read_file_all(path, &n);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    CHECK(j != NULL, "%s: config.json missing or malformed", out);
    if (j)
        CHECK(cJSON_GetNumberValue(jget(j, "hidden_size", NULL, NULL)) == 64, "%s: config.json lost hidden_size",
              out);
    *qc = jget(j, "quantization_config", NULL, NULL);
    return j;
}

#endif
