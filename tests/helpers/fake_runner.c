/* fake_runner: a stand-in for `python -m capd_runner` in tests.
 *
 * capd execs it exactly like a Python interpreter (argv is ignored). It reads
 * the cell spec named by $CAPD_CELL_SPEC (docs/protocol.md), writes frames on
 * the spec's `frame_fd`, and behaves as the spec's `model` says:
 * `fake:<behavior>`, `fake:<behavior>:<arg>` or `fake:<behavior>__<arg>`
 * (for model-name rules that allow only one ':'). Below, `:N` stands for
 * either form.
 *
 *   ok[:N]          hello, env (effective_width = width, "avx2" for "native"),
 *                   N tensors (default 3) `layer<i>.0.forward.output.0`,
 *                   float32 shape [4], capture per options.capture (payload:
 *                   min(sample_size, 4) elements for sample, 16 bytes for
 *                   full), timing (options.timing_processes frames of
 *                   options.iterations samples each), memory,
 *                   end ok; exit 0. Values depend only on options.seed and the
 *                   key; hash is BLAKE2b-128 of the 16 raw bytes as in the
 *                   real runner. If $FAKE_PERTURB_KEY equals a key, that
 *                   tensor's first element moves by 2^-10 (payload, hash and
 *                   stats differ); with $FAKE_PERTURB_WIDTH set, only in
 *                   cells of that width (a width-specific kernel bug), with
 *                   $FAKE_PERTURB_MODE, only in cells of that mode (a
 *                   compiler bug). A compiled cell (spec mode other than
 *                   eager) records only its last layer's output, as the
 *                   real runner records a compiled model at its boundary.
 *                   $FAKE_DEVICE_PEAK_BYTES, when set, is the memory
 *                   frame's device_peak_bytes (in every behavior that
 *                   sends one).
 *                   $FAKE_TIMING_SCALE (a float, default 1)
 *                   scales the timing samples, for perf-regression tests.
 *                   With a "reference" in the spec (paired timing), the
 *                   timing frames come in pairs, a reference frame scaled
 *                   by the reference env's FAKE_TIMING_SCALE then the
 *                   head's, options.timing_pairs, more rounds of half as
 *                   many (up to options.max_timing_rounds) while the pairs' ratios
 *                   straddle +-5%; then, when every pair's head was past 5%
 *                   slower (options.profile auto) or always, a profiled
 *                   pair's two profile frames (profiled_pair).
 *                   $FAKE_ENV_FILE names a file of NAME=VALUE lines that
 *                   are set as environment variables first (a missing file
 *                   sets none; the reference env's file is read for its
 *                   FAKE_TIMING_SCALE), so a template build
 *                   (FAKE_ENV_FILE=DIR/{commit}/env) behaves per commit.
 *                   With options.compiler_bisect "run" (the compiler
 *                   bisection job, runner/capd_runner/compbisect.py) the
 *                   ok stream (ok, slow, noend, flood, grandchild:exit)
 *                   is instead: hello, env, then in a compiled cell (mode
 *                   not eager) one note (level info) whose message is
 *                   `compile_bisect=` and a compact JSON object with
 *                   sorted keys, memory, end ok (no tensors, no timing):
 *                   where $FAKE_PERTURB_KEY is set (non-empty) and
 *                   $FAKE_PERTURB_MODE is unset, empty or the cell's mode,
 *                   {"backend":"inductor","bisect_number":0,"command":C,
 *                   "debug_info":<$FAKE_PERTURB_KEY>,"narrowed":true,
 *                   "reason":null,"subsystem":"lowerings"}, else
 *                   {"backend":null,"bisect_number":null,"command":C,
 *                   "debug_info":null,"narrowed":false,"reason":"compiled
 *                   passes the float64 rule: nothing to bisect",
 *                   "subsystem":null}, C being "fake_runner bisect <model>
 *                   <width> <pass> <mode>"; an eager cell ends unsupported
 *                   after env with the real runner's reason, "option
 *                   compiler_bisect run needs a compiled mode (aot_eager
 *                   or inductor)".
 *   ops[:N]         like ok, but per-op records (granularity op): N layers
 *                   (default 3), layer<i> taking the previous one's output,
 *                   recorded as layer<i>.0.forward.input.0, the result of its
 *                   op (aten::hardswish for even i, aten::mul for odd: element 0
 *                   times 16) layer<i>.0.forward/op.<op>.0.output.0 with op
 *                   and op_index, and layer<i>.0.forward.output.0. A
 *                   $FAKE_PERTURB_KEY naming an op record moves it by 2^-10,
 *                   and every later layer computes from the moved values.
 *                   options.target_op naming one op call records its argument
 *                   first (<target>.arg.0, role arg), and it and the op's
 *                   result carry op_call and full payloads, as the runner's
 *                   targeted capture does. $FAKE_NONDET_KEY names a key the
 *                   stream then reports nondeterministic. With
 *                   options.target_inputs (the replay step's folder), the
 *                   manifest's op alone on its recorded argument instead, as
 *                   model.0.forward/op.<op>.0 (op_replay_stream).
 *   hello_end       hello, env, end ok in one write(2); nothing else. For
 *                   per-cell overhead benchmarks.
 *   stream[:N]      N (default 100000) stats-only tensor frames of a realistic
 *                   size, many per write(2), then end ok.
 *   trickle[:N]     like stream (default N 2000), but flushes and sleeps 1 ms
 *                   after every 4 frames, so records keep arriving for about
 *                   half a second per 2000 frames: ingest is always mid-write
 *                   when a crash test kills capd.
 *   payload[:MB]    MB (default 64) tensors with 1 MiB full payloads, end ok.
 *   segv / abort    hello, env, 2 tensors, then SIGSEGV (null write) / abort().
 *   exit3           hello, then exit(3) without end.
 *   noend           like ok but no end frame; exit 0.
 *   failed          hello, env, end failed; exit 1.
 *   unsupported     hello, env whose effective_width differs from the request,
 *                   end unsupported with a reason; exit 0.
 *   hang            hello, then sleep forever.
 *   ignore_term     ignore SIGTERM, hello, then sleep forever.
 *   grandchild[:A]  fork a grandchild in the same process group that sleeps
 *                   forever, keeping every inherited fd (the frame pipe and
 *                   logs included, like a leaked worker); write its pid to
 *                   <scratch>/grandchild.pid (atomically) before hello. With no
 *                   A the parent then hangs; A = "exit": the parent writes the
 *                   ok stream and exits 0 while the grandchild lingers;
 *                   A = "exit_closed": same, but the grandchild closes its
 *                   fds 0-2 and the frame fd first.
 *   flood[:MB]      write MB MiB (default 1024) of text lines to stdout and
 *                   MB/16 MiB (at least 64 KiB) to stderr, then behave as ok.
 *   garbage         hello, then a line that is not JSON; exit 0.
 *   long_header     hello, then one 70000-byte header line; exit 0.
 *   short_payload   hello, env, a tensor announcing nbytes 4096, then only 100
 *                   bytes; exit 0.
 *   close_fd3       hello, close the frame fd, sleep 1 s, exit 0.
 *   oom             hello, then malloc+memset ever larger blocks. On malloc
 *                   failure (RLIMIT_AS): a note frame, exit 42. Without an
 *                   address-space limit it stops at $FAKE_OOM_CAP_MB (default
 *                   2048) with a note and exits 43 instead of eating the host.
 *   memhog[:MB]     hello, env, then allocates MB MiB (default 1024) in 4 MiB
 *                   blocks, touching every page and pausing 5 ms after each
 *                   block (so a 100 ms watchdog sees it grow), then end ok:
 *                   a cell over its memory limit (daemon/host/memlimit.h) never
 *                   gets that far.
 *   slow[:MS]       like ok, but sleeps MS ms (default 1000) before end.
 *   echo_env        hello, then a note whose message is a JSON document:
 *                   {"environ":{NAME:VALUE...},"fds":[open fds],"cwd":...,
 *                   "pid","ppid","pgid","sid","pdeathsig",
 *                   "rlimits":{"as","cpu","nofile","nproc","core"}} (soft
 *                   limits, -1 for unlimited), and the spec's
 *                   "device_share" when it has one; then as ok, sleeping
 *                   :MS ms (default 0) before end.
 *   devoom[:always] in a GPU cell that shares its device (the spec's
 *                   "device_share" is "shared"), or always with :always:
 *                   hello, env, and after 300 ms end oom with the reason
 *                   the real runner gives for torch.OutOfMemoryError
 *                   ("... OutOfMemoryError: CUDA out of memory ..."),
 *                   exit 1; otherwise as slow:300.
 *   devfail[:I]     on device I ($CUDA_VISIBLE_DEVICES is I), or on any
 *                   device without :I: hello, env, end failed with the
 *                   real runner's reason for a device that failed under
 *                   the model ("... CUDA error: uncorrectable ECC error
 *                   encountered"), exit 1; on another device as slow:300.
 *   cpu             hello, then burn CPU forever (for RLIMIT_CPU).
 *   anything else   hello, end failed with a reason; exit 2.
 *
 * Write errors on the frame fd end the process with exit 1 (like Python's
 * BrokenPipeError; SIGPIPE is ignored), except in the deliberately broken
 * behaviors, which ignore them and exit as documented. Behaviors that never
 * end on their own die by SIGALRM after $FAKE_MAX_SECONDS (default 600) so a
 * broken test cannot leak them forever. A spec that cannot be read gives
 * hello + end failed on fd 3 and exit 2.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "runner/native/blake2b.h"

extern char **environ;

#define OUT_BUF_MAX (256u << 10)

/* ---- output --------------------------------------------------------------- */

struct out {
    int fd;
    bool tolerate; /* ignore write errors (deliberately broken behaviors) */
    bool broken;
    size_t len;
    char buf[OUT_BUF_MAX];
};

static struct out out = {.fd = 3};

static void write_all(int fd, const void *p, size_t n)
{
    const char *c = p;

    while (n && !out.broken) {
        ssize_t w = write(fd, c, n);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            if (fd == out.fd && out.tolerate) {
                out.broken = true;
                return;
            }
            fprintf(stderr, "fake_runner: write to fd %d failed: %s\n", fd, strerror(errno));
            exit(1);
        }
        c += w;
        n -= (size_t)w;
    }
}

static void out_flush(void)
{
    write_all(out.fd, out.buf, out.len);
    out.len = 0;
}

static void out_raw(const void *p, size_t n)
{
    if (n > sizeof(out.buf)) {
        out_flush();
        write_all(out.fd, p, n);
        return;
    }
    if (out.len + n > sizeof(out.buf))
        out_flush();
    memcpy(out.buf + out.len, p, n);
    out.len += n;
}

/* Appends one frame (steals `h`) and, unless batching, flushes it. */
static void emit(json_t *h, const void *payload, size_t n, bool batch)
{
    char *txt;

    if (n)
        json_object_set_new(h, "nbytes", json_integer((json_int_t)n));
    txt = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (!txt) {
        fprintf(stderr, "fake_runner: out of memory\n");
        exit(1);
    }
    out_raw(txt, strlen(txt));
    out_raw("\n", 1);
    free(txt);
    if (n)
        out_raw(payload, n);
    if (!batch)
        out_flush();
}

/* ---- the cell ------------------------------------------------------------- */

struct cell {
    const char *model, *width, *pass, *mode, *device, *scratch;
    const char *capture, *profile;
    const char *compiler_bisect; /* options.compiler_bisect: "auto", "off", "run" */
    const char *target_op;       /* options.target_op, or NULL */
    const char *target_inputs;   /* options.target_inputs, or NULL */
    json_int_t seed, iterations, warmup, threads, sample_size, timing_processes;
    json_int_t timing_pairs, max_timing_rounds;
    json_t *reference; /* the spec's "reference" (paired timing), or NULL */
    char behavior[64];
    const char *arg; /* after the second ':', or NULL */
};

static const char *effective_width(const struct cell *c)
{
    return strcmp(c->width, "native") == 0 ? "avx2" : c->width;
}

static void hello(void)
{
    emit(json_pack("{s:s,s:i,s:s}", "kind", "hello", "protocol", 1, "runner", "fake_runner/1"),
         NULL, 0, false);
}

/*
 * The fingerprint names the cell, and like the real runner records the
 * variables that change what runs (a few of capd_runner's ENV_NAMES, as
 * this process sees them), so comparisons of builds that differ there
 * show it under "environment".
 */
static void env_frame(const struct cell *c, const char *width)
{
    static const char *const names[] = {"PYTHONPATH", "OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY",
                                        "MKL_FAKE_TOKEN"};
    json_t *env = json_object();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (getenv(names[i]))
            json_object_set_new(env, names[i], json_string(getenv(names[i])));
    emit(json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:s,s:I,s:o},s:s}", "kind", "env", "fingerprint",
                   "runner", "fake_runner", "torch", "0.0.0+fake", "model", c->model, "pass",
                   c->pass, "device", c->device, "threads", (json_int_t)c->threads, "env", env,
                   "effective_width", width),
         NULL, 0, false);
}

static void end_frame(const char *status, const char *reason)
{
    json_t *h = json_pack("{s:s,s:s}", "kind", "end", "status", status);

    if (reason)
        json_object_set_new(h, "reason", json_string(reason));
    emit(h, NULL, 0, false);
}

static void note(const char *level, const char *msg)
{
    emit(json_pack("{s:s,s:s,s:s}", "kind", "note", "level", level, "message", msg), NULL, 0,
         false);
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The helpers link jansson only, not libm: a square root by Newton's method
 * from a guess with half the exponent, stopped when it stops decreasing. */
static double nsqrt(double x)
{
    uint64_t bits;
    double r, n;

    if (!(x > 0) || isinf(x))
        return x > 0 ? x : 0;
    memcpy(&bits, &x, sizeof(bits));
    bits = (bits >> 1) + (1023ull << 51);
    memcpy(&r, &bits, sizeof(r));
    r = 0.5 * (r + x / r); /* from here on r >= sqrt(x) */
    for (int i = 0; i < 64; i++) {
        n = 0.5 * (r + x / r);
        if (n >= r)
            break;
        r = n;
    }
    return r;
}

/* Stats as protocol.md defines them: float64 over finite values, counts over
 * all; std is the unbiased one, like torch.std. */
static json_t *stats_of(const float *v, size_t n)
{
    double mn = INFINITY, mx = -INFINITY, sum = 0, sq = 0;
    json_int_t nan = 0, pinf = 0, ninf = 0, zeros = 0, fin = 0;
    double mean, var = 0;

    for (size_t i = 0; i < n; i++) {
        double x = v[i];

        if (isnan(x)) {
            nan++;
            continue;
        }
        if (isinf(x)) {
            if (x > 0)
                pinf++;
            else
                ninf++;
            continue;
        }
        zeros += x == 0;
        fin++;
        mn = x < mn ? x : mn;
        mx = x > mx ? x : mx;
        sum += x;
        sq += x * x;
    }
    if (!fin)
        return json_pack("{s:n,s:n,s:n,s:n,s:n,s:I,s:I,s:I,s:I}", "min", "max", "mean", "std", "l2",
                         "nan", nan, "pinf", pinf, "ninf", ninf, "zeros", zeros);
    mean = sum / (double)fin;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i]))
            var += (v[i] - mean) * (v[i] - mean);
    var = fin > 1 ? var / (double)(fin - 1) : 0;
    return json_pack("{s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:I,s:I}", "min", mn, "max", mx, "mean", mean,
                     "std", nsqrt(var), "l2", nsqrt(sq), "nan", nan, "pinf", pinf, "ninf", ninf,
                     "zeros", zeros);
}

/*
 * One record of 4 float32 values V (already perturbed by the caller):
 * stats, hash, the payload the capture level asks for. OP names a per-op
 * record's ATen op (its op_index is 0), NULL for a module record.
 */
static void record_call(const struct cell *c, long seq, const char *key, const char *module,
                        const char *role, const char *op, const float v[4], bool batch,
                        json_t *op_call)
{
    char hash[33];
    size_t k = 4, nbytes = 0;
    unsigned char payload[16];
    json_t *h;
    /* A targeted op call's records hold every value, whatever the capture. */
    const char *capture = op_call ? "full" : c->capture;

    b2b_hex16(v, 4 * sizeof(float), hash);
    h = json_pack("{s:s,s:I,s:s,s:s,s:i,s:s,s:s,s:i,s:s,s:[i],s:i,s:o,s:s,s:s}", "kind", "tensor",
                  "seq", (json_int_t)seq, "key", key, "module", module, "call", 0, "phase",
                  "forward", "role", role, "index", 0, "dtype", "float32", "shape", 4, "numel", 4,
                  "stats", stats_of(v, 4), "hash", hash, "capture", capture);
    if (op) {
        json_object_set_new(h, "op", json_string(op));
        json_object_set_new(h, "op_index", json_integer(0));
    }
    if (op_call)
        json_object_set(h, "op_call", op_call);
    if (strcmp(capture, "full") == 0) {
        memcpy(payload, v, 4 * sizeof(float));
        nbytes = 4 * sizeof(float);
    } else if (strcmp(capture, "sample") == 0) {
        if (c->sample_size < 4)
            k = c->sample_size > 0 ? (size_t)c->sample_size : 1;
        for (size_t j = 0; j < k; j++)
            memcpy(payload + 4 * j, &v[j * 4 / k], 4);
        nbytes = 4 * k;
        json_object_set_new(h, "sample_positions", json_string("stride"));
    }
    emit(h, payload, nbytes, batch);
}

static void record(const struct cell *c, long seq, const char *key, const char *module,
                   const char *role, const char *op, const float v[4], bool batch)
{
    record_call(c, seq, key, module, role, op, v, batch, NULL);
}

/* Whether KEY is $FAKE_PERTURB_KEY (and, when $FAKE_PERTURB_WIDTH or
 * $FAKE_PERTURB_MODE is set, C runs at that width, in that mode): its
 * first element then moves by 2^-10. */
static bool perturbed(const struct cell *c, const char *key)
{
    const char *perturb = getenv("FAKE_PERTURB_KEY");
    const char *width = getenv("FAKE_PERTURB_WIDTH");
    const char *mode = getenv("FAKE_PERTURB_MODE");
    if (width && *width && strcmp(width, c->width) != 0)
        return false;
    if (mode && *mode && strcmp(mode, c->mode) != 0)
        return false;
    return perturb && strcmp(perturb, key) == 0;
}

/* 4 float32 values fixed by (seed, key), multiples of 2^-9 in [-4, 4) so
 * every platform prints the same stats. */
static void values_of(const struct cell *c, const char *key, float v[4])
{
    uint64_t st = fnv1a(key) ^ ((uint64_t)c->seed * 0x9e3779b97f4a7c15ull);
    for (int j = 0; j < 4; j++)
        v[j] = (float)((int)(splitmix(&st) % 4096) - 2048) / 512.0f;
}

/* One small tensor, layer<i>.0.forward.output.0. */
static void tensor(const struct cell *c, long i, bool batch)
{
    char key[64], module[32];
    float v[4];

    snprintf(module, sizeof(module), "layer%ld", i);
    snprintf(key, sizeof(key), "%s.0.forward.output.0", module);
    values_of(c, key, v);
    if (perturbed(c, key))
        v[0] += 1.0f / 1024.0f;
    record(c, i, key, module, "output", NULL, v, batch);
}

/*
 * The `ops` stream's layers: layer<i> applies one ATen op to the previous
 * layer's output, recorded as its input, the op's result and its output
 * (granularity op, docs/runner.md). hardswish is x * clamp((x + 3) / 6,
 * 0, 1), as torch defines it; mul scales element 0 by 16, so an error
 * there grows relative to the tensor.
 */
static const char *const ops_names[] = {"aten::hardswish", "aten::mul"};

static void ops_apply(int op, float v[4])
{
    for (int j = 0; j < 4; j++) {
        double x = v[j], g = (x + 3) / 6;
        if (op == 0)
            v[j] = (float)(x * (g < 0 ? 0 : g > 1 ? 1 : g));
        else if (j == 0)
            v[j] = (float)(16 * x);
    }
}

/* Samples +-2.5% around 1 ms times SCALE, from the stream ST. */
static json_t *fake_samples(const struct cell *c, double scale, uint64_t *st)
{
    json_t *samples = json_array();
    for (json_int_t i = 0; i < c->iterations; i++) {
        double ns = 1e6 * (0.975 + (double)(splitmix(st) % 1000) / 20000.0) * scale;

        json_array_append_new(samples, json_integer((json_int_t)ns));
    }
    return samples;
}

static json_t *timing_frame(const struct cell *c, json_t *samples, json_int_t process,
                            json_int_t processes)
{
    return json_pack("{s:s,s:s,s:o,s:I,s:I,s:I,s:I,s:I}", "kind", "timing", "phase",
                     strcmp(c->pass, "backward") == 0 ? "backward" : "forward", "samples_ns",
                     samples, "warmup", c->warmup, "iterations", c->iterations, "threads",
                     c->threads, "process", process, "processes", processes);
}

/* The value of NAME in the NAME=VALUE lines of the file at PATH, into
 * VAL (LEN bytes); false when the file or the line is missing or the
 * value does not fit. */
static bool file_env_value(const char *path, const char *name, char *val, size_t len)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[1024];
    size_t nl = strlen(name);
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, name, nl) == 0 && line[nl] == '=') {
            size_t vl = strlen(line + nl + 1);
            if (vl < len) {
                memcpy(val, line + nl + 1, vl + 1);
                found = true;
            }
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* $FAKE_ENV_FILE: its NAME=VALUE lines become environment variables, so a
 * template build (FAKE_ENV_FILE=DIR/{commit}/env) behaves per commit. */
static void load_env_file(void)
{
    FILE *f = getenv("FAKE_ENV_FILE") ? fopen(getenv("FAKE_ENV_FILE"), "r") : NULL;
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *eq = strchr(line, '=');
        if (eq && eq != line) {
            *eq = 0;
            setenv(line, eq + 1, 1);
        }
    }
    if (f)
        fclose(f);
}

static double env_scale(json_t *env_obj)
{
    char buf[64];
    const char *sc = env_obj ? json_string_value(json_object_get(env_obj, "FAKE_TIMING_SCALE"))
                             : getenv("FAKE_TIMING_SCALE");
    if (env_obj && !sc &&
        file_env_value(json_string_value(json_object_get(env_obj, "FAKE_ENV_FILE")),
                       "FAKE_TIMING_SCALE", buf, sizeof buf))
        sc = buf;
    return sc ? strtod(sc, NULL) : 1.0;
}

#define FAKE_MAX_PAIRS 1024

/* Whether pairs 0..n-1 (head/control mean ratios R) decide, like the real
 * runner's round rule but cruder: every ratio within 5% (same), or every
 * one past it on the same side (regression, improvement). */
static bool pairs_decide(const double *r, json_int_t n)
{
    int same = 0, up = 0, down = 0;
    for (json_int_t i = 0; i < n; i++) {
        same += r[i] >= 0.95 && r[i] <= 1.05;
        up += r[i] > 1.05;
        down += r[i] < 0.95;
    }
    return same == n || up == n || down == n;
}

/*
 * The profiled pair (docs/runner.md, "The profiled pair"), like the real
 * runner's: after the pairs, when every pair's head was past 5% slower
 * (profile auto) or always, one profile frame a side, control first. Of a
 * side of scale S an iteration is 1 ms x S: 0.8 ms in module "body"
 * (Linear), 0.2 ms in the root and its aten::addmm.
 */
static void profiled_pair(const struct cell *c, double rs, double hs, const double *r, json_int_t n)
{
    bool slower = n > 0;
    for (json_int_t i = 0; i < n; i++)
        slower &= r[i] > 1.05;
    if (strcmp(c->profile, "always") != 0 && (strcmp(c->profile, "auto") != 0 || !slower))
        return;
    for (int side = 0; side < 2; side++) {
        double s = side ? hs : rs;
        emit(json_pack("{s:s,s:s,s:s,s:i,s:I,s:I,s:I,s:[{s:s,s:s,s:I,s:I,s:f},"
                       "{s:s,s:s,s:I,s:I,s:f}],s:i,s:[{s:s,s:I,s:f}],s:i,s:s}",
                       "kind", "profile", "phase", c->pass, "side", side ? "head" : "control",
                       "iterations", 50, "total_ns", (json_int_t)(1e6 * s), "outside_ns",
                       (json_int_t)0, "pair", (json_int_t)n, "modules", "path", "", "type",
                       "FakeModel", "self_ns", (json_int_t)(0.2e6 * s), "total_ns",
                       (json_int_t)(1e6 * s), "calls", 1.0, "path", "body", "type", "Linear",
                       "self_ns", (json_int_t)(0.8e6 * s), "total_ns", (json_int_t)(0.8e6 * s),
                       "calls", 1.0, "modules_left_out", 0, "ops", "name", "aten::addmm", "self_ns",
                       (json_int_t)(0.9e6 * s), "calls", 2.0, "ops_left_out", 0, "start", "fork"),
             NULL, 0, false);
    }
}

/*
 * Paired timing (docs/protocol.md): per pair, a reference frame (the
 * control build's, scaled by the reference env's $FAKE_TIMING_SCALE) then
 * the head's; timing_pairs pairs, then rounds of half as many (rounded up)
 * while the pairs do not decide, up to max_timing_rounds rounds.
 */
static void paired_timing(const struct cell *c)
{
    double hs = env_scale(NULL), rs = env_scale(json_object_get(c->reference, "env"));
    double ratios[FAKE_MAX_PAIRS];
    uint64_t st = (uint64_t)c->seed + 77, rt = (uint64_t)c->seed + 1077;
    json_int_t n = 0;

    for (json_int_t round = 0; round < c->max_timing_rounds; round++) {
        /* runner/capd_runner/pairs.py round_size: later rounds take half */
        json_int_t planned = n + (round == 0 ? c->timing_pairs : (c->timing_pairs + 1) / 2);
        if (planned > FAKE_MAX_PAIRS) {
            fprintf(stderr, "fake_runner: more than %d pairs\n", FAKE_MAX_PAIRS);
            exit(1);
        }
        for (; n < planned; n++) {
            json_t *rsam = fake_samples(c, rs, &rt), *hsam = fake_samples(c, hs, &st);
            double rsum = 0, hsum = 0;
            for (size_t i = 0; i < json_array_size(rsam); i++) {
                rsum += (double)json_integer_value(json_array_get(rsam, i));
                hsum += (double)json_integer_value(json_array_get(hsam, i));
            }
            ratios[n] = rsum > 0 ? hsum / rsum : 1.0;
            json_t *f = timing_frame(c, rsam, n, planned);
            json_object_set_new(f, "pair", json_integer(n));
            json_object_set_new(f, "reference", json_true());
            json_object_set_new(f, "round", json_integer(round));
            emit(f, NULL, 0, false);
            f = timing_frame(c, hsam, n, planned);
            json_object_set_new(f, "pair", json_integer(n));
            json_object_set_new(f, "round", json_integer(round));
            emit(f, NULL, 0, false);
        }
        if (pairs_decide(ratios, n))
            break;
    }
    profiled_pair(c, rs, hs, ratios, n);
}

/* One timing frame per timing process, like the real runner (docs/protocol.md);
 * each process's samples are +-2.5% around 1 ms times $FAKE_TIMING_SCALE.
 * With a reference in the spec: paired_timing. */
static void timing(const struct cell *c)
{
    double scale = env_scale(NULL);
    uint64_t st = (uint64_t)c->seed + 77;
    json_int_t np = c->iterations > 0 ? c->timing_processes : 1;

    if (c->reference && c->iterations > 0 && c->timing_pairs > 0) {
        paired_timing(c);
        return;
    }
    for (json_int_t p = 0; p < np; p++)
        emit(timing_frame(c, fake_samples(c, scale, &st), p, np), NULL, 0, false);
}

static void memory(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    json_t *h =
        json_pack("{s:s,s:I}", "kind", "memory", "peak_rss_bytes", (json_int_t)ru.ru_maxrss * 1024);
    const char *dev = getenv("FAKE_DEVICE_PEAK_BYTES");
    if (dev && *dev)
        json_object_set_new(h, "device_peak_bytes", json_integer(strtoll(dev, NULL, 10)));
    emit(h, NULL, 0, false);
}

static long arg_long(const struct cell *c, long dflt)
{
    return c->arg && *c->arg ? strtol(c->arg, NULL, 10) : dflt;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void __attribute__((noreturn)) hang(void)
{
    out_flush();
    for (;;)
        pause();
}

/* The 4 float32 values of DIR/inputs/arg.0.npy (version 1.0, as capd's
 * replay step writes it); false when it cannot be read. */
static bool npy_values(const char *dir, float v[4])
{
    char path[4200];
    unsigned char buf[512];
    snprintf(path, sizeof path, "%s/inputs/arg.0.npy", dir);
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    size_t start = n >= 10 ? 10 + (size_t)(buf[8] | buf[9] << 8) : sizeof buf;
    if (n < 10 || memcmp(buf, "\x93NUMPY\x01", 7) != 0 || start + 16 > n)
        return false;
    memcpy(v, buf + start, 16);
    return true;
}

/* Option target_inputs (daemon/replay/isolate.h): the op of the manifest's
 * key alone on the recorded argument, as the runner's op model records it
 * (model.0.forward/op.<op>.0). The op's result moves by 2^-10 where
 * $FAKE_PERTURB_KEY names the manifest key's result (and the width
 * matches), and is reported nondeterministic where $FAKE_NONDET_KEY does. */
static void op_replay_stream(const struct cell *c)
{
    char path[4200], mkey[512] = "", key[600];
    float v[4];
    snprintf(path, sizeof path, "%s/manifest.json", c->target_inputs);
    json_t *m = json_load_file(path, 0, NULL);
    const char *name = json_string_value(json_object_get(json_object_get(m, "op_call"), "name"));
    int op = name && strcmp(name, ops_names[1]) == 0 ? 1 : 0;
    snprintf(mkey, sizeof mkey, "%s.output.0", json_string_value(json_object_get(m, "key")));
    hello();
    env_frame(c, effective_width(c));
    if (!name || !npy_values(c->target_inputs, v)) {
        json_decref(m);
        end_frame("failed", "fake_runner: no manifest or inputs in options.target_inputs");
        out_flush();
        return;
    }
    json_t *call = json_deep_copy(json_object_get(m, "op_call"));
    snprintf(key, sizeof key, "%s.arg.0", c->target_op);
    record_call(c, 0, key, "model", "arg", name, v, false, call);
    ops_apply(op, v);
    if (perturbed(c, mkey))
        v[0] += 1.0f / 1024.0f;
    snprintf(key, sizeof key, "%s.output.0", c->target_op);
    record_call(c, 1, key, "model", "output", name, v, false, call);
    const char *nondet = getenv("FAKE_NONDET_KEY");
    if (nondet && strcmp(nondet, mkey) == 0)
        emit(json_pack("{s:s,s:[s]}", "kind", "nondeterministic", "keys", key), NULL, 0, false);
    json_decref(call);
    json_decref(m);
    memory();
    end_frame("ok", NULL);
    out_flush();
}

/* hello, env, N layers of (input, op result, output), timing, memory, end
 * ok. A perturbed key moves by 2^-10 and carries into every later layer. */
static void ops_stream(const struct cell *c, long n)
{
    char key[96], module[32];
    float v[4];
    long seq = 0;

    hello();
    env_frame(c, effective_width(c));
    values_of(c, "ops.input", v);
    for (long i = 0; i < n; i++) {
        int op = (int)(i % 2);
        snprintf(module, sizeof(module), "layer%ld", i);
        snprintf(key, sizeof(key), "%s.0.forward.input.0", module);
        record(c, seq++, key, module, "input", NULL, v, false);
        /* options.target_op: the op call's argument, recorded as the real
         * runner does (docs/runner.md, "Targeted capture") */
        char prefix[80];
        snprintf(prefix, sizeof prefix, "%s.0.forward/op.%s.0", module, ops_names[op]);
        json_t *call = NULL;
        if (c->target_op && strcmp(c->target_op, prefix) == 0) {
            call = json_pack("{s:s,s:s,s:[{s:i,s:s,s:[i],s:[i],s:i}],s:{}}", "name", ops_names[op],
                             "overload", "default", "args", "arg", 0, "dtype", "float32", "shape",
                             4, "stride", 1, "storage_offset", 0, "kwargs");
            snprintf(key, sizeof(key), "%s.arg.0", prefix);
            record_call(c, seq++, key, module, "arg", ops_names[op], v, false, call);
        }
        ops_apply(op, v);
        snprintf(key, sizeof(key), "%s.output.0", prefix);
        if (perturbed(c, key))
            v[0] += 1.0f / 1024.0f;
        record_call(c, seq++, key, module, "output", ops_names[op], v, false, call);
        json_decref(call);
        snprintf(key, sizeof(key), "%s.0.forward.output.0", module);
        record(c, seq++, key, module, "output", NULL, v, false);
    }
    /* $FAKE_NONDET_KEY: a key the runner saw change between its two runs */
    const char *nondet = getenv("FAKE_NONDET_KEY");
    if (nondet && *nondet)
        emit(json_pack("{s:s,s:[s]}", "kind", "nondeterministic", "keys", nondet), NULL, 0, false);
    timing(c);
    memory();
    end_frame("ok", NULL);
    out_flush();
}

/* The real runner's texts (runner/capd_runner/compbisect.py EAGER_WHY, NOTHING). */
#define BISECT_EAGER_WHY "option compiler_bisect run needs a compiled mode (aot_eager or inductor)"
#define BISECT_NOTHING   "compiled passes the float64 rule: nothing to bisect"

/* memory, then after SLEEP_BEFORE_END ms [end ok]: how the ok and bisect
 * streams end. */
static void stream_end(long sleep_before_end, bool with_end)
{
    memory();
    if (sleep_before_end > 0)
        sleep_ms(sleep_before_end);
    if (with_end)
        end_frame("ok", NULL);
    out_flush();
}

/* options.compiler_bisect run: hello, env, then in a compiled cell the
 * note compile_bisect=<JSON> (narrowed to $FAKE_PERTURB_KEY's "lowering"
 * where it is set and $FAKE_PERTURB_MODE allows), memory, [end ok]; an
 * eager cell ends unsupported. */
static void bisect_stream(const struct cell *c, long sleep_before_end, bool with_end)
{
    const char *key = getenv("FAKE_PERTURB_KEY"), *mode = getenv("FAKE_PERTURB_MODE");
    bool narrowed = key && *key && (!mode || !*mode || strcmp(mode, c->mode) == 0);
    json_t *r = json_object();
    char *cmd, *txt, *msg;
    size_t n;

    hello();
    env_frame(c, effective_width(c));
    if (strcmp(c->mode, "eager") == 0) {
        json_decref(r);
        end_frame("unsupported", BISECT_EAGER_WHY);
        out_flush();
        return;
    }
    n = strlen(c->model) + strlen(c->width) + strlen(c->pass) + strlen(c->mode) + 32;
    cmd = malloc(n);
    if (!cmd)
        exit(1);
    snprintf(cmd, n, "fake_runner bisect %s %s %s %s", c->model, c->width, c->pass, c->mode);
    json_object_set_new(r, "backend", narrowed ? json_string("inductor") : json_null());
    json_object_set_new(r, "bisect_number", narrowed ? json_integer(0) : json_null());
    json_object_set_new(r, "command", json_string(cmd));
    json_object_set_new(r, "debug_info", narrowed ? json_string(key) : json_null());
    json_object_set_new(r, "narrowed", json_boolean(narrowed));
    json_object_set_new(r, "reason", narrowed ? json_null() : json_string(BISECT_NOTHING));
    json_object_set_new(r, "subsystem", narrowed ? json_string("lowerings") : json_null());
    txt = json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(r);
    free(cmd);
    if (!txt)
        exit(1);
    n = strlen(txt) + sizeof("compile_bisect=");
    msg = malloc(n);
    if (!msg)
        exit(1);
    snprintf(msg, n, "compile_bisect=%s", txt);
    free(txt);
    note("info", msg);
    free(msg);
    stream_end(sleep_before_end, with_end);
}

/* hello, env, n tensors, timing, memory, [end ok]: the `ok` stream (with
 * options.compiler_bisect run, bisect_stream instead). */
static void ok_stream(const struct cell *c, long n, long sleep_before_end, bool with_end)
{
    if (strcmp(c->compiler_bisect, "run") == 0) {
        bisect_stream(c, sleep_before_end, with_end);
        return;
    }
    hello();
    env_frame(c, effective_width(c));
    bool compiled = strcmp(c->mode, "eager") != 0;
    for (long i = compiled && n > 0 ? n - 1 : 0; i < n; i++)
        tensor(c, i, false);
    timing(c);
    stream_end(sleep_before_end, with_end);
}

/* ---- the heavier behaviors ------------------------------------------------ */

static char *u64dec(char *p, uint64_t v)
{
    char tmp[24];
    int n = 0;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* Headers of the size and shape the real runner writes, built by memcpy so
 * that the runner is never what a throughput benchmark measures. */
static void stream(const struct cell *c, long n, long pause_every)
{
    static const char hx[] = "0123456789abcdef";
    char line[1024];

    hello();
    env_frame(c, effective_width(c));
    for (long i = 0; i < n; i++) {
        uint64_t st = (uint64_t)i, h1 = splitmix(&st), h2 = splitmix(&st);
        char *p = line;

#define PUT(s) (memcpy(p, s, sizeof(s) - 1), p += sizeof(s) - 1)
        PUT("{\"kind\":\"tensor\",\"seq\":");
        p = u64dec(p, (uint64_t)i);
        PUT(",\"key\":\"model.layers.");
        p = u64dec(p, (uint64_t)i);
        PUT(".mlp.0.forward.output.0\",\"module\":\"model.layers.");
        p = u64dec(p, (uint64_t)i);
        PUT(".mlp\",\"call\":0,\"phase\":\"forward\",\"role\":\"output\",\"index\":0,"
            "\"dtype\":\"float32\",\"shape\":[2,16,32],\"numel\":1024,\"stats\":{"
            "\"min\":-3.4028234663852886,\"max\":3.3710644245147705,"
            "\"mean\":0.0016455090325325727,\"std\":0.9913885593414307,"
            "\"l2\":31.72466278076172,\"nan\":0,\"pinf\":0,\"ninf\":0,\"zeros\":0},\"hash\":\"");
        for (int k = 0; k < 16; k++)
            *p++ = hx[(h1 >> (4 * k)) & 15];
        for (int k = 0; k < 16; k++)
            *p++ = hx[(h2 >> (4 * k)) & 15];
        PUT("\",\"capture\":\"stats\"}\n");
#undef PUT
        out_raw(line, (size_t)(p - line));
        if (pause_every > 0 && (i + 1) % pause_every == 0) {
            out_flush();
            sleep_ms(1);
        }
    }
    end_frame("ok", NULL);
    out_flush();
}

/* 1 MiB float32 payloads, distinct per frame (storage deduplicates equal
 * content), hashed and summarized like the real runner. Only the last element
 * differs between frames, so the hash state and the sums of everything before
 * it are computed once: the runner must not be what a payload-throughput
 * benchmark measures. */
static void payload(const struct cell *c, long mb)
{
    const size_t n = (1u << 20) / sizeof(float);
    float *v = malloc(n * sizeof(float));
    uint64_t st = (uint64_t)c->seed;
    double mn = INFINITY, mx = -INFINITY, sum = 0, sq = 0;
    json_int_t zeros = 0;
    struct b2b prefix;
    char key[64], hash[33];

    if (!v)
        exit(1);
    hello();
    env_frame(c, effective_width(c));
    for (size_t j = 0; j < n - 1; j++) {
        v[j] = (float)((int64_t)(splitmix(&st) % 65536) - 32768) / 4096.0f;
        mn = v[j] < mn ? v[j] : mn;
        mx = v[j] > mx ? v[j] : mx;
        sum += v[j];
        sq += (double)v[j] * v[j];
        zeros += v[j] == 0;
    }
    b2b_init(&prefix, 16);
    b2b_update(&prefix, v, n * sizeof(float) - 128);
    for (long i = 0; i < mb; i++) {
        struct b2b ctx = prefix;
        double last, s1, s2, mean, var;
        json_t *h;

        v[n - 1] = -8.0f + (float)i / 65536.0f; /* exact, distinct per frame */
        last = v[n - 1];
        b2b_update(&ctx, (const char *)v + n * sizeof(float) - 128, 128);
        b2b_final_hex16(&ctx, hash);
        s1 = sum + last;
        s2 = sq + last * last;
        mean = s1 / (double)n;
        var = (s2 - s1 * mean) / (double)(n - 1);
        snprintf(key, sizeof(key), "layer%ld.0.forward.output.0", i);
        h = json_pack("{s:s,s:I,s:s,s:s,s:[I],s:I,s:{s:f,s:f,s:f,s:f,s:f,s:i,s:i,s:i,s:I},"
                      "s:s,s:s}",
                      "kind", "tensor", "seq", (json_int_t)i, "key", key, "dtype", "float32",
                      "shape", (json_int_t)n, "numel", (json_int_t)n, "stats", "min",
                      last < mn ? last : mn, "max", last > mx ? last : mx, "mean", mean, "std",
                      nsqrt(var > 0 ? var : 0), "l2", nsqrt(s2), "nan", 0, "pinf", 0, "ninf", 0,
                      "zeros", zeros + (last == 0), "hash", hash, "capture", "full");
        emit(h, v, n * sizeof(float), false);
    }
    end_frame("ok", NULL);
    free(v);
}

static void flood(long mb)
{
    char block[65536];
    size_t off = 0;
    uint64_t line = 0;
    uint64_t err_bytes = (uint64_t)mb << 16; /* mb / 16 MiB */

    while (off + 80 < sizeof(block))
        off += (size_t)snprintf(block + off, sizeof(block) - off,
                                "flood line %010llu: the quick brown fox jumps over the dog\n",
                                (unsigned long long)line++);
    for (uint64_t done = 0; done < (uint64_t)mb << 20; done += off)
        write_all(1, block, off);
    if (err_bytes < 65536)
        err_bytes = 65536;
    for (uint64_t done = 0; done < err_bytes; done += off)
        write_all(2, block, off);
}

static json_int_t soft_limit(int res)
{
    struct rlimit rl;

    if (getrlimit(res, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
        return -1;
    return (json_int_t)rl.rlim_cur;
}

/* Everything a test of the child's isolation wants to check, taken before
 * this process opens anything of its own. */
static json_t *isolation_report(void)
{
    json_t *envo = json_object(), *fds = json_array();
    char cwd[4096];
    DIR *d;
    int pdeath = 0;

    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');

        if (eq)
            json_object_setn_new(envo, *e, (size_t)(eq - *e), json_string(eq + 1));
    }
    d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *de;

        while ((de = readdir(d))) {
            int fd = atoi(de->d_name);

            if (de->d_name[0] != '.' && fd != dirfd(d))
                json_array_append_new(fds, json_integer(fd));
        }
        closedir(d);
    }
    prctl(PR_GET_PDEATHSIG, &pdeath);
    return json_pack("{s:o,s:o,s:s,s:I,s:I,s:I,s:I,s:i,s:{s:I,s:I,s:I,s:I,s:I}}", "environ", envo,
                     "fds", fds, "cwd", getcwd(cwd, sizeof(cwd)) ? cwd : "", "pid",
                     (json_int_t)getpid(), "ppid", (json_int_t)getppid(), "pgid",
                     (json_int_t)getpgrp(), "sid", (json_int_t)getsid(0), "pdeathsig", pdeath,
                     "rlimits", "as", soft_limit(RLIMIT_AS), "cpu", soft_limit(RLIMIT_CPU),
                     "nofile", soft_limit(RLIMIT_NOFILE), "nproc", soft_limit(RLIMIT_NPROC), "core",
                     soft_limit(RLIMIT_CORE));
}

static unsigned max_seconds(void)
{
    const char *s = getenv("FAKE_MAX_SECONDS");

    return s ? (unsigned)strtoul(s, NULL, 10) : 600;
}

static void grandchild(const struct cell *c)
{
    char path[4096], tmp[4200], pid[32];
    pid_t g;
    int fd, n;

    g = fork();
    if (g < 0) {
        perror("fake_runner: fork");
        exit(1);
    }
    if (g == 0) {
        /* fork() clears the alarm; the grandchild needs its own. */
        alarm(max_seconds());
        if (c->arg && strcmp(c->arg, "exit_closed") == 0) {
            close(0);
            close(1);
            close(2);
            close(out.fd);
        }
        for (;;)
            pause();
    }
    snprintf(path, sizeof(path), "%s/grandchild.pid", c->scratch);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    n = snprintf(pid, sizeof(pid), "%d\n", (int)g);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, pid, (size_t)n) != n || close(fd) < 0 || rename(tmp, path) < 0) {
        perror("fake_runner: grandchild.pid");
        exit(1);
    }
    if (c->arg && strncmp(c->arg, "exit", 4) == 0) {
        ok_stream(c, 3, 0, true);
        exit(0);
    }
    hello();
    hang();
}

static void memhog(const struct cell *c, long mb)
{
    hello();
    env_frame(c, effective_width(c));
    out_flush();
    for (long i = 0; i < mb / 4; i++) {
        char *p = malloc(4u << 20);
        if (!p)
            exit(42);
        memset(p, (int)(i & 0xff) | 1, 4u << 20);
        sleep_ms(5);
    }
    end_frame("ok", NULL);
    out_flush();
    exit(0);
}

static void oom(void)
{
    const char *capenv = getenv("FAKE_OOM_CAP_MB");
    uint64_t cap = (capenv ? strtoull(capenv, NULL, 10) : 2048) << 20;
    bool limited = soft_limit(RLIMIT_AS) >= 0;
    size_t block = 1u << 20;
    uint64_t total = 0;
    char msg[160];
    int n;

    hello();
    for (;;) {
        char *p;

        if (!limited && total + block > cap) {
            n = snprintf(msg, sizeof(msg),
                         "{\"kind\":\"note\",\"level\":\"error\",\"message\":\"no address-space "
                         "limit; stopped at %llu MiB\"}\n",
                         (unsigned long long)(total >> 20));
            write_all(out.fd, msg, (size_t)n);
            exit(43);
        }
        p = malloc(block);
        if (!p) {
            /* No allocation from here on: format by hand. */
            n = snprintf(msg, sizeof(msg),
                         "{\"kind\":\"note\",\"level\":\"error\",\"message\":\"malloc of %zu "
                         "bytes failed after %llu MiB\"}\n",
                         block, (unsigned long long)(total >> 20));
            write_all(out.fd, msg, (size_t)n);
            exit(42);
        }
        memset(p, 0xa5, block);
        total += block;
        if (block < (64u << 20))
            block *= 2;
    }
}

/* ---- spec ----------------------------------------------------------------- */

static void __attribute__((noreturn)) spec_failure(const char *why)
{
    char reason[512];

    fprintf(stderr, "fake_runner: %s\n", why);
    snprintf(reason, sizeof(reason), "fake_runner: %s", why);
    out.tolerate = true;
    hello();
    end_frame("failed", reason);
    exit(2);
}

static json_t *load_spec(struct cell *c)
{
    const char *path = getenv("CAPD_CELL_SPEC");
    json_error_t jerr;
    json_t *spec, *o;
    char why[400];
    const char *model, *rest, *sep;
    size_t blen;

    if (!path)
        spec_failure("CAPD_CELL_SPEC is not set");
    spec = json_load_file(path, 0, &jerr);
    if (!spec) {
        snprintf(why, sizeof(why), "cannot read cell spec %s: %s", path, jerr.text);
        spec_failure(why);
    }
    if (json_is_integer(json_object_get(spec, "frame_fd")))
        out.fd = (int)json_integer_value(json_object_get(spec, "frame_fd"));
    model = json_string_value(json_object_get(spec, "model"));
    c->model = model ? model : "";
    c->width = json_string_value(json_object_get(spec, "width"));
    c->width = c->width ? c->width : "default";
    c->pass = json_string_value(json_object_get(spec, "pass"));
    c->pass = c->pass ? c->pass : "forward";
    c->mode = json_string_value(json_object_get(spec, "mode"));
    c->mode = c->mode ? c->mode : "eager";
    c->device = json_string_value(json_object_get(spec, "device"));
    c->device = c->device ? c->device : "cpu";
    c->scratch = json_string_value(json_object_get(spec, "scratch"));
    c->scratch = c->scratch ? c->scratch : ".";
    o = json_object_get(spec, "options");
    c->capture = json_string_value(json_object_get(o, "capture"));
    c->capture = c->capture ? c->capture : "stats";
    c->target_op = json_string_value(json_object_get(o, "target_op"));
    c->target_inputs = json_string_value(json_object_get(o, "target_inputs"));
    c->profile = json_string_value(json_object_get(o, "profile"));
    c->profile = c->profile ? c->profile : "auto";
    c->compiler_bisect = json_string_value(json_object_get(o, "compiler_bisect"));
    c->compiler_bisect = c->compiler_bisect ? c->compiler_bisect : "auto";
#define OPT_INT(field, dflt)                                                                       \
    c->field = json_is_integer(json_object_get(o, #field))                                         \
                   ? json_integer_value(json_object_get(o, #field))                                \
                   : (dflt)
    OPT_INT(seed, 0);
    OPT_INT(iterations, 20);
    OPT_INT(warmup, 3);
    OPT_INT(threads, 1);
    OPT_INT(sample_size, 256);
    OPT_INT(timing_processes, 5);
    OPT_INT(timing_pairs, 4);
    OPT_INT(max_timing_rounds, 3);
#undef OPT_INT
    c->reference = json_is_object(json_object_get(spec, "reference"))
                       ? json_object_get(spec, "reference")
                       : NULL;
    if (c->timing_pairs < 0 || c->timing_pairs > 64)
        c->timing_pairs = 4;
    if (c->max_timing_rounds < 1 || c->max_timing_rounds > 8)
        c->max_timing_rounds = 3;
    if (c->timing_processes < 1 || c->timing_processes > 64)
        c->timing_processes = 5;
    if (c->iterations < 0 || c->iterations > 100000)
        c->iterations = 20;

    /* "fake:<behavior>[:<arg>]" or "fake:<behavior>[__<arg>]" */
    c->behavior[0] = '\0';
    c->arg = NULL;
    if (strncmp(c->model, "fake:", 5) == 0) {
        rest = c->model + 5;
        sep = rest + strcspn(rest, ":_");
        while (*sep == '_' && sep[1] != '_')
            sep = sep + 1 + strcspn(sep + 1, ":_"); /* a lone '_' is part of the name */
        blen = (size_t)(sep - rest);
        if (blen < sizeof(c->behavior)) {
            memcpy(c->behavior, rest, blen);
            c->behavior[blen] = '\0';
        }
        c->arg = *sep == ':' ? sep + 1 : *sep == '_' ? sep + 2 : NULL;
    }
    return spec;
}

int main(void)
{
    struct cell c;
    json_t *spec, *report = NULL;
    const char *b;
    char reason[256];

    signal(SIGPIPE, SIG_IGN);
    load_env_file();
    spec = load_spec(&c);
    b = c.behavior;
    alarm(max_seconds());

    if (strcmp(b, "ok") == 0) {
        ok_stream(&c, arg_long(&c, 3), 0, true);
    } else if (strcmp(b, "ops") == 0) {
        c.target_inputs ? op_replay_stream(&c) : ops_stream(&c, arg_long(&c, 3));
    } else if (strcmp(b, "hello_end") == 0) {
        char buf[512];
        int n = snprintf(buf, sizeof(buf),
                         "{\"kind\":\"hello\",\"protocol\":1,\"runner\":\"fake_runner/1\"}\n"
                         "{\"kind\":\"env\",\"fingerprint\":{\"runner\":\"fake_runner\"},"
                         "\"effective_width\":\"%s\"}\n"
                         "{\"kind\":\"end\",\"status\":\"ok\"}\n",
                         effective_width(&c));
        write_all(out.fd, buf, (size_t)n);
    } else if (strcmp(b, "stream") == 0) {
        stream(&c, arg_long(&c, 100000), 0);
    } else if (strcmp(b, "trickle") == 0) {
        stream(&c, arg_long(&c, 2000), 4);
    } else if (strcmp(b, "payload") == 0) {
        payload(&c, arg_long(&c, 64));
    } else if (strcmp(b, "segv") == 0 || strcmp(b, "abort") == 0) {
        hello();
        env_frame(&c, effective_width(&c));
        tensor(&c, 0, false);
        tensor(&c, 1, false);
        if (strcmp(b, "abort") == 0)
            abort();
        {
            /* volatile twice, so the compiler can neither see the null
             * pointer nor turn the store into a trap instruction. */
            volatile int *volatile np = NULL;

            *np = 1;
        }
        raise(SIGSEGV);
    } else if (strcmp(b, "exit3") == 0) {
        hello();
        exit(3);
    } else if (strcmp(b, "noend") == 0) {
        ok_stream(&c, 3, 0, false);
    } else if (strcmp(b, "failed") == 0) {
        hello();
        env_frame(&c, effective_width(&c));
        end_frame("failed", "fake failure requested");
        exit(1);
    } else if (strcmp(b, "unsupported") == 0) {
        const char *eff = strcmp(c.width, "default") == 0 ? "avx2" : "default";

        snprintf(reason, sizeof(reason), "requested width %s, effective %s", c.width, eff);
        hello();
        env_frame(&c, eff);
        end_frame("unsupported", reason);
    } else if (strcmp(b, "hang") == 0) {
        hello();
        hang();
    } else if (strcmp(b, "ignore_term") == 0) {
        signal(SIGTERM, SIG_IGN);
        hello();
        hang();
    } else if (strcmp(b, "grandchild") == 0) {
        grandchild(&c);
    } else if (strcmp(b, "flood") == 0) {
        flood(arg_long(&c, 1024));
        ok_stream(&c, 3, 0, true);
    } else if (strcmp(b, "garbage") == 0) {
        out.tolerate = true;
        hello();
        out_raw("this is not json\n", 17);
        out_flush();
    } else if (strcmp(b, "long_header") == 0) {
        static const char pre[] = "{\"kind\":\"note\",\"level\":\"info\",\"message\":\"";
        char *line = malloc(70000);

        out.tolerate = true;
        hello();
        memset(line, 'x', 70000);
        memcpy(line, pre, sizeof(pre) - 1);
        memcpy(line + 70000 - 3, "\"}\n", 3);
        write_all(out.fd, line, 70000);
        free(line);
    } else if (strcmp(b, "short_payload") == 0) {
        static const char hdr[] =
            "{\"kind\":\"tensor\",\"seq\":0,\"key\":\"layer0.0.forward.output.0\","
            "\"dtype\":\"float32\",\"shape\":[1024],\"numel\":1024,\"stats\":{},"
            "\"hash\":\"00000000000000000000000000000000\",\"capture\":\"full\","
            "\"nbytes\":4096}\n";
        char junk[100];

        out.tolerate = true;
        hello();
        env_frame(&c, effective_width(&c));
        out_raw(hdr, sizeof(hdr) - 1);
        memset(junk, 0x5a, sizeof(junk));
        out_raw(junk, sizeof(junk));
        out_flush();
    } else if (strcmp(b, "close_fd3") == 0) {
        hello();
        close(out.fd);
        sleep_ms(1000);
    } else if (strcmp(b, "oom") == 0) {
        oom();
    } else if (strcmp(b, "memhog") == 0) {
        memhog(&c, arg_long(&c, 1024));
    } else if (strcmp(b, "slow") == 0) {
        ok_stream(&c, 3, arg_long(&c, 1000), true);
    } else if (strcmp(b, "echo_env") == 0) {
        char *msg;

        report = isolation_report();
        if (json_object_get(spec, "device_share"))
            json_object_set(report, "device_share", json_object_get(spec, "device_share"));
        msg = json_dumps(report, JSON_COMPACT);
        hello();
        note("info", msg ? msg : "{}");
        free(msg);
        env_frame(&c, effective_width(&c));
        for (long i = 0; i < 3; i++)
            tensor(&c, i, false);
        timing(&c);
        memory();
        out_flush();
        sleep_ms(arg_long(&c, 0));
        end_frame("ok", NULL);
    } else if (strcmp(b, "devoom") == 0) {
        /* What the real runner sends for torch.OutOfMemoryError. */
        const char *share = json_string_value(json_object_get(spec, "device_share"));
        if ((c.arg && strcmp(c.arg, "always") == 0) || (share && strcmp(share, "shared") == 0)) {
            hello();
            env_frame(&c, effective_width(&c));
            out_flush();
            sleep_ms(300);
            end_frame("oom", "the framework could not allocate memory: OutOfMemoryError: CUDA "
                             "out of memory. Tried to allocate 2.00 GiB");
            out_flush();
            exit(1);
        }
        ok_stream(&c, 3, 300, true);
    } else if (strcmp(b, "devfail") == 0) {
        /* What the real runner sends when the device fails under the model. */
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        if (!c.arg || (vis && strcmp(vis, c.arg) == 0)) {
            hello();
            env_frame(&c, effective_width(&c));
            end_frame("failed", "exception in model code: RuntimeError: CUDA error: uncorrectable "
                                "ECC error encountered");
            out_flush();
            exit(1);
        }
        ok_stream(&c, 3, 300, true);
    } else if (strcmp(b, "cpu") == 0) {
        volatile double x = 1.0;

        hello();
        out_flush();
        for (;;)
            x = x * 1.0000001 + 1e-9;
    } else {
        snprintf(reason, sizeof(reason), "unknown fake behavior \"%.200s\"", c.model);
        hello();
        end_frame("failed", reason);
        exit(2);
    }
    out_flush();
    json_decref(report);
    json_decref(spec);
    return 0;
}
