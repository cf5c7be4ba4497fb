/*
 * runner/native/capd_fastrec.c - the optional CPython extension capd_fastrec:
 * a module capture's forward hooks (capture.Capture._pre and _post with
 * Recorder.record's one-call path, capture.Recorder._native_record) in C.
 *
 * A record costs the Python side about 5 us in five Python frames (the hook,
 * record, _native_record, _prefix, the ctypes call); this does the same steps
 * in the same order in one C call per hook and calls capd_pipe_record and
 * capd_pipe_emit of libcapd_analysis.so directly, through the addresses the
 * runner's ctypes handle gives it (native.py), so the pipe is the very one
 * the runner drives. It reads tensors only through their Python attributes
 * (no torch headers) and keeps the GIL throughout, as the PyDLL calls do.
 *
 * Whatever the fast path does not cover (a tensor the one call cannot take,
 * a cache miss of the header text, a dict in a module's inputs, an error
 * of the pipe) goes back to the runner's own Python code before anything
 * is done, so the frames are those of capture.py byte for byte. The runner
 * loads this module only when it is built for its interpreter (the file's
 * suffix) and its FASTREC_ABI matches; otherwise it keeps the ctypes path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define FASTREC_ABI 2
#define MAX_NDIM    16 /* capture.MAX_NDIM */

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#endif

typedef int64_t (*analyze_fn)(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                              int64_t sample_k);
typedef int (*emit_fn)(void *pipe, int64_t aid, const char *prefix, int64_t len, int capture);

/*
 * A record whose frame and pending hash wait (flush_deferred): what its
 * key and header are made of, references held. The hooks run between the
 * model's operators, which push the hooks' objects out of the caches; the
 * key, the header text, the frame and the pending entry made for DEFER_MAX
 * records at once find them in cache after the first. At most DEFER_MAX
 * frames more than the pipe's own batch are lost to a crash.
 */
#define DEFER_MAX 32
typedef struct {
    PyObject *module, *call, *role, *index, *dtype, *shape;
    int64_t aid;
} Deferred;

/* One Capture's hooks over one Recorder (capture.Recorder.fast_hooks). */
typedef struct {
    PyObject_HEAD PyObject *rec;
    PyObject *writer;
    PyObject *names, *calls, *active; /* the Capture's */
    PyObject *codes;                  /* native.CODES */
    PyObject *tails;                  /* capture._PREFIX_TAILS */
    PyObject *tail_of;                /* capture._prefix_tail: a missing tail, stored */
    PyObject *failed;                 /* Pipeline.native_failed(rc, what): raises */
    PyObject *flatten;                /* capture._flatten(obj, out): what C does not walk */
    PyObject *tensor_type, *strided, *lock;
    void *pipe;
    analyze_fn analyze;
    emit_fn emit;
    int want_stats;
    int ndeferred;
    Deferred deferred[DEFER_MAX];
} Fast;

/* What the records of one side of a hook need of the recorder, fetched once
 * for all of them under one hold of its lock. */
typedef struct {
    PyObject *fqn;    /* the module's, as Capture.names has it */
    PyObject *module; /* rec.prefix + fqn: the records' module */
    PyObject *cache;  /* rec._cache (a dict) */
} Side;

static PyObject *s_version, *s_data_ptr, *s_shape, *s_stride, *s_storage_offset, *s_dtype,
    *s_device, *s_requires_grad, *s_layout, *s_is_cpu, *s_numel, *s_is_contiguous, *s_seq,
    *s_prefix, *s_cache, *s_pending, *s_parts, *s_flush, *s_acquire, *s_release, *s_record,
    *s_forward, *s_input, *s_output, *s_emit_what, *s_record_what, *s_zero, *s_one;

/* The referent of weakref REF, borrowed, or NULL when it is gone. */
static PyObject *referent(PyObject *ref)
{
    if (!PyWeakref_Check(ref))
        return NULL;
    PyObject *o = PyWeakref_GetObject(ref);
    return o == Py_None ? NULL : o;
}

/* Recorder._sig(t), or NULL: with an Exception cleared (the caller then
 * takes the Python path), else with the error set (*fatal). */
static PyObject *signature(PyObject *t, int *fatal)
{
    PyObject *sig = PyTuple_New(7);
    if (!sig)
        return NULL;
    /* _version, data_ptr(), shape, stride(), storage_offset(), dtype, device */
    PyObject **const names[7] = {&s_version,        &s_data_ptr, &s_shape, &s_stride,
                                 &s_storage_offset, &s_dtype,    &s_device};
    static const int method[7] = {0, 1, 0, 1, 1, 0, 0};
    PyObject *parts[7] = {NULL};
    for (int i = 0; i < 7; i++)
        if (!(parts[i] = method[i] ? PyObject_CallMethodNoArgs(t, *names[i])
                                   : PyObject_GetAttr(t, *names[i])))
            break;
    for (int i = 0; i < 7; i++) {
        if (!parts[i]) {
            for (int j = 0; j < 7; j++)
                Py_XDECREF(parts[j]);
            Py_DECREF(sig);
            *fatal = !PyErr_ExceptionMatches(PyExc_Exception);
            if (!*fatal)
                PyErr_Clear();
            return NULL;
        }
    }
    for (int i = 0; i < 7; i++)
        PyTuple_SET_ITEM(sig, i, parts[i]);
    return sig;
}

/* The header prefix of the next record into BUF (capture.Recorder._prefix at
 * level stats), seq counted; its length, or -1 with an error set. */
static Py_ssize_t header_prefix(Fast *f, PyObject *key, PyObject *module, PyObject *call,
                                PyObject *role, PyObject *index, PyObject *dtype, PyObject *shape,
                                char **buf)
{
    PyObject *ck =
        PyTuple_Pack(9, key, module, call, s_forward, role, index, dtype, shape, Py_None);
    if (!ck)
        return -1;
    PyObject *tail = PyDict_GetItemWithError(f->tails, ck);
    Py_XINCREF(tail);
    Py_DECREF(ck);
    if (!tail && !PyErr_Occurred())
        tail = PyObject_CallFunctionObjArgs(f->tail_of, key, module, call, s_forward, role, index,
                                            dtype, shape, Py_None, NULL);
    if (!tail)
        return -1;
    Py_ssize_t len = -1;
    PyObject *seq = PyObject_GetAttr(f->rec, s_seq);
    long long n = seq ? PyLong_AsLongLong(seq) : -1;
    if (!PyBytes_Check(tail) || (n == -1 && PyErr_Occurred()))
        goto out;
    char head[64];
    int hl = snprintf(head, sizeof(head), "{\"kind\":\"tensor\",\"seq\":%lld", n);
    Py_ssize_t tl = PyBytes_GET_SIZE(tail);
    if (!(*buf = PyMem_Malloc((size_t)(hl + tl) + 1))) {
        PyErr_NoMemory();
        goto out;
    }
    memcpy(*buf, head, (size_t)hl);
    memcpy(*buf + hl, PyBytes_AS_STRING(tail), (size_t)tl);
    PyObject *next = PyNumber_Add(seq, s_one);
    if (!next || PyObject_SetAttr(f->rec, s_seq, next) < 0) {
        Py_XDECREF(next);
        PyMem_Free(*buf);
        *buf = NULL;
        goto out;
    }
    Py_DECREF(next);
    len = hl + tl;
out:
    Py_XDECREF(seq);
    Py_DECREF(tail);
    return len;
}

/* rec._cache[id(t)] = (weakref(t), sig, aid) (Recorder._cache_put). */
static int cache_put(Side *s, PyObject *t, PyObject *tid, PyObject *sig, PyObject *aid)
{
    PyObject *ref = PyWeakref_NewRef(t, NULL);
    if (!ref) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    PyObject *ent = PyTuple_Pack(3, ref, sig, aid);
    Py_DECREF(ref);
    int rc = ent ? PyDict_SetItem(s->cache, tid, ent) : -1;
    Py_XDECREF(ent);
    return rc;
}

/* A deferred record's references dropped. */
static void deferred_clear(Deferred *d)
{
    Py_CLEAR(d->module);
    Py_CLEAR(d->call);
    Py_CLEAR(d->role);
    Py_CLEAR(d->index);
    Py_CLEAR(d->dtype);
    Py_CLEAR(d->shape);
}

/* The frames and pending hashes of the deferred records, in their order,
 * then none deferred. 0, or -1 with an error set (the rest dropped). */
static int flush_deferred(Fast *f)
{
    int n = f->ndeferred, rc = 0;
    if (!n)
        return 0;
    f->ndeferred = 0;
    PyObject *pending = PyObject_GetAttr(f->rec, s_pending);
    if (!pending || !PyList_Check(pending)) {
        if (pending)
            PyErr_SetString(PyExc_TypeError, "Recorder._pending is not a list");
        rc = -1;
    }
    if (!rc && f->want_stats) {
        /* frames the Python writer holds go out before these */
        PyObject *parts = PyObject_GetAttr(f->writer, s_parts);
        int flush = parts ? PyObject_IsTrue(parts) : -1;
        Py_XDECREF(parts);
        if (flush == 1) {
            PyObject *r = PyObject_CallMethodNoArgs(f->writer, s_flush);
            flush = r ? 0 : -1;
            Py_XDECREF(r);
        }
        rc = flush < 0 ? -1 : 0;
    }
    for (int i = 0; i < n; i++) {
        Deferred *d = &f->deferred[i];
        if (!rc) {
            PyObject *key = PyUnicode_FromFormat("%U.%S.%U.%U.%S", d->module, d->call, s_forward,
                                                 d->role, d->index);
            PyObject *aid = key ? PyLong_FromLongLong(d->aid) : NULL;
            char *buf = NULL;
            Py_ssize_t len = 0;
            if (aid && f->want_stats)
                len = header_prefix(f, key, d->module, d->call, d->role, d->index, d->dtype,
                                    d->shape, &buf);
            int e = aid && len >= 0 && f->want_stats ? f->emit(f->pipe, d->aid, buf, len, 0) : 0;
            PyMem_Free(buf);
            if (e != 0) {
                PyObject *r = PyObject_CallFunction(f->failed, "iO", e, s_emit_what);
                Py_XDECREF(r);
            }
            PyObject *pair =
                aid && len >= 0 && !PyErr_Occurred() ? PyTuple_Pack(2, key, aid) : NULL;
            rc = pair ? PyList_Append(pending, pair) : -1;
            Py_XDECREF(pair);
            Py_XDECREF(aid);
            Py_XDECREF(key);
        }
        deferred_clear(&f->deferred[i]);
    }
    Py_XDECREF(pending);
    return rc;
}

/* A record whose frame and pending hash wait for flush_deferred (made room
 * for first). 1, or -1 with an error set. */
static int defer(Fast *f, Side *s, PyObject *call, PyObject *role, PyObject *index, PyObject *sig,
                 int64_t aid)
{
    if (f->ndeferred == DEFER_MAX && flush_deferred(f) < 0)
        return -1;
    Deferred *d = &f->deferred[f->ndeferred++];
    d->module = Py_NewRef(s->module);
    d->call = Py_NewRef(call);
    d->role = Py_NewRef(role);
    d->index = Py_NewRef(index);
    d->dtype = Py_NewRef(PyTuple_GET_ITEM(sig, 5));
    d->shape = Py_NewRef(PyTuple_GET_ITEM(sig, 2));
    d->aid = aid;
    return 1;
}

/* Whether the one call takes T as it is (Recorder._native_record without
 * T.prepare nor a copy); its dtype code in *code and numel in *n.
 * 0: the Python path; -1: an error set. */
static int plain_tensor(Fast *f, PyObject *t, PyObject *dtype, int *code, long long *n)
{
    PyObject *c = PyDict_GetItemWithError(f->codes, dtype);
    if (!c)
        return PyErr_Occurred() ? -1 : 0;
    *code = (int)PyLong_AsLong(c);
    PyObject *v = PyObject_GetAttr(t, s_requires_grad);
    int ok = v ? (v == Py_False) : -1;
    Py_XDECREF(v);
    if (ok == 1) {
        v = PyObject_GetAttr(t, s_layout);
        ok = v ? (v == f->strided) : -1;
        Py_XDECREF(v);
    }
    if (ok == 1) {
        v = PyObject_GetAttr(t, s_is_cpu);
        ok = v ? (v == Py_True) : -1;
        Py_XDECREF(v);
    }
    if (ok == 1) {
        v = PyObject_CallMethodNoArgs(t, s_numel);
        *n = v ? PyLong_AsLongLong(v) : -1;
        ok = v && !(*n == -1 && PyErr_Occurred()) ? 1 : -1;
        Py_XDECREF(v);
    }
    if (ok == 1) {
        v = PyObject_CallMethodNoArgs(t, s_is_contiguous);
        ok = v ? (v == Py_True) : -1;
        Py_XDECREF(v);
    }
    return ok;
}

/* The first record of a tensor version: analysed now, cached, its frame
 * deferred. 1; 0: the Python path (nothing done); -1: an error. */
static int record_new(Fast *f, Side *s, PyObject *call, PyObject *role, PyObject *index,
                      PyObject *t, PyObject *sig, PyObject *tid)
{
    int code;
    long long n;
    int ok = plain_tensor(f, t, PyTuple_GET_ITEM(sig, 5), &code, &n);
    if (ok <= 0)
        return ok;
    void *data = n ? PyLong_AsVoidPtr(PyTuple_GET_ITEM(sig, 1)) : NULL;
    if (PyErr_Occurred())
        return -1;
    int64_t rc = f->analyze(f->pipe, data, n, code, f->want_stats, 0);
    if (rc < 0) {
        PyObject *r = PyObject_CallFunction(f->failed, "LO", (long long)rc, s_record_what);
        Py_XDECREF(r);
        return -1;
    }
    PyObject *aid = PyLong_FromLongLong(rc);
    if (!aid)
        return -1;
    ok = cache_put(s, t, tid, sig, aid) < 0 ? -1 : defer(f, s, call, role, index, sig, rc);
    Py_DECREF(aid);
    return ok;
}

/* Recorder.record(fqn, call, "forward", role, index, t) on the one-call path,
 * under rec.lock, held by the caller.
 * 1: recorded; 0: the Python path (nothing done); -1: an error set. */
static int record_locked(Fast *f, Side *s, PyObject *call, PyObject *role, PyObject *index,
                         PyObject *t)
{
    int fatal = 0;
    PyObject *sig = signature(t, &fatal);
    if (!sig)
        return fatal ? -1 : 0;
    PyObject *shape = PyTuple_GET_ITEM(sig, 2);
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > MAX_NDIM) {
        Py_DECREF(sig);
        return 0;
    }
    PyObject *tid = PyLong_FromVoidPtr(t);
    int rc = -1;
    if (!tid)
        goto out;
    PyObject *ent = PyDict_GetItemWithError(s->cache, tid);
    if (!ent && PyErr_Occurred())
        goto out;
    if (ent && PyTuple_Check(ent) && PyTuple_GET_SIZE(ent) == 3) {
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(ent, 1), sig, Py_EQ);
        if (same < 0)
            goto out;
        if (same && referent(PyTuple_GET_ITEM(ent, 0)) == t) {
            PyObject *aid = PyTuple_GET_ITEM(ent, 2);
            rc = PyLong_CheckExact(aid)
                     ? defer(f, s, call, role, index, sig, PyLong_AsLongLong(aid))
                     : 0;
            goto out;
        }
    }
    rc = record_new(f, s, call, role, index, t, sig, tid);
out:
    Py_XDECREF(tid);
    Py_DECREF(sig);
    return rc;
}

/* Record I of side ROLE, rec.lock held; the Python Recorder.record (which
 * takes the lock again: an RLock) when the fast path does not take it.
 * 0, or -1 with an error set. */
static int record_one(Fast *f, Side *s, PyObject *call, PyObject *role, Py_ssize_t i, PyObject *t)
{
    PyObject *index = PyLong_FromSsize_t(i);
    if (!index)
        return -1;
    int rc = record_locked(f, s, call, role, index, t);
    if (rc == 0 && flush_deferred(f) == 0) {
        /* the Python path, after the deferred records (seq, order) */
        PyObject *r = PyObject_CallMethodObjArgs(f->rec, s_record, s->fqn, call, s_forward, role,
                                                 index, t, NULL);
        rc = r ? 1 : -1;
        Py_XDECREF(r);
    } else if (rc == 0) {
        rc = -1;
    }
    Py_DECREF(index);
    return rc < 0 ? -1 : 0;
}

/* The recorder's state for one side's records into S (side_close frees it);
 * 0, or -1 with an error set. */
static int side_open(Fast *f, PyObject *fqn, Side *s)
{
    s->fqn = Py_NewRef(fqn);
    PyObject *prefix = PyObject_GetAttr(f->rec, s_prefix);
    if (!prefix)
        return -1;
    if (!PyUnicode_Check(prefix))
        PyErr_SetString(PyExc_TypeError, "Recorder.prefix is not a str");
    else
        s->module = PyUnicode_GET_LENGTH(prefix) ? PyUnicode_Concat(prefix, fqn) : Py_NewRef(fqn);
    Py_DECREF(prefix);
    if (!s->module || !(s->cache = PyObject_GetAttr(f->rec, s_cache)))
        return -1;
    if (!PyDict_Check(s->cache)) {
        PyErr_SetString(PyExc_TypeError, "Recorder._cache is not a dict");
        return -1;
    }
    return 0;
}

static void side_close(Side *s)
{
    Py_XDECREF(s->fqn);
    Py_XDECREF(s->module);
    Py_XDECREF(s->cache);
}

/* capture.flatten(obj) into OUT: tensors, exact tuples and lists here,
 * anything else a tuple, list or dict is by capture._flatten. */
static int flatten_into(Fast *f, PyObject *obj, PyObject *out)
{
    if (Py_TYPE(obj) == (PyTypeObject *)f->tensor_type)
        return PyList_Append(out, obj);
    if (PyTuple_CheckExact(obj)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj); i++)
            if (flatten_into(f, PyTuple_GET_ITEM(obj, i), out) < 0)
                return -1;
        return 0;
    }
    if (PyList_CheckExact(obj)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(obj); i++) {
            PyObject *x = Py_NewRef(PyList_GET_ITEM(obj, i));
            int rc = flatten_into(f, x, out);
            Py_DECREF(x);
            if (rc < 0)
                return -1;
        }
        return 0;
    }
    if (PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) || obj == Py_None)
        return 0;
    PyObject *r = PyObject_CallFunctionObjArgs(f->flatten, obj, out, NULL);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* Capture._record: each tensor of OBJ, flattened, as side ROLE, under one
 * hold of rec.lock. */
static PyObject *record_side(Fast *f, PyObject *obj, PyObject *fqn, PyObject *call, PyObject *role)
{
    PyObject *flat = PyList_New(0);
    if (!flat || flatten_into(f, obj, flat) < 0) {
        Py_XDECREF(flat);
        return NULL;
    }
    int rc = 0;
    Side s = {0};
    if (PyList_GET_SIZE(flat) > 0) {
        PyObject *r =
            side_open(f, fqn, &s) < 0 ? NULL : PyObject_CallMethodNoArgs(f->lock, s_acquire);
        int locked = r != NULL;
        rc = locked ? 0 : -1;
        Py_XDECREF(r);
        for (Py_ssize_t i = 0; !rc && i < PyList_GET_SIZE(flat); i++)
            rc = record_one(f, &s, call, role, i, PyList_GET_ITEM(flat, i));
        if (locked) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyObject *u = PyObject_CallMethodNoArgs(f->lock, s_release);
            if (u) {
                Py_DECREF(u);
                PyErr_Restore(et, ev, tb);
            } else {
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(tb);
                rc = -1;
            }
        }
    }
    side_close(&s);
    Py_DECREF(flat);
    return rc < 0 ? NULL : Py_NewRef(Py_None);
}

/* The start of either hook: NARGS checked (USAGE in the error), *MID set to
 * id(module) and *FQN to its fqn (Capture.names[id(module)]), new
 * references. 1: go on; 0: not the model's module (global hooks see every
 * module call of the process), nothing to do; -1: an error set. */
static int hook_module(Fast *f, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                       const char *usage, PyObject **mid, PyObject **fqn)
{
    *mid = *fqn = NULL;
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (!(*mid = PyLong_FromVoidPtr(args[0])))
        return -1;
    PyObject *name = PyDict_GetItemWithError(f->names, *mid);
    if (!name)
        return PyErr_Occurred() ? -1 : 0;
    *fqn = Py_NewRef(name);
    return 1;
}

/* Capture._pre's call of module MID: counted, and pushed on MID's stack
 * of open calls. A new reference, or NULL with an error set. */
static PyObject *pre_call(Fast *f, PyObject *mid)
{
    PyObject *call = PyDict_GetItemWithError(f->calls, mid), *next = NULL;
    if (!call && PyErr_Occurred())
        return NULL;
    call = Py_NewRef(call ? call : s_zero);
    if (!(next = PyNumber_Add(call, s_one)) || PyDict_SetItem(f->calls, mid, next) < 0)
        goto fail;
    Py_CLEAR(next);
    PyObject *stack = PyDict_GetItemWithError(f->active, mid);
    if (!stack && PyErr_Occurred())
        goto fail;
    if (!stack) {
        PyObject *fresh = PyList_New(0);
        int rc = fresh ? PyDict_SetItem(f->active, mid, fresh) : -1;
        Py_XDECREF(fresh);
        if (rc < 0)
            goto fail;
        stack = fresh;
    }
    if (PyList_Append(stack, call) < 0)
        goto fail;
    return call;
fail:
    Py_XDECREF(next);
    Py_DECREF(call);
    return NULL;
}

/* Capture._post's call of module MID: the open call its stack holds last
 * (popped), else the last one counted. A new reference, or NULL with an
 * error set. */
static PyObject *post_call(Fast *f, PyObject *mid)
{
    PyObject *stack = PyDict_GetItemWithError(f->active, mid);
    if (!stack && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = stack && PyList_Check(stack) ? PyList_GET_SIZE(stack) : 0;
    if (n > 0) {
        PyObject *call = Py_NewRef(PyList_GET_ITEM(stack, n - 1));
        if (PyList_SetSlice(stack, n - 1, n, NULL) < 0)
            Py_CLEAR(call);
        return call;
    }
    PyObject *c = PyDict_GetItemWithError(f->calls, mid);
    if (!c && PyErr_Occurred())
        return NULL;
    return PyNumber_Subtract(c ? c : s_one, s_one);
}

/* Either hook, for WANT arguments (USAGE in the error): the call of the
 * module in args[0] as CALL_OF says, and the tensors of its last argument
 * (inputs, output) recorded as ROLE. */
static PyObject *hook_side(Fast *f, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                           const char *usage, PyObject *(*call_of)(Fast *, PyObject *),
                           PyObject *role)
{
    PyObject *mid, *fqn, *call = NULL, *res = NULL;
    int go = hook_module(f, args, nargs, want, usage, &mid, &fqn);
    if (go <= 0)
        res = go ? NULL : Py_NewRef(Py_None);
    else if ((call = call_of(f, mid)))
        res = record_side(f, args[want - 1], fqn, call, role);
    Py_XDECREF(call);
    Py_XDECREF(fqn);
    Py_XDECREF(mid);
    return res;
}

/* Capture._pre (no taps, no per-op records): the call counted, its inputs. */
static PyObject *fast_pre(Fast *f, PyObject *const *args, Py_ssize_t nargs)
{
    return hook_side(f, args, nargs, 2, "pre(module, inputs)", pre_call, s_input);
}

/* Capture._post (no taps, no per-op records): its outputs. */
static PyObject *fast_post(Fast *f, PyObject *const *args, Py_ssize_t nargs)
{
    return hook_side(f, args, nargs, 3, "post(module, inputs, output)", post_call, s_output);
}

static void fast_dealloc(Fast *f)
{
    PyObject **refs[] = {&f->rec,     &f->writer, &f->names,   &f->calls,  &f->active,
                         &f->codes,   &f->tails,  &f->tail_of, &f->failed, &f->flatten,
                         &f->strided, &f->lock,   NULL};
    for (int i = 0; refs[i]; i++)
        Py_CLEAR(*refs[i]);
    Py_CLEAR(f->tensor_type);
    for (int i = 0; i < f->ndeferred; i++)
        deferred_clear(&f->deferred[i]);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* flush(): the deferred records' frames and pending hashes, now (the
 * recorder's sync and record, the capture's end). */
static PyObject *fast_flush(Fast *f, PyObject *unused)
{
    (void)unused;
    return flush_deferred(f) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyMethodDef fast_methods[] = {
    {"pre", (PyCFunction)(void (*)(void))fast_pre, METH_FASTCALL, "Capture._pre"},
    {"post", (PyCFunction)(void (*)(void))fast_post, METH_FASTCALL, "Capture._post"},
    {"flush", (PyCFunction)fast_flush, METH_NOARGS, "the deferred records, written"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FastType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "capd_fastrec.Hooks",
    .tp_basicsize = sizeof(Fast),
    .tp_dealloc = (destructor)fast_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = fast_methods,
};

/* hooks(rec, capture, codes, tails, tail_of, failed, flatten, tensor_type,
 *       strided, pipe, analyze_now_fn, emit_fn) -> an object with pre, post
 *       and flush. */
static PyObject *hooks_new(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *rec, *cap, *codes, *tails, *tail_of, *failed, *flatten, *ttype, *strided;
    unsigned long long pipe, afn, efn;
    if (!PyArg_ParseTuple(args, "OOO!O!OOOO!OKKK", &rec, &cap, &PyDict_Type, &codes, &PyDict_Type,
                          &tails, &tail_of, &failed, &flatten, &PyType_Type, &ttype, &strided,
                          &pipe, &afn, &efn))
        return NULL;
    if (!pipe || !afn || !efn) {
        PyErr_SetString(PyExc_ValueError, "hooks: a null pipe or function");
        return NULL;
    }
    Fast *f = PyObject_New(Fast, &FastType);
    if (!f)
        return NULL;
    memset((char *)f + sizeof(PyObject), 0, sizeof(Fast) - sizeof(PyObject));
    f->rec = Py_NewRef(rec);
    f->codes = Py_NewRef(codes);
    f->tails = Py_NewRef(tails);
    f->tail_of = Py_NewRef(tail_of);
    f->failed = Py_NewRef(failed);
    f->flatten = Py_NewRef(flatten);
    f->tensor_type = Py_NewRef(ttype);
    f->strided = Py_NewRef(strided);
    f->pipe = (void *)(uintptr_t)pipe;
    f->analyze = (analyze_fn)(uintptr_t)afn;
    f->emit = (emit_fn)(uintptr_t)efn;
    PyObject *emit = PyObject_GetAttrString(rec, "emit");
    f->want_stats = emit ? PyObject_IsTrue(emit) : -1;
    Py_XDECREF(emit);
    if (f->want_stats < 0 || !(f->writer = PyObject_GetAttrString(rec, "writer")) ||
        !(f->lock = PyObject_GetAttrString(rec, "lock")) ||
        !(f->names = PyObject_GetAttrString(cap, "names")) ||
        !(f->calls = PyObject_GetAttrString(cap, "calls")) ||
        !(f->active = PyObject_GetAttrString(cap, "active"))) {
        Py_DECREF(f);
        return NULL;
    }
    if (!PyDict_Check(f->names) || !PyDict_Check(f->calls) || !PyDict_Check(f->active)) {
        Py_DECREF(f);
        PyErr_SetString(PyExc_TypeError, "hooks: Capture.names, calls, active must be dicts");
        return NULL;
    }
    return (PyObject *)f;
}

static PyMethodDef module_methods[] = {
    {"hooks", hooks_new, METH_VARARGS, "A Capture's forward hooks in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastrec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "capd_fastrec",
    .m_doc = "capd_runner's module capture hooks in C (capture.Recorder.fast_hooks).",
    .m_size = -1,
    .m_methods = module_methods,
};

static int intern_all(void)
{
    struct {
        PyObject **p;
        const char *s;
    } names[] = {
        {&s_version, "_version"},
        {&s_data_ptr, "data_ptr"},
        {&s_shape, "shape"},
        {&s_stride, "stride"},
        {&s_storage_offset, "storage_offset"},
        {&s_dtype, "dtype"},
        {&s_device, "device"},
        {&s_requires_grad, "requires_grad"},
        {&s_layout, "layout"},
        {&s_is_cpu, "is_cpu"},
        {&s_numel, "numel"},
        {&s_is_contiguous, "is_contiguous"},
        {&s_seq, "seq"},
        {&s_prefix, "prefix"},
        {&s_cache, "_cache"},
        {&s_pending, "_pending"},
        {&s_parts, "_parts"},
        {&s_flush, "flush"},
        {&s_acquire, "acquire"},
        {&s_release, "release"},
        {&s_record, "record"},
        {&s_forward, "forward"},
        {&s_input, "input"},
        {&s_output, "output"},
        {&s_emit_what, "emit"},
        {&s_record_what, "record"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(*names[i].p = PyUnicode_InternFromString(names[i].s)))
            return -1;
    s_zero = PyLong_FromLong(0);
    s_one = PyLong_FromLong(1);
    return s_zero && s_one ? 0 : -1;
}

PyMODINIT_FUNC PyInit_capd_fastrec(void)
{
    if (intern_all() < 0 || PyType_Ready(&FastType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastrec_module);
    if (m && PyModule_AddIntConstant(m, "ABI", FASTREC_ABI) < 0)
        Py_CLEAR(m);
    return m;
}
