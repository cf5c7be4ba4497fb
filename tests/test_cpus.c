/*
 * tests/test_cpus.c - exclusive CPU sets for timing cells (daemon/host/cpus.h).
 */
#include <criterion/criterion.h>
#include <errno.h>

#include "daemon/host/cpus.h"

static int count(const cpu_set_t *s)
{
    return CPU_COUNT(s);
}

Test(cpus, timing_cells_get_disjoint_sets)
{
    struct cpus_pool p;
    int host[4] = {0, 1, 2, 3};
    cpu_set_t a, b, c, both;
    cr_assert_eq(cpus_pool_init(&p, host, 4), 0);
    cr_assert_eq(cpus_take(&p, true, 2, &a), 2);
    cr_assert_eq(cpus_take(&p, true, 1, &b), 1);
    CPU_AND(&both, &a, &b);
    cr_assert_eq(count(&both), 0, "no CPU in two timing sets");
    /* the highest CPUs first: CPU 0 is the kernel's busiest */
    cr_assert(CPU_ISSET(3, &a) && CPU_ISSET(2, &a) && CPU_ISSET(1, &b));
    /* one CPU left: a cell wanting two gets the one that is free, alone */
    cr_assert_eq(cpus_take(&p, true, 2, &c), 1);
    cr_assert(CPU_ISSET(0, &c));
    cr_assert_not(cpus_can_start(&p, true));
    cr_assert_not(cpus_can_start(&p, false), "numerics cells may not use timing CPUs either");
    cr_assert_eq(cpus_take(&p, true, 1, &c), -EBUSY);
    cpus_release(&p, true, &b);
    cr_assert(cpus_can_start(&p, true));
    cr_assert_eq(cpus_take(&p, true, 4, &c), 1);
    cr_assert(CPU_EQUAL(&c, &b), "the released CPU is taken again");
}

Test(cpus, numerics_cells_share_what_timing_leaves)
{
    struct cpus_pool p;
    int host[3] = {0, 2, 5};
    cpu_set_t t, n1, n2;
    cr_assert_eq(cpus_pool_init(&p, host, 3), 0);
    cr_assert_eq(cpus_take(&p, true, 1, &t), 1);
    cr_assert(CPU_ISSET(5, &t), "the highest host CPU");
    cr_assert_eq(cpus_take(&p, false, 1, &n1), 2);
    cr_assert_eq(cpus_take(&p, false, 1, &n2), 2);
    cr_assert(CPU_ISSET(0, &n1) && CPU_ISSET(2, &n1) && !CPU_ISSET(5, &n1));
    cr_assert(CPU_EQUAL(&n1, &n2), "numerics cells share");
    /* a timing cell cannot start while numerics cells hold every free CPU */
    cr_assert_not(cpus_can_start(&p, true));
    cpus_release(&p, false, &n1);
    cr_assert_not(cpus_can_start(&p, true), "n2 still holds them");
    cpus_release(&p, false, &n2);
    cr_assert(cpus_can_start(&p, true));
    cr_assert_eq(cpus_take(&p, true, 8, &t), 2);
}

/* One CPU: a timing cell and anything else are serialised. */
Test(cpus, one_cpu_serialises)
{
    struct cpus_pool p;
    int host[1] = {0};
    cpu_set_t t, n;
    cr_assert_eq(cpus_pool_init(&p, host, 1), 0);
    cr_assert_eq(cpus_take(&p, false, 1, &n), 1);
    cr_assert_not(cpus_can_start(&p, true));
    cr_assert(cpus_can_start(&p, false));
    cpus_release(&p, false, &n);
    cr_assert_eq(cpus_take(&p, true, 1, &t), 1);
    cr_assert_not(cpus_can_start(&p, false));
    cr_assert_not(cpus_can_start(&p, true));
    json_t *j = cpus_json(&t);
    cr_assert_eq(json_array_size(j), 1);
    cr_assert_eq(json_integer_value(json_array_get(j, 0)), 0);
    json_decref(j);
}

Test(cpus, numbers_past_the_set_are_refused)
{
    struct cpus_pool p;
    int host[3] = {1, CPU_SETSIZE, -1};
    cpu_set_t t;
    cr_assert_eq(cpus_pool_init(&p, host, 3), -E2BIG);
    cr_assert_eq(cpus_take(&p, true, 4, &t), 1, "the representable CPU stays usable");
    cr_assert(CPU_ISSET(1, &t));
}
