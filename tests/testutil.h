/* testutil.h - the minimal test harness: CHECK records a failure and goes on; tests end with
 * `return test_summary("name")`, which prints the count and returns non-zero if anything failed. */
#ifndef PXQ_TESTUTIL_H
#define PXQ_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>

static int test_failures, test_checks;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        test_checks++;                                                      \
        if (!(cond)) {                                                      \
            test_failures++;                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

static inline int test_summary(const char *name) {
    fprintf(stderr, "%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

/* Directory holding the fixtures (tests/data), overridable with PXQ_TEST_DATA. */
static inline const char *test_data_dir(void) {
    const char *d = getenv("PXQ_TEST_DATA");
    return d ? d : "tests/data";
}

#endif
