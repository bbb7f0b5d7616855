/* check.h - the pass/fail counters and CHECK macro every CPU test uses
 * (testlib.h includes it; tests that need nothing else include it alone). */
#ifndef NB_TEST_CHECK_H
#define NB_TEST_CHECK_H

#include <stdio.h>

static int g_pass, g_fail;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (cond) {                                              \
            g_pass++;                                            \
        } else {                                                 \
            g_fail++;                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);          \
            printf(__VA_ARGS__);                                 \
            printf("\n");                                        \
        }                                                        \
    } while (0)

#endif
