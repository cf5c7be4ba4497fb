/*
 * compare/profile.c - which modules and operators explain a cell's perf
 * change (docs/compare.md, "Which op got slower").
 *
 * A paired head cell whose pairs said regression runs a profiled pair
 * after its timing processes (docs/runner.md, "The profiled pair"): one
 * process of the control build and one of the head build, each timing
 * every module call (hooks) and every operator (the framework's
 * profiler). Their frames give, per iteration, each module's self time
 * (its call less the module calls inside it), each operator's self time,
 * and the time outside the root module's forward (the backward, the loss,
 * wrappers around the model's call). This file joins the two sides by
 * module path and operator name and lists the entries whose self time
 * moved the way the profiled total moved, largest first, each with its
 * share of that total change: a regression made of one slowed module
 * names it first.
 *
 * The timers slow both processes alike, so the evidence is the
 * differences, not the absolute values, and the verdict stays the timing
 * processes'. An entry a runner left out (it keeps the largest) counts as
 * 0 on that side; the result says how many were left out. Module and
 * operator lists are two views of the same time (an operator runs inside
 * a module), so their shares are not added together. On a GPU cell the
 * operators are ranked by their device self time (their kernels' time,
 * which the runner sends beside the CPU's), the modules by their
 * synchronised wall time.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

enum { CONTROL, HEAD };

int cmp_cell_set_profile(struct cmp_cell *cell, json_t *frame)
{
    const char *side = json_string_value(json_object_get(frame, "side"));
    int i = side == NULL                   ? -1
            : strcmp(side, "control") == 0 ? CONTROL
            : strcmp(side, "head") == 0    ? HEAD
                                           : -1;
    if (!json_is_object(frame) || i < 0 ||
        json_array_size(json_object_get(frame, "modules")) > CMP_MAX_PROFILE_ENTRIES ||
        json_array_size(json_object_get(frame, "ops")) > CMP_MAX_PROFILE_ENTRIES)
        return -EINVAL;
    json_incref(frame);
    json_decref(cell->profile[i]);
    cell->profile[i] = frame;
    return 0;
}

/* A non-negative number of the object, else 0 (a runner's odd value
 * counts as nothing rather than as a change). */
static double ns_of(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    double d = json_is_number(v) ? json_number_value(v) : 0;
    return isfinite(d) && d > 0 ? d : 0;
}

/* One module or operator on both sides, per iteration. */
struct entry {
    const char *key, *type;
    double ns[2];
    double delta;
};

static int by_key(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->key, ((const struct entry *)b)->key);
}

/* Larger changes in the profiled direction first (delta: the change
 * times the direction, positive). */
static int by_delta(const void *a, const void *b)
{
    double x = ((const struct entry *)a)->delta, y = ((const struct entry *)b)->delta;
    return (x < y) - (x > y);
}

/* The entries of NAME ("modules" or "ops", keyed by KEY) of both sides,
 * their time the field CLOCK, joined by key into E (at least the two
 * lists' length); their count. */
static size_t join(json_t *const prof[2], const char *name, const char *key, const char *clock,
                   struct entry *e)
{
    size_t n = 0, out = 0;
    for (int s = CONTROL; s <= HEAD; s++) {
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(prof[s], name), i, x)
        {
            const char *k = json_string_value(json_object_get(x, key));
            if (k == NULL)
                continue;
            const char *t = json_string_value(json_object_get(x, "type"));
            e[n] = (struct entry){k, t ? t : "", {0, 0}, 0};
            e[n++].ns[s] = ns_of(x, clock);
        }
    }
    qsort(e, n, sizeof *e, by_key);
    for (size_t i = 0; i < n; i++) {
        if (out > 0 && strcmp(e[out - 1].key, e[i].key) == 0) {
            e[out - 1].ns[CONTROL] += e[i].ns[CONTROL];
            e[out - 1].ns[HEAD] += e[i].ns[HEAD];
            if (!e[out - 1].type[0])
                e[out - 1].type = e[i].type;
        } else {
            e[out++] = e[i];
        }
    }
    return out;
}

/* A change's fields: both sides, the difference and its share of TOTAL. */
static int change_json(json_t *o, double c, double h, double total)
{
    const struct cmp__real f[] = {{"control_ns", c},
                                  {"head_ns", h},
                                  {"delta_ns", h - c},
                                  {"share", total != 0 ? (h - c) / total : NAN}};
    return cmp__set_reals(o, f, sizeof f / sizeof f[0]);
}

/* The CMP_PROFILE_TOP entries of NAME that moved as TOTAL did in CLOCK,
 * largest first, as an array of objects named by KEY (and "type" for
 * modules). */
static json_t *top_json(json_t *const prof[2], const char *name, const char *key, const char *clock,
                        double total)
{
    size_t cap = json_array_size(json_object_get(prof[0], name)) +
                 json_array_size(json_object_get(prof[1], name)) + 1;
    struct entry *e = malloc(cap * sizeof *e);
    json_t *arr = json_array();
    int rc = e && arr ? 0 : -ENOMEM;
    size_t n = e ? join(prof, name, key, clock, e) : 0, kept = 0;
    double sign = total < 0 ? -1 : 1;
    for (size_t i = 0; i < n; i++) {
        double d = (e[i].ns[HEAD] - e[i].ns[CONTROL]) * sign;
        if (d > 0) {
            e[kept] = e[i];
            e[kept++].delta = d;
        }
    }
    qsort(e, kept, sizeof *e, by_delta);
    for (size_t i = 0; rc == 0 && i < kept && i < CMP_PROFILE_TOP; i++) {
        json_t *o = json_object();
        rc |= o ? cmp__set(o, key, json_string(e[i].key)) : -ENOMEM;
        if (o && strcmp(name, "modules") == 0)
            rc |= cmp__set(o, "type", json_string(e[i].type));
        if (o)
            rc |= change_json(o, e[i].ns[CONTROL], e[i].ns[HEAD], total);
        rc |= o && json_array_append_new(arr, o) ? -ENOMEM : 0;
    }
    free(e);
    return cmp__obj_or_null(arr, rc);
}

/* "modules_left_out" and "ops_left_out": what the runners did not send,
 * both sides together; and why a side has no operators, if it says. */
static int left_out_json(json_t *o, json_t *const prof[2])
{
    int rc = 0;
    const char *why = NULL;
    json_int_t mods = 0, ops = 0;
    for (int s = CONTROL; s <= HEAD; s++) {
        mods += json_integer_value(json_object_get(prof[s], "modules_left_out"));
        ops += json_integer_value(json_object_get(prof[s], "ops_left_out"));
        if (why == NULL)
            why = json_string_value(json_object_get(prof[s], "profiler_why"));
    }
    rc |= cmp__set(o, "modules_left_out", json_integer(mods));
    rc |= cmp__set(o, "ops_left_out", json_integer(ops));
    rc |= cmp__set(o, "ops_unavailable", why ? json_string(why) : json_null());
    return rc;
}

/* Whether either side timed its operators on a device (a GPU cell). */
static bool on_device(json_t *const prof[2])
{
    for (int s = CONTROL; s <= HEAD; s++) {
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(prof[s], "ops"), i, x)
        {
            if (json_object_get(x, "device_self_ns"))
                return true;
        }
    }
    return false;
}

int cmp__profile_json(const struct cmp_cell *h, json_t **out)
{
    json_t *const *prof = h->profile;
    *out = NULL;
    if (prof[CONTROL] == NULL || prof[HEAD] == NULL)
        return 0;
    double c = ns_of(prof[CONTROL], "total_ns"), hd = ns_of(prof[HEAD], "total_ns");
    double total = hd - c;
    json_t *o = json_object(), *outside = json_object();
    int rc = o && outside ? 0 : -ENOMEM;
    if (rc == 0) {
        json_t *pair = json_object_get(prof[HEAD], "pair");
        rc |= cmp__set(o, "pair", json_is_integer(pair) ? json_incref(pair) : json_null());
        rc |= cmp__set(o, "iterations",
                       json_pack("{s:O?,s:O?}", "control",
                                 json_object_get(prof[CONTROL], "iterations"), "head",
                                 json_object_get(prof[HEAD], "iterations")));
        rc |= change_json(o, c, hd, total);
        rc |= change_json(outside, ns_of(prof[CONTROL], "outside_ns"),
                          ns_of(prof[HEAD], "outside_ns"), total);
        rc |= cmp__set(o, "outside", outside);
        outside = NULL;
        const char *clock = on_device(prof) ? "device_self_ns" : "self_ns";
        rc |= cmp__set(o, "modules", top_json(prof, "modules", "path", "self_ns", total));
        rc |= cmp__set(o, "ops", top_json(prof, "ops", "name", clock, total));
        rc |= cmp__set(o, "ops_clock", json_string(clock[0] == 'd' ? "device" : "cpu"));
        rc |= left_out_json(o, prof);
    }
    json_decref(outside);
    *out = cmp__obj_or_null(o, rc);
    return *out ? 0 : -ENOMEM;
}

/* ---------------------------------------------------------- the report */

/* "+2.01 ms": a signed per-iteration duration. */
static void signed_dur(char *b, size_t n, double ns)
{
    double a = fabs(ns);
    const char *sg = ns < 0 ? "-" : "+";
    if (a >= 1e6)
        snprintf(b, n, "%s%.2f ms", sg, a / 1e6);
    else if (a >= 1e3)
        snprintf(b, n, "%s%.1f us", sg, a / 1e3);
    else
        snprintf(b, n, "%s%.0f ns", sg, a);
}

static const char *js(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* Markdown inline code must not break on these. */
static void put(FILE *f, const char *s, bool md)
{
    for (; *s; s++)
        fputc(md && (*s == '`' || *s == '|' || *s == '\n') ? '\'' : *s, f);
}

/* " `nap` (Nap) +2.01 ms (95%)": one entry of a list. */
static void entry_line(FILE *f, const json_t *x, const char *key, bool md)
{
    char d[32];
    signed_dur(d, sizeof d, json_number_value(json_object_get(x, "delta_ns")));
    fputs(md ? " `" : " ", f);
    put(f, js(x, key), md);
    fputs(md ? "`" : "", f);
    if (js(x, "type")[0]) {
        fputs(" (", f);
        put(f, js(x, "type"), md);
        fputs(")", f);
    }
    fprintf(f, " %s", d);
    const json_t *share = json_object_get(x, "share");
    if (json_is_number(share))
        fprintf(f, " (%.0f%%)", 100 * json_number_value(share));
}

/* The first three entries of LIST, comma-separated, after LABEL. */
static void list_line(FILE *f, const json_t *p, const char *list, const char *key,
                      const char *label, bool md)
{
    const json_t *a = json_object_get(p, list);
    if (json_array_size(a) == 0)
        return;
    fprintf(f, "; %s", label);
    for (size_t i = 0; i < json_array_size(a) && i < 3; i++) {
        fputs(i ? "," : "", f);
        entry_line(f, json_array_get(a, i), key, md);
    }
}

/* One cell's line: the profiled change, modules, outside, operators. */
static void cell_line(FILE *f, const json_t *cell, const json_t *p, bool md)
{
    char d[32], o[32], pm[48];
    signed_dur(d, sizeof d, json_number_value(json_object_get(p, "delta_ns")));
    const json_t *out = json_object_get(p, "outside");
    signed_dur(o, sizeof o, json_number_value(json_object_get(out, "delta_ns")));
    fputs(md ? "- `" : "PROFILE ", f);
    put(f, js(cell, "model"), md);
    fprintf(f, "%s%s%s%s: %s per profiled iteration", md ? "` / " : "/", js(cell, "width"),
            md ? " / " : "/", cmp_json_pass(cell, pm, sizeof pm), d);
    list_line(f, p, "modules", "path", "modules", md);
    fprintf(f, "; outside the modules %s", o);
    bool dev = strcmp(js(p, "ops_clock"), "device") == 0;
    list_line(f, p, "ops", "name", dev ? "ops on the device" : "ops", md);
    if (js(p, "ops_unavailable")[0]) {
        fputs(" (no ops: ", f);
        put(f, js(p, "ops_unavailable"), md);
        fputs(")", f);
    }
    fputs("\n", f);
}

char *cmp__profile_block(const json_t *result, bool md)
{
    char *s = NULL;
    size_t n = 0, i;
    const json_t *cell;
    bool any = false;
    FILE *f = open_memstream(&s, &n);
    if (f == NULL)
        return NULL;
    json_array_foreach(json_object_get(result, "cells"), i, cell)
    {
        const json_t *perf = json_object_get(cell, "perf"), *p = json_object_get(perf, "profile");
        const char *v = js(perf, "verdict");
        if (!json_is_object(p) || (strcmp(v, "regression") && strcmp(v, "improvement")))
            continue;
        if (!any && md)
            fputs("\n### Where the time went (profiled pair)\n\n", f);
        any = true;
        cell_line(f, cell, p, md);
    }
    if (fclose(f) != 0 || !any) {
        free(s);
        return NULL;
    }
    return s;
}
