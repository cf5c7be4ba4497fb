/*
 * tests/test_perop_e2e.c - granularity op end to end, with the real runner
 * under Debian's torch and the gelumlp model's two builds
 * (tests/helpers/common/gelu.h): the first divergence named at the op and
 * its kernel, an inserted op named as the origin, NaN traced to its op.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/gelu.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/testutil.h"

/* gelu_cell of GET /v1/compare of the jobs CONTROL and HEAD. */
static json_t *compare_cell(const struct tu_capd *c, const char *control, const char *head,
                            const char *width, json_t **result)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", control, head);
    return gelu_cell(c, path, width, result);
}

/* A test's capd with the builds "control" and "gelu" (gelu_start), its
 * two jobs J1 and J2 (malloc'd ids), the commit of its head job HEAD and
 * the width where gelu's GELU is perturbed. */
struct pair {
    struct tu_capd c;
    char *j1, *j2;
    const char *head, *width;
};

/* gelu_pair into P: a control job (commit C1) and a gelu job (C2, the
 * head) paired with it, both waited for. */
static void pair_start(struct pair *p, const char *python, const char *extra_env, const char *c1,
                       const char *c2)
{
    p->head = c2;
    p->width = gelu_pair(&p->c, python, extra_env, c1, c2, &p->j1, &p->j2);
}

/* gelu_cell of the head commit's diff (GET /v1/commits/HEAD/diff). */
static json_t *head_cell(const struct pair *p, json_t **result)
{
    char path[200];
    snprintf(path, sizeof path, "/v1/commits/%s/diff", p->head);
    return gelu_cell(&p->c, path, p->width, result);
}

/* The head commit's diff in Markdown answers 200 with NEEDLE in it. */
static void expect_head_md(const struct pair *p, const char *needle)
{
    char path[200];
    struct tu_resp md;
    snprintf(path, sizeof path, "/v1/commits/%s/diff?format=md", p->head);
    tu_http(&p->c, "GET", path, NULL, 0, NULL, &md);
    cr_assert_eq(md.status, 200);
    cr_assert(strstr(md.body, needle) != NULL, "markdown: %s", md.body);
    tu_resp_free(&md);
}

/* The end of P's test: its job ids freed, its capd stopped. */
static void pair_done(struct pair *p)
{
    free(p->j1);
    free(p->j2);
    cr_assert_eq(tu_capd_stop(&p->c), 0);
}

/*
 * Down to the kernel: a head whose aten::gelu CPU kernel is wrong at the
 * widest width (examples/perturbed-gelu) is named at the op, with its
 * kernel file and the stale wrappers of that file its provenance scan
 * found; the same build at granularity op compared with itself is
 * identical.
 */
Test(perop, per_op_names_the_kernel, .timeout = 900)
{
    struct pair p;
    p.head = "7777773";
    p.width = gelu_start(&p.c, tu_python(), "");
    /* what capctl submit --source-tree sends for a tree holding two wrappers */
    static const char prov[] =
        "{\"findings\":[{\"kind\":\"generated_source\",\"path\":\"aten/src/ATen/native/cpu/"
        "Activation.cpp.DEFAULT.cpp\",\"message\":\"untracked generated dispatch source\"},"
        "{\"kind\":\"generated_source\",\"path\":\"aten/src/ATen/native/cpu/"
        "Activation.cpp.AVX2.cpp\",\"message\":\"untracked generated dispatch source\"}]}";
    p.j1 = gelu_submit(&p.c, "control", "7777771", NULL, p.width, NULL);
    p.j2 = gelu_submit(&p.c, "control", "7777772", "7777771", p.width, NULL);
    char *j3 = gelu_submit(&p.c, "gelu", "7777773", "7777771", p.width, prov);
    af_wait_jobs(&p.c, GELU_JOB_S, p.j1, p.j2, j3, NULL);

    json_t *aa;
    json_t *cell = gelu_cell(&p.c, "/v1/commits/7777772/diff", p.width, &aa);
    cr_assert_str_eq(tu_jstr(cell, "status"), "identical");
    cr_assert(json_integer_value(json_object_get(cell, "tensors_compared")) > 10);
    json_decref(aa);

    json_t *diff;
    cell = head_cell(&p, &diff);
    cr_assert_str_eq(tu_jstr(cell, "status"), "diverged");
    json_t *fd = json_object_get(cell, "first_divergence");
    char *fds = json_dumps(fd, JSON_COMPACT);
    cr_assert_str_eq(tu_jstr(fd, "key"), "act.0.forward/op.aten::gelu.0.output.0", "%s", fds);
    cr_assert_str_eq(tu_jstr(fd, "op"), "aten::gelu", "%s", fds);
    json_t *k = json_object_get(fd, "kernel");
    cr_assert_str_eq(tu_jstr(k, "stub"), "GeluKernel", "%s", fds);
    cr_assert_str_eq(tu_jstr(k, "file"), "aten/src/ATen/native/cpu/Activation.cpp", "%s", fds);
    cr_assert_eq(json_integer_value(json_object_get(k, "stale_wrappers")), 2, "%s", fds);
    free(fds);
    json_decref(diff);

    expect_head_md(
        &p, "`aten::gelu` in `act` → GeluKernel, aten/src/ATen/native/cpu/Activation.cpp — 2 "
            "stale generated wrappers of this file in the source tree");
    free(j3);
    pair_done(&p);
}

/*
 * A head whose gelu is wrapped in one more multiply (examples/perturbed-gelu,
 * CAPD_PERTURB_WRAP) runs an aten::mul the control does not: the comparison
 * names that inserted op as the origin of the divergence, in JSON and in
 * Markdown; with the sides swapped, the op is removed.
 */
Test(perop, per_op_names_an_inserted_op, .timeout = 900)
{
    struct pair p;
    pair_start(&p, tu_python(), ",\"CAPD_PERTURB_WRAP\":\"1\"", "9999991", "9999992");

    /* the gelu before it is untouched: the mul's result is what diverged */
    const struct jw_want w[] = {
        JW_S("op_origin.kind", "inserted"),
        JW_S("op_origin.op", "aten::mul"),
        JW_S("op_origin.module", "act"),
        JW_S("op_origin.key", "act.0.forward/op.aten::mul.0.output.0"),
        JW_S("op_origin.link", "same_value"),
        JW_S("first_divergence.module", "act"),
    };
    json_t *diff;
    jw_expect_all(head_cell(&p, &diff), w);
    json_decref(diff);

    expect_head_md(&p, "`aten::mul` inserted in the head in `act`");

    json_t *rev;
    const struct jw_want back[] = {JW_S("op_origin.kind", "removed"),
                                   JW_S("op_origin.op", "aten::mul")};
    jw_expect_all(compare_cell(&p.c, p.j2, p.j1, p.width, &rev), back);
    json_decref(rev);
    pair_done(&p);
}

/*
 * NaN injected in one op (examples/perturbed-gelu, CAPD_PERTURB_NAN) is
 * traced to that op: in the comparison with the control, and in the head
 * job compared with itself, which has no control to diverge from.
 */
Test(perop, per_op_traces_nan_to_its_op, .timeout = 900)
{
    struct pair p;
    pair_start(&p, tu_python(), ",\"CAPD_PERTURB_NAN\":\"1\"", "8888881", "8888882");

    json_t *diff;
    json_t *cell = head_cell(&p, &diff);
    json_t *nf = json_object_get(cell, "first_nonfinite");
    char *nfs = json_dumps(nf, JSON_COMPACT);
    cr_assert_str_eq(tu_jstr(nf, "op"), "aten::gelu", "%s", nfs);
    cr_assert_str_eq(tu_jstr(nf, "module"), "act", "%s", nfs);
    cr_assert_str_eq(tu_jstr(nf, "inputs"), "finite", "%s", nfs);
    cr_assert_eq(json_integer_value(json_object_get(nf, "nan")), 1, "%s", nfs);
    cr_assert_str_eq(tu_jstr(json_object_get(nf, "kernel"), "stub"), "GeluKernel", "%s", nfs);
    cr_assert(json_is_null(json_object_get(cell, "control_first_nonfinite")));
    free(nfs);
    json_decref(diff);

    json_t *self;
    cell = compare_cell(&p.c, p.j2, p.j2, p.width, &self);
    cr_assert_str_eq(tu_jstr(json_object_get(cell, "first_nonfinite"), "op"), "aten::gelu");
    json_decref(self);
    pair_done(&p);
}

/* repro.py of the archive unpacked under DIR run by PYTHON with ENV
 * (shell assignments) and --json; its reply (owned). */
static json_t *run_repro(const char *dir, const char *python, const char *env)
{
    char out[600];
    snprintf(out, sizeof out, "%s/repro.out", dir);
    int st =
        tu_sh("cd '%s/repro' && env %s '%s' repro.py --json > '%s' 2>&1", dir, env, python, out);
    char *text = tu_slurp(out);
    cr_assert_eq(st, 0, "repro.py exited %d: %s", st, text);
    json_t *j = json_loads(text, 0, NULL);
    cr_assert_not_null(j, "repro.py --json printed: %s", text);
    free(text);
    return j;
}

/* CELL (CAP bytes) gets the path of job JOB's first cell on C,
 * "/v1/jobs/JOB/cells/ID". */
static void first_cell(const struct tu_capd *c, const char *job, char *cell, size_t cap)
{
    char path[200];
    long st = 0;
    snprintf(path, sizeof path, "/v1/jobs/%s", job);
    json_t *j = tu_json(c, "GET", path, NULL, &st);
    snprintf(cell, cap, "/v1/jobs/%s/cells/%s", job,
             tu_jstr(json_array_get(json_object_get(j, "cells"), 0), "id"));
    json_decref(j);
}

/* POSTs BODY to the replay of the cell at path CELL on C, which must
 * answer 202, and waits for both replay jobs; the reply (owned). */
static json_t *post_replay(const struct tu_capd *c, const char *cell, const char *body)
{
    char path[320];
    long st = 0;
    snprintf(path, sizeof path, "%s/replay", cell);
    json_t *r = tu_json(c, "POST", path, body, &st);
    cr_assert_eq(st, 202, "replay: %ld", st);
    af_wait_jobs(c, GELU_JOB_S, tu_jstr(json_object_get(r, "control"), "job"),
                 tu_jstr(json_object_get(r, "head"), "job"), NULL);
    return r;
}

/* The replay report of the cell at path CELL on C, once settled (owned). */
static json_t *replay_report(const struct tu_capd *c, const char *cell)
{
    char path[320];
    snprintf(path, sizeof path, "%s/replay", cell);
    return af_get_settled(c, path, GELU_JOB_S);
}

/* Replays the cell at path CELL on C (the op it must pick: OP) and
 * unpacks GET .../repro into the empty directory DIR. */
static void replay_into(struct tu_capd *c, const char *cell, const char *op, const char *dir)
{
    char path[320];
    json_t *r = post_replay(c, cell, "{}");
    cr_assert_str_eq(tu_jstr(r, "op"), op);
    json_decref(r);
    snprintf(path, sizeof path, "%s/repro", cell);
    struct tu_resp t;
    cr_assert_eq(tu_http(c, "GET", path, NULL, 0, NULL, &t), 0);
    cr_assert_eq(t.status, 200, "repro: %ld %s", t.status, t.body);
    char tar[600];
    snprintf(tar, sizeof tar, "%s/repro.tar", c->dir);
    FILE *f = fopen(tar, "wb");
    cr_assert(f && fwrite(t.body, 1, t.len, f) == t.len && fclose(f) == 0);
    tu_resp_free(&t);
    cr_assert_eq(tu_sh("mkdir '%s' && cd '%s' && tar xf '%s'", dir, dir, tar), 0);
}

/* The replay report REP of the gelu head: the model run the same at
 * default; the unit alone on the control's inputs under the gelu build
 * other bits at its WIDTH, the same at default; against the control's
 * output, the control build at WIDTH is it, the gelu build departs. */
static void changed_at_width_alone(json_t *rep, const char *width)
{
    char *reps = json_dumps(rep, JSON_COMPACT);
    json_t *own = jw_find(json_object_get(rep, "per_width"), "width", width);
    json_t *dflt = jw_find(json_object_get(rep, "per_width"), "width", "default");
    cr_assert_str_eq(tu_jstr(dflt, "verdict"), "same", "%s", reps);
    const char *alone = jw_str(own, "isolated.verdict");
    cr_assert(!strcmp(alone, "diverged") || !strcmp(alone, "within_reference"), "%s", reps);
    cr_assert_str_eq(jw_str(dflt, "isolated.verdict"), "same", "%s", reps);
    cr_assert_str_eq(jw_str(own, "isolated.control"), "same", "%s", reps);
    cr_assert_str_neq(jw_str(own, "isolated.head"), "same", "%s", reps);
    free(reps);
}

/*
 * From "this op diverged" to a reproducer, with builds of PYTHON: the gelu
 * head's first error-introducing op (aten::gelu) is replayed on both
 * builds, and the archive's repro.py, unpacked in an empty directory and
 * needing nothing of capd, runs it on the control's inputs: under the
 * control build's environment it matches the control bit for bit, under
 * the gelu build's (the perturbed kernel at its width) the head; against
 * float64 the head is further off.
 */
static void replay_hands_out_a_reproducer(const char *python, const char *c1, const char *c2)
{
    struct pair p;
    char cell[300], dir[300];
    pair_start(&p, python, "", c1, c2);
    first_cell(&p.c, p.j2, cell, sizeof cell);
    snprintf(dir, sizeof dir, "%s/unpacked", p.c.dir);
    replay_into(&p.c, cell, "act.0.forward/op.aten::gelu.0", dir);
    /* the planted fault is in one kernel at one width: the replay says so,
     * once the op has also run alone on the control's inputs */
    json_t *rep = replay_report(&p.c, cell);
    char *reps = json_dumps(rep, JSON_COMPACT);
    const struct jw_want wr[] = {JW_S("conclusion", "kernel_changed"), JW_S("widths.0", p.width),
                                 JW_A("widths.1"), JW_S("kernel.stub", "GeluKernel"),
                                 JW_S("kernel.file", "aten/src/ATen/native/cpu/Activation.cpp")};
    jw_expect_all(rep, wr);
    changed_at_width_alone(rep, p.width);
    cr_assert_str_eq(jw_str(rep, "isolated.op"), "model.0.forward/op.aten::gelu.0", "%s", reps);
    free(reps);
    json_decref(rep);
    json_t *plain = run_repro(dir, python, "CAPD_WIDTH=default");
    const struct jw_want wp[] = {JW_S("matches", "control"), JW_T("identical_to_control")};
    jw_expect_all(plain, wp);
    char env[700];
    snprintf(env, sizeof env,
             "PYTHONPATH='%s/examples/perturbed-gelu' CAPD_WIDTH=%s CAPD_PERTURB_WIDTH=%s",
             tu_bin("CAPD_SOURCE_DIR"), p.width, p.width);
    json_t *pert = run_repro(dir, python, env);
    const struct jw_want wh[] = {JW_S("matches", "head"), JW_T("identical_to_head")};
    jw_expect_all(pert, wh);
    cr_assert(jw_num(plain, "err_f64.head") > jw_num(plain, "err_f64.control"),
              "the head's result is further from float64");
    json_decref(plain);
    json_decref(pert);
    pair_done(&p);
}

Test(perop, replay_hands_out_a_reproducer, .timeout = 900)
{
    replay_hands_out_a_reproducer(tu_python(), "6666661", "6666662");
}

/* The same on the official wheel (torch 2.14.1, MKL), both builds of it. */
Test(perop, replay_hands_out_a_reproducer_on_the_official_lane, .timeout = 900)
{
    replay_hands_out_a_reproducer(af_official_python(), "6666671", "6666672");
}

/* A fault upstream, on real torch: replaying the op after the perturbed
 * gelu (fc2's addmm) finds its inputs already drifted, so its divergence
 * is inherited, and the report names the gelu as where it came from. */
Test(perop, replay_of_a_downstream_op_is_inherited, .timeout = 900)
{
    struct pair p;
    char cell[300];
    pair_start(&p, tu_python(), "", "6666681", "6666682");
    first_cell(&p.c, p.j2, cell, sizeof cell);
    json_decref(post_replay(&p.c, cell, "{\"op\":\"fc2.0.forward/op.aten::addmm.0\"}"));
    json_t *rep = replay_report(&p.c, cell);
    const struct jw_want w[] = {JW_S("conclusion", "inherited"), JW_S("upstream.op", "aten::gelu"),
                                JW_S("upstream.module", "act"), JW_A("widths.0")};
    jw_expect_all(rep, w);
    /* fc2's addmm alone on the control's inputs: the same bits everywhere */
    json_t *e;
    size_t i;
    json_array_foreach(json_object_get(rep, "per_width"), i, e)
        cr_assert_str_eq(jw_str(e, "isolated.verdict"), "same", "at %s", tu_jstr(e, "width"));
    json_decref(rep);
    pair_done(&p);
}

/* A nondeterministic op on real torch (gelumlp:noisy scales by a factor
 * read from the clock): its replay is not reproducible in isolation, and
 * the report says it is nondeterministic. */
Test(perop, replay_of_a_nondeterministic_op_is_not_reproducible, .timeout = 900)
{
    struct pair p;
    p.width = gelu_start(&p.c, tu_python(), "");
    p.j1 = gelu_submit_model(&p.c, "gelumlp:noisy", "control", "6666691", NULL, p.width, NULL);
    p.j2 = gelu_submit_model(&p.c, "gelumlp:noisy", "control", "6666692", "6666691", p.width, NULL);
    af_wait_jobs(&p.c, GELU_JOB_S, p.j1, p.j2, NULL);
    char cell[300];
    first_cell(&p.c, p.j2, cell, sizeof cell);
    json_decref(post_replay(&p.c, cell, "{\"op\":\"noise.0.forward/op.aten::mul.0\"}"));
    json_t *rep = replay_report(&p.c, cell);
    char *reps = json_dumps(rep, JSON_COMPACT);
    cr_assert_str_eq(tu_jstr(rep, "conclusion"), "not_reproducible", "%s", reps);
    cr_assert(strstr(tu_jstr(rep, "why"), "nondeterministic at"), "%s", reps);
    free(reps);
    json_decref(rep);
    pair_done(&p);
}

/*
 * At granularity module (the default), by itself: the gelu head diverges at
 * the layer act, whose forward call is the unit capd replays without being
 * asked (option replay auto). act alone on the control's recorded inputs
 * computes something else under the gelu build at its width and the same
 * at default: the isolated cells ran the model with act handed those
 * inputs. The archive's manifest names the module, and its repro.py says
 * it needs the model's code.
 */
Test(perop, a_layer_is_replayed_by_itself_at_granularity_module, .timeout = 900)
{
    struct pair p = {.head = "6666692"};
    char cell[300], path[700], dir[600];
    p.width = gelu_start(&p.c, tu_python(), "");
    p.j1 = gelu_submit_opts(&p.c, "gelumlp:factory", "control", "6666691", NULL, p.width, NULL,
                            "\"replay\":\"auto\"");
    p.j2 = gelu_submit_opts(&p.c, "gelumlp:factory", "gelu", p.head, "6666691", p.width, NULL,
                            "\"replay\":\"auto\"");
    af_wait_jobs(&p.c, GELU_JOB_S, p.j1, p.j2, NULL);
    char *l = af_wait_label(&p.c, p.j2, "replay_auto", GELU_JOB_S);
    cr_assert_str_eq(l, "replayed 1");
    free(l);
    first_cell(&p.c, p.j2, cell, sizeof cell);
    json_t *rep = replay_report(&p.c, cell);
    char *reps = json_dumps(rep, JSON_COMPACT);
    const struct jw_want w[] = {JW_S("unit", "module"),
                                JW_S("op", "act.0.forward"),
                                JW_S("conclusion", "kernel_changed"),
                                JW_S("widths.0", p.width),
                                JW_A("widths.1"),
                                JW_S("isolated.op", "act.0.forward")};
    jw_expect_all(rep, w);
    changed_at_width_alone(rep, p.width);
    json_t *own = jw_find(json_object_get(rep, "per_width"), "width", p.width);
    cr_assert_str_eq(tu_jstr(own, "inputs"), "identical", "%s", reps);
    free(reps);
    json_decref(rep);
    /* the reproducer: the module call's inputs and both sides' outputs;
     * asking again answers the same replay */
    snprintf(dir, sizeof dir, "%s/unpacked", p.c.dir);
    replay_into(&p.c, cell, "act.0.forward", dir);
    snprintf(path, sizeof path, "%s/repro/manifest.json", dir);
    json_t *m = json_load_file(path, 0, NULL);
    const struct jw_want wm[] = {JW_S("unit", "module"), JW_S("module", "act"),
                                 JW_S("key", "act.0.forward"), JW_S("args.0.role", "input"),
                                 JW_S("args.0.file", "inputs/arg.0.npy")};
    jw_expect_all(m, wm);
    cr_assert_eq(json_integer_value(json_object_get(m, "call")), 0);
    json_decref(m);
    cr_assert_eq(tu_sh("cd '%s/repro' && '%s' repro.py --json > out.json 2>&1", dir, tu_python()),
                 2, "repro.py of a module unit exits 2");
    pair_done(&p);
}
