/*
 * tests/test_slurm.c - daemon/slurm/slurm.h without a cluster: the sbatch
 * command line and every refusal, the parsers of sbatch's, squeue's and
 * scontrol's output (good and bad, array tasks included), the state map
 * table, and the runner on plain programs of /bin (its status, stderr,
 * timeout, output ceiling, SLURM_CONF). test_slurm_cluster runs the same
 * module against a real one-node Slurm.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/slurm/slurm.h"

/* ERRP, not *ERRP: the call that fills it is another argument. */
static void want_err(int rc, int want, char **errp, const char *has)
{
    char *err = *errp;
    *errp = NULL;
    cr_assert_eq(rc, want, "rc %d, want %d (%s)", rc, want, err ? err : "no message");
    cr_assert_not_null(err);
    cr_assert(strstr(err, has), "message '%s' lacks '%s'", err, has);
    free(err);
}

static char *joined(const struct slurm_argv *a)
{
    static char buf[8192];
    buf[0] = '\0';
    for (int i = 0; i < a->argc; i++) {
        strcat(buf, i ? " " : "");
        strcat(buf, a->argv[i]);
    }
    cr_assert_null(a->argv[a->argc]);
    return buf;
}

Test(slurm, sbatch_argv_every_field)
{
    struct slurm_submit s = {.job_name = "capd-j1",
                             .script = "/tmp/x/cell.sh",
                             .array_last = 5,
                             .throttle = 2,
                             .partition = "cpu",
                             .account = "fw",
                             .qos = "normal",
                             .time_limit_min = 30,
                             .constraint = "avx512f&avx512bw",
                             .gpu = true,
                             .exclusive = true,
                             .no_requeue = true,
                             .output = "/tmp/x/o-%A_%a",
                             .error = "/tmp/x/e-%A_%a",
                             .workdir = "/tmp/x",
                             .export_env = "NONE,CAPD_CELL=1"};
    struct slurm_argv a;
    char *err = NULL;
    cr_assert_eq(slurm_sbatch_argv(&s, &a, &err), 0, "%s", err);
    cr_assert_str_eq(joined(&a),
                     "sbatch --parsable --job-name=capd-j1 --partition=cpu --account=fw "
                     "--qos=normal --constraint=avx512f&avx512bw --output=/tmp/x/o-%A_%a "
                     "--error=/tmp/x/e-%A_%a --chdir=/tmp/x --export=NONE,CAPD_CELL=1 "
                     "--array=0-5%2 --time=30 --gres=gpu:1 --exclusive --no-requeue "
                     "/tmp/x/cell.sh");
    slurm_argv_free(&a);
    struct slurm_submit m = {.script = "/s.sh", .array_last = -1};
    cr_assert_eq(slurm_sbatch_argv(&m, &a, &err), 0, "%s", err);
    cr_assert_str_eq(joined(&a), "sbatch --parsable /s.sh");
    slurm_argv_free(&a);
    m.array_last = 0;
    cr_assert_eq(slurm_sbatch_argv(&m, &a, &err), 0, "%s", err);
    cr_assert_str_eq(joined(&a), "sbatch --parsable --array=0-0 /s.sh");
    slurm_argv_free(&a);
}

static void refused(struct slurm_submit s, const char *has)
{
    struct slurm_argv a;
    char *err = NULL;
    int rc = slurm_sbatch_argv(&s, &a, &err);
    slurm_argv_free(&a);
    want_err(rc, -EINVAL, &err, has);
}

Test(slurm, sbatch_argv_refusals)
{
    static char long_name[SLURM_NAME_MAX + 2], long_str[SLURM_STR_MAX + 2];
    memset(long_name, 'n', SLURM_NAME_MAX + 1);
    memset(long_str, 's', SLURM_STR_MAX + 1);
    long_str[0] = '/';
    char at_max[SLURM_NAME_MAX + 1];
    memset(at_max, 'n', SLURM_NAME_MAX);
    at_max[SLURM_NAME_MAX] = '\0';
    struct slurm_argv a;
    char *err = NULL;
    struct slurm_submit ok = {.script = "/s.sh", .array_last = -1, .job_name = at_max};
    cr_assert_eq(slurm_sbatch_argv(&ok, &a, &err), 0, "%s", err);
    slurm_argv_free(&a);
#define BASE .script = "/s.sh", .array_last = -1
    refused((struct slurm_submit){.array_last = -1}, "script is missing");
    refused((struct slurm_submit){.script = "s.sh", .array_last = -1}, "not an absolute path");
    refused((struct slurm_submit){.script = "", .array_last = -1}, "script is empty");
    refused((struct slurm_submit){.script = long_str, .array_last = -1}, "at most 4096");
    refused((struct slurm_submit){BASE, .job_name = long_name}, "at most 128");
    refused((struct slurm_submit){BASE, .job_name = "a\nb"}, "control character (0x0a)");
    refused((struct slurm_submit){BASE, .job_name = "a b"}, "job-name has a space");
    refused((struct slurm_submit){BASE, .partition = "p\tq"}, "partition has a control");
    refused((struct slurm_submit){BASE, .account = ""}, "account is empty");
    refused((struct slurm_submit){BASE, .qos = "a b"}, "qos has a space");
    refused((struct slurm_submit){BASE, .constraint = "avx\r"}, "constraint has a control");
    refused((struct slurm_submit){BASE, .output = "/o\n"}, "output has a control");
    refused((struct slurm_submit){BASE, .error = "/e\x7f"}, "error has a control character (0x7f)");
    refused((struct slurm_submit){BASE, .workdir = "/w\n"}, "chdir has a control");
    refused((struct slurm_submit){BASE, .export_env = long_str}, "export is 4097 bytes");
    refused((struct slurm_submit){.script = "/s.sh", .array_last = SLURM_ARRAY_LAST_MAX + 1},
            "last index 1001 is over 1000");
    refused((struct slurm_submit){BASE, .throttle = 2}, "throttle 2 without an array");
    refused((struct slurm_submit){.script = "/s.sh", .array_last = 3, .throttle = -1},
            "throttle -1 is negative");
    refused((struct slurm_submit){BASE, .time_limit_min = -1}, "time limit -1 min");
    refused((struct slurm_submit){BASE, .time_limit_min = SLURM_TIME_MAX_MIN + 1}, "outside 0..");
#undef BASE
}

Test(slurm, argv_full_refuses)
{
    struct slurm_argv a;
    char *err = NULL;
    slurm_argv_init(&a);
    for (int i = 0; i < SLURM_ARGV_MAX; i++)
        cr_assert_eq(slurm_argv_addf(&a, &err, "w%d", i), 0);
    want_err(slurm_argv_addf(&a, &err, "one more"), -E2BIG, &err, "at most 64 words");
    cr_assert_eq(a.argc, SLURM_ARGV_MAX);
    cr_assert_null(a.argv[SLURM_ARGV_MAX]);
    slurm_argv_free(&a);
    /* scancel of more ids than a line holds is refused before it runs. */
    uint32_t ids[SLURM_ARGV_MAX];
    for (int i = 0; i < SLURM_ARGV_MAX; i++)
        ids[i] = (uint32_t)i + 1;
    struct slurm_ctx ctx = {.bin_dir = "/nonexistent", .timeout_ms = 1000, .out_max = 100};
    want_err(slurm_cancel(&ctx, ids, NULL, SLURM_ARGV_MAX, &err), -E2BIG, &err, "at most 64 words");
    cr_assert_eq(atomic_load(&ctx.spawns), 0);
}

Test(slurm, parsable)
{
    uint32_t id = 0;
    char *err = NULL;
    cr_assert_eq(slurm_parse_parsable("12345\n", &id, &err), 0);
    cr_assert_eq(id, 12345);
    cr_assert_eq(slurm_parse_parsable("7;capd-test_1\n", &id, &err), 0);
    cr_assert_eq(id, 7);
    cr_assert_eq(slurm_parse_parsable("4294967295", &id, &err), 0);
    cr_assert_eq(id, 4294967295u);
    const char *bad[] = {"",         "\n",     "x12", "12 ",        "12\n\n",
                         "12;",      "12;a b", "-1",  "4294967296", "0",
                         "12;c\nxx", "12abc",  " 12", "12;c;d",     "123456789012"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(slurm_parse_parsable(bad[i], &id, &err), -EINVAL, "'%s' accepted", bad[i]);
        cr_assert(strstr(err, "sbatch's reply"), "%s", err);
        free(err);
        err = NULL;
    }
}

Test(slurm, squeue_parse)
{
    struct slurm_job_state r[4];
    size_t n = 0;
    char *err = NULL;
    cr_assert_eq(slurm_parse_squeue("12_0|RUNNING|None\n12_1|PENDING|JobArrayTaskLimit\n"
                                    "13|PENDING|BadConstraints\n",
                                    r, 4, &n, &err),
                 0, "%s", err);
    cr_assert_eq(n, 3);
    cr_assert(r[0].job_id == 12 && r[0].task_id == 0 && r[0].known && !r[0].exit_known);
    cr_assert_str_eq(r[0].state, "RUNNING");
    cr_assert(r[1].task_id == 1);
    cr_assert_str_eq(r[1].reason, "JobArrayTaskLimit");
    cr_assert(r[2].job_id == 13 && r[2].task_id == -1);
    cr_assert_eq(slurm_parse_squeue("", r, 4, &n, &err), 0);
    cr_assert_eq(n, 0);
    const char *bad[] = {
        "12|RUNNING\n",  "12_|RUNNING|None\n",      "x|RUNNING|None\n", "12||None\n",
        "12|RUNNING|\n", "12_[0-3]|PENDING|None\n", "12|A|B|C\n",       "\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(slurm_parse_squeue(bad[i], r, 4, &n, &err), -EINVAL, "'%s' accepted", bad[i]);
        cr_assert(strstr(err, "is not ID|STATE|REASON"), "%s", err);
        free(err);
        err = NULL;
    }
    want_err(slurm_parse_squeue("1|R|N\n2|R|N\n", r, 1, &n, &err), -E2BIG, &err,
             "more than 1 jobs");
}

Test(slurm, scontrol_parse)
{
    const char *text =
        "JobId=3 ArrayJobId=1 ArrayTaskId=0 JobName=j.sh UserId=root(0) JobState=FAILED "
        "Reason=NonZeroExitCode Dependency=(null) ExitCode=3:0 RunTime=00:00:00\n"
        "JobId=1 ArrayJobId=1 ArrayTaskId=2-5%2 JobName=j.sh JobState=PENDING Reason=None "
        "ExitCode=0:0\n"
        "JobId=9 JobName=k JobState=CANCELLED Reason=None ExitCode=0:15\n";
    struct slurm_job_state r[4];
    size_t n = 0;
    char *err = NULL;
    cr_assert_eq(slurm_parse_scontrol(text, r, 4, &n, &err), 0, "%s", err);
    cr_assert_eq(n, 2, "the pending remainder is skipped");
    cr_assert(r[0].job_id == 1 && r[0].task_id == 0 && r[0].exit_known && r[0].exit_code == 3 &&
              r[0].signal == 0);
    cr_assert_str_eq(r[0].state, "FAILED");
    cr_assert_str_eq(r[0].reason, "NonZeroExitCode");
    cr_assert(r[1].job_id == 9 && r[1].task_id == -1 && r[1].signal == 15);
    const char *bad[] = {"JobName=x JobState=FAILED\n",
                         "JobId=x JobState=FAILED\n",
                         "JobId=3 ExitCode=0:0\n",
                         "JobId=3 JobState=FAILED ExitCode=3\n",
                         "JobId=3 JobState=FAILED ExitCode=256:0\n",
                         "JobId=3 ArrayJobId=1 JobState=FAILED\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(slurm_parse_scontrol(bad[i], r, 4, &n, &err), -EINVAL, "'%s' accepted",
                     bad[i]);
        cr_assert(strstr(err, "is not a job"), "%s", err);
        free(err);
        err = NULL;
    }
    want_err(slurm_parse_scontrol(text, r, 1, &n, &err), -E2BIG, &err, "more than 1 jobs");
}

Test(slurm, state_map_table)
{
    static const struct {
        const char *state, *reason;
        int code, sig;
        enum slurm_verdict v;
        const char *why;
    } t[] = {
        {"PENDING", "Priority", 0, 0, SLURM_V_RUNNING, "waiting for resources"},
        {"PENDING", "BadConstraints", 0, 0, SLURM_V_UNSUPPORTED, "BadConstraints"},
        {"CONFIGURING", NULL, 0, 0, SLURM_V_RUNNING, "configured"},
        {"RUNNING", "None", 0, 0, SLURM_V_RUNNING, "slurm RUNNING: running"},
        {"COMPLETING", NULL, 0, 0, SLURM_V_RUNNING, "ending"},
        {"SUSPENDED", NULL, 0, 0, SLURM_V_RUNNING, "suspended"},
        {"REQUEUED", NULL, 0, 0, SLURM_V_RUNNING, "requeued by Slurm"},
        {"COMPLETED", "None", 0, 0, SLURM_V_ENDED, "end frame decides"},
        {"FAILED", "NonZeroExitCode", 3, 0, SLURM_V_FAILED, "the worker exited 3"},
        {"FAILED", NULL, 0, 9, SLURM_V_FAILED, "killed by signal 9"},
        {"TIMEOUT", NULL, 0, 0, SLURM_V_TIMEOUT, "time limit"},
        {"DEADLINE", NULL, 0, 0, SLURM_V_TIMEOUT, "deadline"},
        {"OUT_OF_MEMORY", NULL, 0, 9, SLURM_V_OOM, "out of memory"},
        {"CANCELLED", NULL, 0, 15, SLURM_V_CANCELLED, "cancelled"},
        {"NODE_FAIL", NULL, 0, 0, SLURM_V_REQUEUE, "node failed"},
        {"PREEMPTED", NULL, 0, 0, SLURM_V_REQUEUE, "preempted"},
        {"BOOT_FAIL", NULL, 0, 0, SLURM_V_REQUEUE, "boot"},
        {"SPECIAL_EXIT", NULL, 1, 0, SLURM_V_FAILED, "state SPECIAL_EXIT is not one capd knows"},
        {"", NULL, 0, 0, SLURM_V_FAILED, "is not one capd knows"},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        struct slurm_mapped m;
        slurm_state_map(t[i].state, t[i].reason, t[i].code, t[i].sig, &m);
        cr_assert_eq(m.verdict, t[i].v, "%s/%s: %s", t[i].state, t[i].reason ? t[i].reason : "-",
                     slurm_verdict_name(m.verdict));
        cr_assert(strstr(m.reason, t[i].why), "%s: reason '%s' lacks '%s'", t[i].state, m.reason,
                  t[i].why);
        cr_assert_eq(m.exit_code, t[i].code);
    }
    cr_assert_str_eq(slurm_verdict_name(SLURM_V_REQUEUE), "requeue");
}

static struct slurm_ctx bin_ctx(long timeout_ms, size_t out_max)
{
    return (struct slurm_ctx){.bin_dir = "/bin", .timeout_ms = timeout_ms, .out_max = out_max};
}

static void words(struct slurm_argv *a, const char *const *w)
{
    char *err = NULL;
    slurm_argv_init(a);
    for (; *w; w++)
        cr_assert_eq(slurm_argv_addf(a, &err, "%s", *w), 0);
}

Test(slurm, runner_status_stderr_and_env)
{
    struct slurm_ctx ctx = bin_ctx(10000, 1024);
    ctx.slurm_conf = "/etc/capd-test/slurm.conf";
    struct slurm_argv a;
    struct slurm_result r;
    char *err = NULL;
    words(&a,
          (const char *const[]){"sh", "-c", "echo \"$SLURM_CONF\"; echo bad >&2; exit 4", NULL});
    cr_assert_eq(slurm_run(&ctx, &a, &r, &err), 0, "%s", err);
    cr_assert_eq(r.status, 4);
    cr_assert_str_eq(r.out.p, "/etc/capd-test/slurm.conf\n");
    cr_assert_str_eq(r.errtext, "bad\n");
    cr_assert_eq(atomic_load(&ctx.spawns), 1);
    ubuf_free(&r.out);
    slurm_argv_free(&a);
    words(&a, (const char *const[]){"sh", "-c", "kill -9 $$", NULL});
    cr_assert_eq(slurm_run(&ctx, &a, &r, &err), 0, "%s", err);
    cr_assert(r.status == -1 && r.sig == 9);
    ubuf_free(&r.out);
    slurm_argv_free(&a);
}

Test(slurm, runner_refusals)
{
    struct slurm_ctx ctx = bin_ctx(300, 1000);
    struct slurm_argv a;
    struct slurm_result r;
    char *err = NULL;
    words(&a, (const char *const[]){"sleep", "30", NULL});
    want_err(slurm_run(&ctx, &a, &r, &err), -ETIMEDOUT, &err, "sleep was killed after 300 ms");
    ubuf_free(&r.out);
    slurm_argv_free(&a);
    ctx.timeout_ms = 20000;
    words(&a, (const char *const[]){"yes", NULL});
    want_err(slurm_run(&ctx, &a, &r, &err), -E2BIG, &err, "more than 1000 bytes and was killed");
    ubuf_free(&r.out);
    slurm_argv_free(&a);
    words(&a, (const char *const[]){"no-such-slurm-program", NULL});
    want_err(slurm_run(&ctx, &a, &r, &err), -ENOENT, &err, "cannot start /bin/no-such-slurm");
    ubuf_free(&r.out);
    slurm_argv_free(&a);
    words(&a, (const char *const[]){"/bin/sh", NULL});
    want_err(slurm_run(&ctx, &a, &r, &err), -EINVAL, &err, "by its program alone");
    ubuf_free(&r.out);
    slurm_argv_free(&a);
    struct slurm_job_state w[SLURM_QUERY_MAX + 1];
    memset(w, 0, sizeof(w));
    want_err(slurm_query(&ctx, w, SLURM_QUERY_MAX + 1, &err), -E2BIG, &err, "at most 1024 jobs");
}
