/*
 * compare/cmp.h - the comparison engine: what changed between a control and
 * a branch head.
 *
 * This header is the module's whole story. The engine is pure computation:
 * it never reads a file, a socket or the clock. Storage fills two "sides"
 * (the cells of the control job and of the head job) with the records the
 * runners emitted, cmp_compare() matches them and returns one jansson object
 * whose fields are documented in docs/compare.md, and the renderers turn that
 * object into a PR comment, written into a capped report (struct cmp_report)
 * that other reports of a result (the API's width self-check) write into
 * too. Besides the numbers, the result says what else differs between the
 * two sides' builds and machines ("environment", from the runners'
 * fingerprints), so a divergence can be read against its cause.
 *
 * Conventions (as everywhere in capd): functions return 0 or a negative errno
 * and fill an out-parameter; strings handed in are copied unless a comment
 * says "borrowed"; every growing array has a named maximum (CMP_MAX_*), and
 * crossing it returns -E2BIG instead of growing without bound.
 *
 * Thread safety: nothing here has global state. A side may be read by many
 * concurrent cmp_compare() calls once it is fully built; building it is not
 * thread-safe. A cmp_scratch belongs to one thread at a time.
 *
 * Typical use, from storage:
 *
 *     struct cmp_side *ctl = NULL, *head = NULL;
 *     struct cmp_cell *c;
 *     cmp_side_new(&ctl);
 *     cmp_side_add_cell(ctl, "mlp", "avx2", "forward", &c);
 *     cmp_cell_set_outcome(c, "ok");
 *     cmp_cell_add_tensor(c, &t);               // once per tensor frame
 *     cmp_cell_mark_nondeterministic(c, key);   // from the nondeterministic frame
 *     cmp_cell_add_timing_process(c, wall, n, -1, false);  // once per timing process
 *     cmp_cell_set_process_own(c, own, n);      // its other clocks, where the runner
 *     cmp_cell_set_process_totals(c, &totals);  // sent them
 *     cmp_cell_set_memory(c, peak_rss, -1);
 *     cmp_cell_set_fingerprint(c, fp);          // the env frame's fingerprint
 *     ... same for head ...
 *     struct cmp_options o;
 *     cmp_options_init(&o);
 *     cmp_options_apply_json(&o, job_options, &err);   // optional
 *     json_t *result;
 *     cmp_compare(ctl, head, &o, &result);
 *     char *md = cmp_result_to_markdown(result);
 */
#ifndef CAPD_COMPARE_CMP_H
#define CAPD_COMPARE_CMP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "util/buf.h"

/* ---------------------------------------------------------------- limits */

#define CMP_MAX_NDIM             8       /* dimensions of one tensor */
#define CMP_MAX_KEY              4096    /* bytes of a record key, module, hash */
#define CMP_MAX_TENSORS          2000000 /* tensor records per cell (= frames per cell) */
#define CMP_MAX_CELLS            4096    /* cells per side */
#define CMP_MAX_TIMING_SAMPLES   10000   /* timing samples per cell (bounds the bootstrap) */
#define CMP_MAX_TIMING_NS        (INT64_C(1) << 60) /* one sample, so differences never overflow */
#define CMP_MAX_TIMING_PROCESSES 1024               /* timing processes per cell (observations) */
#define CMP_MAX_KEY_TOLS         32                 /* key-pattern tolerance overrides */
#define CMP_MAX_PATTERN          256                /* bytes of one pattern, with its NUL */
#define CMP_MAX_WIDTH_NAME       32                 /* bytes of a width name, with its NUL */
#define CMP_MAX_MODE_NAME        32                 /* bytes of a mode name, with its NUL */
#define CMP_MAX_BOOTSTRAP        100000             /* bootstrap resamples */
#define CMP_MAX_RENDER           (1u << 20)         /* bytes of a rendered markdown/text report */
#define CMP_SCRATCH_MAX_ELEMS    (1 << 20)          /* doubles held for the p99 selection */
#define CMP_MAX_FINGERPRINT      (1u << 20)         /* bytes of one fingerprint, as compact JSON */
#define CMP_MAX_ENV_FIELDS       2048               /* fields of one flattened fingerprint */
#define CMP_MAX_ENV_NAME         256                /* bytes of a field name, with its NUL */
#define CMP_MAX_ENV_VALUE        8192               /* bytes of a field value kept (longer: cut) */
#define CMP_MAX_ENV_DIFFS        256                /* differences listed in the result */
#define CMP_MAX_PROFILE_ENTRIES  4096 /* modules or operators of one profiled process */
#define CMP_PROFILE_TOP          10   /* modules and operators an explanation lists */

/* ------------------------------------------------------------- the input */

/*
 * The numeric dtypes the engine can decode. Anything else (complex64, quantized
 * types, float8...) is CMP_DTYPE_OTHER: still matched and checked for bit
 * identity and statistics, but its payload is never decoded. The tolerance
 * table in struct cmp_options is indexed by this enum.
 */
enum cmp_dtype {
    CMP_DTYPE_FLOAT32,
    CMP_DTYPE_FLOAT64,
    CMP_DTYPE_FLOAT16,
    CMP_DTYPE_BFLOAT16,
    CMP_DTYPE_INT8,
    CMP_DTYPE_UINT8,
    CMP_DTYPE_INT16,
    CMP_DTYPE_INT32,
    CMP_DTYPE_INT64,
    CMP_DTYPE_BOOL,
    CMP_DTYPE_OTHER,
    CMP_DTYPE__COUNT
};

/* What a record's payload holds (protocol.md, "capture"). */
enum cmp_capture {
    CMP_CAPTURE_NONE,   /* "stats": no payload */
    CMP_CAPTURE_SAMPLE, /* k elements at flat positions floor(i*numel/k) */
    CMP_CAPTURE_FULL    /* all numel elements, C-contiguous */
};

/*
 * Statistics as the runner computed them: min..l2 over the finite elements
 * (has_finite false when there is none, i.e. the runner sent null), the
 * counts over all elements.
 */
struct cmp_stats {
    bool has_finite;
    double min, max, mean, std, l2;
    int64_t nan, pinf, ninf, zeros;
};

/*
 * One tensor record, as handed to cmp_cell_add_tensor(). Every string is
 * copied into the cell; the payload is BORROWED: it must stay valid and
 * unchanged until the last cmp_compare() on this cell has returned (storage
 * typically keeps its decompressed blobs alive for the request).
 *
 * dtype, phase and role are the protocol's strings. module, phase and role may
 * be NULL, in which case they are parsed from the key
 * (<module>.<call>.<phase>.<role>.<index>); call is only read when module is
 * given. The payload must be little-endian; payload_len must be a whole number
 * of elements: numel of them for CMP_CAPTURE_FULL, 1..numel for
 * CMP_CAPTURE_SAMPLE. ndim 0 is a scalar (numel 1).
 */
struct cmp_tensor {
    const char *key;
    int64_t seq;
    const char *module;
    int64_t call;
    const char *phase;
    const char *role;
    const char *dtype;
    int ndim;
    int64_t shape[CMP_MAX_NDIM];
    int64_t numel;
    struct cmp_stats stats;
    const char *hash; /* NULL or "" = unknown: never bit-identical */
    /* The algorithm of hash (the protocol's "hash_alg"); NULL or "" is
     * CMP_HASH_ALG_DEFAULT. Two records of different algorithms are never
     * identical by hash: they are judged on payloads and statistics and
     * the pair says so (cmp_metrics.hash_alg_mixed). */
    const char *hash_alg;
    enum cmp_capture capture;
    const void *payload;
    size_t payload_len;
    bool nondeterministic;
};

/* The algorithm of a record that names none (every runner before "hash_alg"). */
#define CMP_HASH_ALG_DEFAULT "blake2b-128"

/* The cells of one side of a comparison (usually: one job). Opaque. */
struct cmp_side;
/* One (model, width, pass) cell of a side; owned by its side. Opaque. */
struct cmp_cell;

int cmp_side_new(struct cmp_side **side_out);
/* Frees the side, its cells and every copied string. NULL is fine. */
void cmp_side_free(struct cmp_side *side);

/*
 * Adds an empty cell and returns a borrowed pointer to it, valid until the
 * side is freed. -EEXIST when the side already has that (model, width, pass),
 * -E2BIG past CMP_MAX_CELLS, -EINVAL on NULL or over-long names. The cell's
 * mode is eager.
 */
int cmp_side_add_cell(struct cmp_side *side, const char *model, const char *width, const char *pass,
                      struct cmp_cell **cell_out);
/* The same with the cell's compile MODE (eager, aot_eager, inductor), part
 * of its identity: a control and a head cell pair only in the same mode,
 * and -EEXIST names (model, width, pass, mode). */
int cmp_side_add_cell_mode(struct cmp_side *side, const char *model, const char *width,
                           const char *pass, const char *mode, struct cmp_cell **cell_out);

/*
 * The cell's outcome: the name of a cell state (util/cellstate.h: ok,
 * failed, crashed, timeout, oom, cancelled, unsupported, protocol_error,
 * interrupted, queued or running); -EINVAL for any other word. A cell whose
 * outcome was never set is treated as not ok.
 */
int cmp_cell_set_outcome(struct cmp_cell *cell, const char *outcome);
/*
 * Echoed in the result. NULL leaves that value as it was, so the cell row
 * and the env frame can each supply what they know. The device is "cpu"
 * or the GPU's model name; cells on different devices are not compared
 * unless cmp_options.allow_device_mismatch is set.
 */
int cmp_cell_set_env(struct cmp_cell *cell, const char *effective_width, const char *device);
/*
 * The cell was not run because its host's CPU lacks the width (capd ended it
 * unsupported before starting it): MISSING names what the host lacked
 * ("avx512f, avx512bw", "arch:ppc64le"). Such a pair is `not_run`: counted
 * and listed, never a regression and never incomparable (docs/compare.md).
 * NULL or "" clears it. -EINVAL past CMP_MAX_KEY.
 */
int cmp_cell_set_host_missing(struct cmp_cell *cell, const char *missing);
/*
 * The runner's fingerprint of the cell (the env frame's "fingerprint" object,
 * docs/runner.md), for the result's "environment" section (docs/compare.md,
 * "Environment"). It is flattened into named fields at once and not kept;
 * cells of a side with equal fingerprints share one flattened copy, so a
 * job of a thousand cells costs a handful. Environment variables outside
 * the allow-list are dropped here, and the values of credential-like ones
 * are kept only as a digest. Setting it again replaces it. -EINVAL when fp
 * is not an object, -E2BIG past CMP_MAX_FINGERPRINT bytes or
 * CMP_MAX_ENV_FIELDS fields (the cell then keeps none), -ENOMEM.
 */
int cmp_cell_set_fingerprint(struct cmp_cell *cell, const json_t *fp);
/* Peak RSS and device peak in bytes; a negative value means "not reported". */
void cmp_cell_set_memory(struct cmp_cell *cell, int64_t peak_rss_bytes, int64_t device_peak_bytes);
/* A compiled cell's compile time in nanoseconds: its capture process's
 * cold compile (the runner's compile_s note, docs/runner.md), reported
 * beside the steady-state timing (perf.control_compile_ns ..., never
 * judged); a negative value means "none". */
void cmp_cell_set_compile(struct cmp_cell *cell, int64_t compile_ns);
/*
 * Adds the samples of one timing process in nanoseconds (copied): each call
 * is one process, and the process contributes one observation, its median.
 * pair >= 0 ties the process to the reference process of the same pair (a
 * paired design); reference marks a process of the control's build timed in
 * this cell's own job (interleaved with this cell's processes). A cell whose
 * own processes all have a reference partner is compared on the pairs; any
 * other cell on its own processes against the control cell's. -EINVAL on a
 * negative value or one past CMP_MAX_TIMING_NS, -E2BIG past
 * CMP_MAX_TIMING_SAMPLES samples or CMP_MAX_TIMING_PROCESSES processes; on
 * error nothing is added. A process of no samples is ignored.
 */
int cmp_cell_add_timing_process(struct cmp_cell *cell, const int64_t *samples_ns, size_t n,
                                int64_t pair, bool reference);
/*
 * The same samples of the process added last, in its thread's CPU time
 * (the runner's cpu_samples_ns). Reported beside the basis; a comparison
 * judges on them (perf basis "cpu_time") only when every process it uses
 * has them and none is from a runner that measures own time (records
 * from before it, judged as they were then). -EINVAL as for
 * add_timing_process, or when no process was added; N 0 is ignored.
 */
int cmp_cell_set_process_cpu(struct cmp_cell *cell, const int64_t *cpu_ns, size_t n);
/*
 * The same samples of the process added last in its own time (the
 * runner's own_samples_ns): each wall sample less the run-queue delay of
 * the thread that ran the model during it, i.e. less the time other work
 * held that thread's CPU, with the code's own waiting (sleep, locks, I/O,
 * device synchronisation, the intra-op pool's barriers) kept in. OWN_NS[i]
 * belongs to wall sample i: N must be the process's sample count and no
 * value may exceed its wall sample. A comparison whose every process has
 * them judges on their medians (perf basis "own_time": docs/compare.md,
 * "Performance"). -EINVAL otherwise, or when no process was added, and the
 * process is left as it was; N 0 is ignored.
 */
int cmp_cell_set_process_own(struct cmp_cell *cell, const int64_t *own_ns, size_t n);
/*
 * The same samples of the process added last in the device's time (the
 * runner's device_samples_ns on a GPU cell: device events recorded around
 * each sample's iterations, so the kernels' time without the host's
 * launch and synchronisation overhead). A comparison whose every process
 * has them judges on them (perf basis "device_time"), own and wall time
 * beside it. N must be the process's sample count. -EINVAL otherwise, as
 * for add_timing_process, or when no process was added; N 0 is ignored.
 */
int cmp_cell_set_process_device(struct cmp_cell *cell, const int64_t *device_ns, size_t n);
/*
 * What the process added last measured over its timed samples (the
 * runner's runqueue_ns, cpu_ns and steal_ns), reported per iteration
 * beside the basis and never judged. Setting them says the runner
 * measures own time where the kernel lets it: such a process without own
 * samples (the kernel keeps no run-queue delay) is judged on wall time,
 * never on CPU time. -EINVAL when no process was added, ITERATIONS <= 0
 * or a value is past CMP_MAX_TIMING_NS.
 */
struct cmp_proc_totals {
    int64_t iterations;  /* iterations timed: samples x loops */
    int64_t runqueue_ns; /* every thread's run-queue delay; < 0: the kernel keeps none */
    int64_t cpu_ns;      /* the process's CPU time, every thread; < 0: unknown */
    int64_t steal_ns;    /* the host's steal time, every CPU (context); < 0: not visible */
};
int cmp_cell_set_process_totals(struct cmp_cell *cell, const struct cmp_proc_totals *t);
/*
 * One side's profiled process (the runner's `profile` frame, docs/protocol.md):
 * the per-iteration self time of each module and operator of one control
 * or one head process, run after a paired cell's timing processes when its
 * pairs said regression. FRAME is kept (a reference) by its "side",
 * "control" or "head"; a later frame of that side replaces it. The
 * comparison explains the cell's perf change with the two (perf.profile:
 * docs/compare.md, "Which op got slower"). -EINVAL when FRAME is not an
 * object with such a side, or lists more than CMP_MAX_PROFILE_ENTRIES
 * modules or operators; the cell then keeps what it had.
 */
int cmp_cell_set_profile(struct cmp_cell *cell, json_t *frame);
/* One unpaired process of this cell's own build: add_timing_process(.., -1, false). */
int cmp_cell_add_timing(struct cmp_cell *cell, const int64_t *samples_ns, size_t n);
/*
 * Adds one tensor record (see struct cmp_tensor for ownership). -EINVAL on a
 * malformed record (no key, ndim out of range, numel not the product of the
 * shape, a payload that is not a whole number of elements or too long),
 * -E2BIG past CMP_MAX_TENSORS. Keys should be unique within a cell; if one is
 * not, the record with the lowest seq is compared and the others are ignored.
 */
int cmp_cell_add_tensor(struct cmp_cell *cell, const struct cmp_tensor *t);
/*
 * Marks a key as nondeterministic (the `nondeterministic` frame, which comes
 * after the tensors). Marking a key the cell does not have is harmless.
 */
int cmp_cell_mark_nondeterministic(struct cmp_cell *cell, const char *key);

/* ----------------------------------------------------------- the options */

/*
 * The reference arbiter (docs/compare.md, "Reference arbiter"): a record
 * pair outside tolerance is judged again by its error against a reference,
 * the control cell's float64 records (ref.float64/<key>, job option
 * reference float64) or the control side's default-width cell of the same
 * model and pass. It passes when err(head) <= k * err(control) + atol / 10
 * (err the RMS difference from the reference over the captured values;
 * k 2, or 3 for float16, bfloat16 and tensors of at most 10 elements).
 */
enum cmp_reference { CMP_REF_NONE, CMP_REF_FLOAT64, CMP_REF_DEFAULT_WIDTH };
/* "none", "float64", "default-width"; the rule names "tolerance",
 * "reference_float64", "reference_default_width". */
const char *cmp_reference_name(enum cmp_reference r);
const char *cmp_reference_rule(enum cmp_reference r);
/* 0 and *out, or -EINVAL for a name that is none of them; NULL is none. */
int cmp_reference_from_name(const char *name, enum cmp_reference *out);

struct cmp_tol {
    double atol, rtol;
};

/*
 * A tolerance for every record whose key matches the glob pattern (fnmatch(3)
 * without flags: '*' also matches '.'). A NaN atol or rtol keeps the dtype's
 * value. The first matching entry wins.
 */
struct cmp_key_tol {
    char pattern[CMP_MAX_PATTERN];
    double atol, rtol;
};

/*
 * Everything that can be tuned. A plain struct so callers can copy it; fill it
 * with cmp_options_init() and then either set fields or apply a JSON object.
 */
struct cmp_options {
    struct cmp_tol tol[CMP_DTYPE__COUNT]; /* per dtype; torch.testing defaults */
    struct cmp_key_tol key_tols[CMP_MAX_KEY_TOLS];
    size_t n_key_tols;
    double perf_threshold;   /* 0.05: the interval must lie past (or within) 1 +- this */
    double alpha;            /* 0.01: significance level of the rank test */
    uint64_t bootstrap_seed; /* 0x6361706463617064 ("capdcapd") */
    int bootstrap_resamples; /* 2000; 0 disables the interval */
    bool include_tensors;    /* add per-tensor rows to every cell */
    /*
     * Cells whose devices differ (cmp_cell_set_env: a GPU against "cpu", or
     * two GPU models) run different kernels, so their differences say
     * nothing about the change under review: such a pair is incomparable
     * ("device_mismatch") unless this is set. A device nobody set is not
     * a mismatch.
     */
    bool allow_device_mismatch;
    /*
     * Whether a perf regression fails the overall verdict (default true).
     * Perf is still computed and counted when false; a CI machine that is
     * shared with other work gates on numerics and outcomes only.
     */
    bool perf_gate;
    /*
     * Cross-width mode when both are non-empty: control cells of width
     * control_width are matched with head cells of width head_width on
     * (model, pass). Both sides may be the same struct cmp_side (one job).
     */
    char control_width[CMP_MAX_WIDTH_NAME];
    char head_width[CMP_MAX_WIDTH_NAME];
    /*
     * Cross-mode when both are non-empty: control cells of mode
     * control_mode (eager) are matched with head cells of mode head_mode
     * (a compiled one) on (model, width, pass); with cross-width too, on
     * (model, pass). The head records at a coarser grain (docs/runner.md,
     * "Compiled cells"): a control key it lacks is not a missing key; the
     * head's keys are the ones compared.
     */
    char control_mode[CMP_MAX_MODE_NAME];
    char head_mode[CMP_MAX_MODE_NAME];
    enum cmp_reference reference; /* CMP_REF_NONE: the tolerance rule alone */
};

/* Where a rejected option is and why, for the API's error body. */
struct cmp_err {
    char field[128]; /* e.g. "key_tolerances[2].atol" */
    char message[192];
};

void cmp_options_init(struct cmp_options *opt);

/*
 * Applies overrides from a JSON object:
 *
 *   {"tolerances": {"float32": {"atol": 1e-5, "rtol": 1.3e-6}, ...},
 *    "key_tolerances": [{"pattern": "*.attn.*", "atol": 1e-4, "rtol": 1e-3}],
 *    "perf_threshold": 0.05, "alpha": 0.01,
 *    "bootstrap": {"seed": 7, "resamples": 2000},
 *    "include_tensors": true,
 *    "cross_width": {"control": "default", "head": "avx512"},
 *    "allow_device_mismatch": false, "perf_gate": true,
 *    "reference": "float64"}
 *
 * Every field is optional; unknown fields are errors (a typo must not silently
 * keep a default). New key_tolerances go before the existing ones so that the
 * most recently applied override wins. Returns 0, or -EINVAL with err filled
 * (err may be NULL) and opt left exactly as it was.
 */
int cmp_options_apply_json(struct cmp_options *opt, const json_t *overrides, struct cmp_err *err);

/* ---------------------------------------------------------- the engine */

/*
 * Compares the head side against the control side and returns a new JSON
 * object (docs/compare.md, "Result"). opt may be NULL for the defaults.
 * control and head may be the same side (cross-width mode). Returns 0,
 * -ENOMEM, or -EINVAL (bad options).
 */
int cmp_compare(const struct cmp_side *control, const struct cmp_side *head,
                const struct cmp_options *opt, json_t **result_out);

/* -------------------------------------- single tensors and samples, exposed
 * for tests, the benchmark and callers that want one number. */

enum cmp_basis {
    CMP_BASIS_EXACT,  /* bit-identical: nothing else was computed */
    CMP_BASIS_FULL,   /* both full payloads */
    CMP_BASIS_SAMPLE, /* the shared stride sample */
    CMP_BASIS_STATS   /* statistics only */
};

enum cmp_mismatch { CMP_MISMATCH_NONE, CMP_MISMATCH_DTYPE, CMP_MISMATCH_SHAPE };

/*
 * The metrics of one tensor pair, a = head, b = control, d = a - b, in double.
 * Element metrics are over the n_finite positions where both sides are
 * finite; non-finite positions are classified into the *_one_sided and
 * *_both counts instead. With basis STATS the element metrics are NaN and
 * stat_violations counts the failed statistic checks (docs/compare.md).
 */
struct cmp_metrics {
    enum cmp_basis basis;
    enum cmp_mismatch mismatch;
    bool within_tol;     /* identical, or no violation and nothing one-sided */
    bool hash_alg_mixed; /* both hashed, by different algorithms: not judged by hash */
    double atol, rtol;   /* the tolerance that was applied */
    int64_t n;           /* positions compared */
    int64_t n_finite;
    double max_abs, mean_abs, p99_abs;
    double max_rel, mean_rel;
    int64_t allclose_violations;
    int64_t stat_violations;
    double cosine, sqnr_db, nl2;
    int64_t nan_one_sided, inf_one_sided;
    int64_t nan_both, inf_both;
    /* head statistic - control statistic; NaN when either has no finite value */
    double d_min, d_max, d_mean, d_l2;
};

/*
 * Working memory reused across tensors (a selection buffer, bounded by
 * CMP_SCRATCH_MAX_ELEMS doubles whatever the tensor size). Passing NULL to
 * cmp_tensor_compare() allocates a temporary one.
 */
struct cmp_scratch;
int cmp_scratch_new(struct cmp_scratch **out);
void cmp_scratch_free(struct cmp_scratch *s);

/*
 * Compares one pair with the given tolerance (NULL: the dtype's default from
 * cmp_options_init()). Returns 0, -ENOMEM, or -EINVAL on a malformed record.
 */
int cmp_tensor_compare(const struct cmp_tensor *head, const struct cmp_tensor *control,
                       const struct cmp_tol *tol, struct cmp_scratch *scratch,
                       struct cmp_metrics *out);

/*
 * Sizes of a pair's error derived from the two sides' statistics alone, for
 * the `stats` basis where no element was captured (compare/derived.c,
 * docs/compare.md "Sizes derived from statistics"). With d = head - control
 * over the n finite positions (std the population std, as the runner
 * records it), each *_lower is a proven lower bound:
 *   l2_lower      = max(|l2_h - l2_c|, sqrt(n) * hypot(dmean, dstd))
 *                   (reverse triangle inequality on x and on x - mean)
 *   rms_lower     = l2_lower / sqrt(n)
 *   max_abs_lower = max(|dmin|, |dmax|, rms_lower)
 *   rel_l2_lower  = l2_lower / l2_c       (bounds nl2 from below)
 *   max_rel_lower = max_abs_lower / max(|min_c|, |max_c|) (bounds max_rel)
 * A relative value is +inf when the control's scale is 0 and the error is
 * not. -ENODATA when nothing can be derived: a side without finite values,
 * different element counts or different non-finite counts (the bounds
 * assume the finite positions are the same ones).
 */
struct cmp_derived {
    int64_t n;
    double abs_dmean, abs_dstd, abs_dmin, abs_dmax;
    double l2_lower, rms_lower, max_abs_lower;
    double control_rms, control_max_abs;
    double rel_l2_lower, max_rel_lower;
};
int cmp_stats_derive(const struct cmp_stats *head, const struct cmp_stats *control,
                     int64_t numel_head, int64_t numel_control, struct cmp_derived *out);

/*
 * Perf verdicts (docs/compare.md, "Perf"). The unit of evidence is a timing
 * process: iterations inside one process share its memory layout, clock and
 * neighbours, so each process contributes one observation, the median of its
 * samples. UNKNOWN means the evidence allows neither "changed" nor "same";
 * INSUFFICIENT_DATA means the test cannot reach alpha with this many
 * observations at all; UNSTABLE means the within-side spread is wider than
 * the threshold, so no verdict about a change of that size is honest. Only
 * REGRESSION gates.
 */
enum cmp_perf_verdict {
    CMP_PERF_INSUFFICIENT_DATA,
    CMP_PERF_SAME,
    CMP_PERF_UNKNOWN,
    CMP_PERF_REGRESSION,
    CMP_PERF_IMPROVEMENT,
    CMP_PERF_UNSTABLE
};

/*
 * PAIRED: observation i of the control and of the head were taken back to
 * back (interleaved in one job, same host and CPUs), so the test is on the
 * per-pair log ratios (Wilcoxon signed-rank, bootstrap over pairs).
 * UNPAIRED: two independent sets of process medians (Mann-Whitney, bootstrap
 * of the ratio of medians).
 */
enum cmp_perf_design { CMP_PERF_UNPAIRED, CMP_PERF_PAIRED };

/*
 * Which clock a cell's observations are medians of (cmp__perf_cells):
 * OWN_TIME when every process the design uses has own samples; else
 * WALL_TIME, or CPU_TIME for records from before own time whose every
 * process has CPU-time samples (judged as they were then). why says why
 * the basis is not OWN_TIME.
 */
enum cmp_perf_basis {
    CMP_PERF_WALL_TIME,
    CMP_PERF_CPU_TIME,
    CMP_PERF_OWN_TIME,
    CMP_PERF_DEVICE_TIME
};
enum cmp_perf_basis_why {
    CMP_PERF_WHY_NONE,        /* own time, or device time */
    CMP_PERF_WHY_NO_RUNQUEUE, /* the kernel kept no run-queue delay for some processes */
    CMP_PERF_WHY_MIXED,       /* some processes are from a runner without own time */
    CMP_PERF_WHY_OLD_CPU,     /* records from before own time, CPU time on every process */
    CMP_PERF_WHY_OLD_WALL     /* records from before own time, without it */
};

/* The medians, over one side's observations, of each clock per iteration
 * (NaN where none of them has it); the basis's is that side's median. */
struct cmp_perf_times {
    double wall_ns, own_ns, cpu_ns, runqueue_ns; /* per-sample medians: timing thread */
    double proc_runqueue_ns, proc_cpu_ns;        /* every thread of the process */
    double steal_ns;                             /* the host's, every CPU: context */
    double device_ns;                            /* the device's time (a GPU cell) */
};

/*
 * `same` is an equivalence test (two one-sided tests, TOST): each side of
 * the band [1 - perf_threshold, 1 + perf_threshold] rejected at this level,
 * i.e. the 1 - 2 * CMP_EQUIV_ALPHA (90%) interval inside the band. An
 * alarm keeps the stricter alpha (0.01) and its 99% interval: a false
 * `same` hides a change smaller than the interval can resolve, a false
 * alarm fails a build (docs/compare.md, "verdict").
 */
#define CMP_EQUIV_ALPHA 0.05

struct cmp_perf {
    enum cmp_perf_design design;
    size_t n_control, n_head;             /* observations: timing processes (pairs when paired) */
    size_t samples_control, samples_head; /* iteration samples behind them (display) */
    double control_median_ns, head_median_ns; /* medians of the process medians */
    double ratio;        /* head / control: of medians, or exp(mean log pair ratio) */
    double ci_lo, ci_hi; /* 99% interval of the ratio (bootstrap; t paired); NaN if none */
    double eq_lo, eq_hi; /* the 1 - 2 CMP_EQUIV_ALPHA (90%) interval behind `same`; NaN if none */
    double u;            /* Mann-Whitney U of the head (unpaired) or t (paired) */
    double p_value;      /* two-sided; NaN when not tested */
    bool p_exact;        /* exact distribution (else normal approximation; paired: t) */
    double min_p;        /* the smallest p this design and n can give */
    size_t min_n;        /* observations a side (pairs) the test needs to reach alpha */
    double hl_shift_ns;  /* Hodges-Lehmann shift (unpaired), median pair difference (paired) */
    double spread;       /* within-side robust spread, a fraction (1.4826 MAD / median) */
    double mde;          /* minimum detectable effect at this noise, a fraction; NaN if none */
    enum cmp_perf_basis basis; /* the clock of the observations: cmp__perf_cells */
    enum cmp_perf_basis_why basis_why;
    size_t basis_lacking;           /* processes without own time (why NO_RUNQUEUE, MIXED) */
    struct cmp_perf_times times[2]; /* control, head: every clock beside the basis */
    enum cmp_perf_verdict verdict;
};

/*
 * Fills out from two sets of observations in nanoseconds (one per timing
 * process; for PAIRED, n_control == n_head and index i is pair i). opt NULL
 * means defaults. -EINVAL (negative or non-finite values, a paired design of
 * unequal sizes, past CMP_MAX_TIMING_PROCESSES), -ENOMEM.
 */
int cmp_perf_compare(const double *control, size_t n_control, const double *head, size_t n_head,
                     enum cmp_perf_design design, const struct cmp_options *opt,
                     struct cmp_perf *out);

/*
 * Student's t with DF degrees of freedom (compare/student_t.c): the
 * two-sided p of T, P(|t| >= |T|), and the t whose two-sided p is P (the
 * 1 - P/2 quantile). NaN for DF <= 0, P outside (0, 1) or a NaN T.
 */
double cmp_t_p(double t, double df);
double cmp_t_quantile(double p, double df);

/*
 * Mann-Whitney U test of x against y, two-sided. u_out is U of x (pairs with
 * x > y, ties counting one half). Exact null distribution when both n <= 20
 * and there is no tie, else the normal approximation with tie and continuity
 * correction. -EINVAL when either sample is empty.
 */
int cmp_mann_whitney(const int64_t *x, size_t nx, const int64_t *y, size_t ny, double *u_out,
                     double *p_out, bool *exact_out);

/* Median of the nx*ny differences x_i - y_j, exactly, in O((nx+ny) log). */
int cmp_hodges_lehmann(const int64_t *x, size_t nx, const int64_t *y, size_t ny, double *shift_out);

/* ------------------------------------------------- kernel attribution */

/*
 * Names the CPU kernel of every op that a cell's first_divergence,
 * first_introduced, first_nonfinite or control_first_nonfinite points at
 * (records of granularity op): a "kernel" object {op, kind (stub, blas,
 * onednn, native, unknown), stub, file, cpu_function, note, source
 * ("source_tree" or "table"), stale_wrappers, stale_wrapper_paths}: from
 * PROVENANCE's kernel_map (the head job's provenance object, borrowed, NULL
 * when it has none; the map capctl derived from the source tree) when it
 * names the op, else from TABLE (schema/kernels.json, borrowed), with the
 * generated wrappers of that file that the provenance scan found in the
 * tree. Adds "kernel_table" (torch_versions, provenance, source_tree_ops)
 * to the result. docs/compare.md, "Kernel attribution". 0, -EINVAL (not a
 * result or no table), -ENOMEM.
 */
int cmp_attribute_kernels(json_t *result, const json_t *table, const json_t *provenance);

/* ------------------------------------------------------------ renderers */

/*
 * A malloc'd, NUL-terminated report of a cmp_compare() result: markdown for a
 * PR comment, or plain text for a terminal. At most CMP_MAX_RENDER bytes (a
 * longer report ends with a truncation line). NULL on allocation failure or
 * when result is not a cmp_compare() object.
 */
char *cmp_result_to_markdown(const json_t *result);
char *cmp_result_to_text(const json_t *result);

/*
 * A report being written, by these renderers or by another report of a
 * result (the API's width self-check): at most CMP_MAX_RENDER bytes with
 * the NUL. A reader stops early, so a report that would be longer is cut, not
 * refused: once a piece would leave no room for NOTE (borrowed, usually a
 * string literal such as "\n(report truncated)\n"), that piece and all that
 * follow are dropped and NOTE ends the report. The struct is public so that
 * it can live on the stack or inside a renderer's own; only these functions
 * change it.
 *
 *     struct cmp_report r;
 *     cmp_report_init(&r, "\n(report truncated)\n");
 *     cmp_report_addf(&r, "%d cells\n", n);    // never fails: see finish
 *     char *s = cmp_report_finish(&r);         // malloc'd; NULL: out of memory
 */
struct cmp_report {
    struct ubuf b;
    const char *note;
    bool truncated, oom;
};

void cmp_report_init(struct cmp_report *r, const char *note);
void cmp_report_addf(struct cmp_report *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void cmp_report_vaddf(struct cmp_report *r, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* The report, NOTE last when it was cut, for the caller to free(); NULL
 * when memory ran out on the way (nothing is left to free then). */
char *cmp_report_finish(struct cmp_report *r);

/* A result's fields as the reports read them: the string at key K of
 * object O, "" when it is absent or not a string; the integer, 0 when it
 * is absent or not an integer. */
const char *cmp_json_str(const json_t *o, const char *k);
/* A cell's pass as the reports name it: "forward", or with the mode of a
 * compiled cell "forward/inductor" (written into BUF of N bytes). */
const char *cmp_json_pass(const json_t *cell, char *buf, size_t n);
json_int_t cmp_json_int(const json_t *o, const char *k);

/*
 * The reference arbiter's word on a record of a result (a first divergence,
 * docs/compare.md "Reference arbiter"), as the reports say it, into OUT of
 * N bytes: "reference_float64: err 1.2e-04 > 2 x 3.1e-07 + 1e-06", or
 * "tolerance rule: reference no_values" when it could not judge. -ENOENT
 * (OUT untouched) when the arbiter was not asked.
 */
int cmp_reference_judgement(const json_t *site, char *out, size_t n);

/* Names used in the result, for callers that print enums themselves. */
const char *cmp_dtype_name(enum cmp_dtype dt);
enum cmp_dtype cmp_dtype_from_name(const char *name);

#endif /* CAPD_COMPARE_CMP_H */
