/*
 * tests/test_layout.c - the data dir's layout (storage/layout.h): each
 * path where docs/operations.md says it is, and a path that does not fit
 * its buffer refused with -ENAMETOOLONG, never cut.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "storage/layout.h"

Test(layout, paths)
{
    char p[LAYOUT_PATH_MAX];
    cr_assert_eq(layout_dir(p, sizeof p, "/d", "capd.db"), 0);
    cr_assert_str_eq(p, "/d/capd.db");
    cr_assert_eq(layout_blob(p, sizeof p, "/d", "b0123abcd"), 0);
    cr_assert_str_eq(p, "/d/blobs/01/b0123abcd");
    cr_assert_eq(layout_job_logs(p, sizeof p, "/d", "j1"), 0);
    cr_assert_str_eq(p, "/d/logs/j1");
    cr_assert_eq(layout_cell_log(p, sizeof p, "/d", "j1", "c2"), 0);
    cr_assert_str_eq(p, "/d/logs/j1/c2.log");
    cr_assert_eq(layout_zygote_log(p, sizeof p, "/d", "torch"), 0);
    cr_assert_str_eq(p, "/d/logs/zygote-torch.log");
    cr_assert_eq(layout_cell_scratch(p, sizeof p, "/d", "c2", 3), 0);
    cr_assert_str_eq(p, "/d/scratch/c2-3");
    cr_assert_eq(layout_zygote_scratch(p, sizeof p, "/d", 7u), 0);
    cr_assert_str_eq(p, "/d/scratch/zygote-7");
}

Test(layout, too_long_is_refused_not_cut)
{
    char p[17];
    memset(p, 'x', sizeof p);
    /* "/d/logs/j1/c2.log" is 17 characters, 18 bytes with its NUL. */
    cr_assert_eq(layout_cell_log(p, sizeof p, "/d", "j1", "c2"), -ENAMETOOLONG);
    cr_assert_str_eq(p, "", "nothing half-written");
    char q[18];
    cr_assert_eq(layout_cell_log(q, sizeof q, "/d", "j1", "c2"), 0, "exactly fits");
    cr_assert_eq(layout_blob(p, 1, "/d", "b01"), -ENAMETOOLONG);
}
