/* The device's cut (engine/device_cut.py) where the output rows are computed on the CPU:
   llama.cpp's top_k backend sampler with its graph op replaced by a faster one, which
   reads each row where the model wrote it (docs/sampling.md, "Backend sampling").

   - llama.cpp's CPU top_k (ggml-cpu ops.cpp) fills an index array of the whole row and
     partial-sorts it through the row. This op keeps a heap of the k and passes over each
     block of 64 logits that holds none above the heap's least in one vectorized test, so
     after the first blocks it only reads the row (0.03 ms for Gemma 3's 262,144).
   - llama.cpp's build_sampling hands each chain a view of a padded copy of every row;
     `unpadded` reads the row it shows from the rows themselves, so the copy leaves the
     graph (10-12 % of an n = 64 run's cycles on this CPU).

   The sampler builds what llama_sampler_init_top_k's does (the k largest logits, the same
   get_rows of candidates and logits), with one custom op (ggml_custom_4d) for ggml_top_k,
   its positions in the host path's order; on the host (`apply`, which llama.cpp runs only
   where the graph did not) it is llama.cpp's own top_k sampler. libllama and
   libggml-base are loaded by llama-cpp-python, not linked here: native.py hands over
   their functions' addresses once (`bind`). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDEST_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDEST_VECTORS
#endif

#define BLOCK 64
#define GGML_TYPE_F32 0
#define GGML_TYPE_I32 26

/* ggml.h's struct ggml_tensor, as far as `unpadded` reads it; bind() checks the layout on
   tensors of its own, and `unpadded` does nothing unless it held. */
struct ggml_tensor {
    int type;
    void *buffer;
    int64_t ne[4];
    size_t nb[4];
    int op;
    int32_t op_params[16];
    int32_t flags;
    struct ggml_tensor *src[10];
    struct ggml_tensor *view_src;
    size_t view_offs;
    void *data;
    char name[64];
};
struct ggml_context;
struct ggml_cgraph;
struct ggml_init_params {
    size_t mem_size;
    void *mem_buffer;
    bool no_alloc;
};

typedef struct {
    struct ggml_tensor *logits, *probs, *sampled, *candidates;
} sampler_data;

struct sampler;
typedef struct {
    const char *(*name)(const struct sampler *);
    void (*accept)(struct sampler *, int32_t);
    void (*apply)(struct sampler *, void *);
    void (*reset)(struct sampler *);
    struct sampler *(*clone)(const struct sampler *);
    void (*free)(struct sampler *);
    bool (*backend_init)(struct sampler *, void *);
    void (*backend_accept)(struct sampler *, struct ggml_context *, struct ggml_cgraph *,
                           struct ggml_tensor *);
    void (*backend_apply)(struct sampler *, struct ggml_context *, struct ggml_cgraph *,
                          sampler_data *);
    void (*backend_set_input)(struct sampler *);
    /* later llama.cpp versions add fields here: left NULL */
    void *reserved[4];
} sampler_iface;

struct sampler {
    const sampler_iface *iface;
    void *ctx;
};

typedef void (*custom_op)(struct ggml_tensor *dst, int ith, int nth, void *userdata);

/* The functions of libggml-base and libllama this calls, by the names in FUNCTIONS. */
static struct {
    struct ggml_tensor *(*custom_4d)(struct ggml_context *, int, int64_t, int64_t, int64_t,
                                     int64_t, struct ggml_tensor **, int, custom_op, int,
                                     void *);
    struct ggml_tensor *(*get_rows)(struct ggml_context *, struct ggml_tensor *,
                                    struct ggml_tensor *);
    struct ggml_tensor *(*reshape_1d)(struct ggml_context *, struct ggml_tensor *, int64_t);
    struct ggml_tensor *(*reshape_2d)(struct ggml_context *, struct ggml_tensor *, int64_t,
                                      int64_t);
    struct ggml_tensor *(*view_1d)(struct ggml_context *, struct ggml_tensor *, int64_t, size_t);
    int64_t (*nelements)(const struct ggml_tensor *);
    struct ggml_context *(*init)(struct ggml_init_params);
    void (*free_context)(struct ggml_context *);
    size_t (*tensor_overhead)(void);
    struct ggml_tensor *(*new_tensor_2d)(struct ggml_context *, int, int64_t, int64_t);
    struct ggml_tensor *(*pad)(struct ggml_context *, struct ggml_tensor *, int, int, int, int);
    struct sampler *(*sampler_init)(const sampler_iface *, void *);
    struct sampler *(*init_top_k)(int32_t);
    void (*sampler_free)(struct sampler *);
} F;

static const char *const FUNCTIONS[] = {
    "ggml_custom_4d",     "ggml_get_rows", "ggml_reshape_1d",          "ggml_reshape_2d",
    "ggml_view_1d",       "ggml_nelements", "ggml_init",               "ggml_free",
    "ggml_tensor_overhead", "ggml_new_tensor_2d", "ggml_pad",          "llama_sampler_init",
    "llama_sampler_init_top_k", "llama_sampler_free",
};
#define N_FUNCTIONS (sizeof FUNCTIONS / sizeof *FUNCTIONS)

/* What llama.cpp's build_sampling (llama-graph.cpp) pads the logits with, as bind() saw
   ggml_pad(logits, 0, 1, 0, 0) make it; `layout` is false where the mirror above did not
   read bind()'s tensors right. */
static struct {
    bool layout;
    int op;
    int32_t params[16];
} padding;

typedef struct {
    int32_t k;
    struct sampler *host; /* llama.cpp's top_k(k), for `apply` */
} cut;

/* Whether position a of x ranks below position b: a smaller logit, or an equal one later
   in the row (the host path's order: most likely first, lower ids first among equals). */
static inline int below(const float *restrict x, int32_t a, int32_t b) {
    return x[a] < x[b] || (x[a] == x[b] && a > b);
}

/* The heap[at..k) of positions of x put in order again: the lowest ranked first. */
static void sift_down(const float *restrict x, int32_t *restrict heap, int64_t k, int64_t at) {
    int32_t item = heap[at];
    for (int64_t child; (child = 2 * at + 1) < k; at = child) {
        if (child + 1 < k && below(x, heap[child + 1], heap[child])) child++;
        if (!below(x, heap[child], item)) break;
        heap[at] = heap[child];
    }
    heap[at] = item;
}

/* Position i into the heap if it ranks above the heap's lowest (a later equal does not). */
static inline void take(const float *restrict x, int32_t *restrict heap, int64_t k, int64_t i,
                        float *floor) {
    if (x[i] > *floor) {
        heap[0] = (int32_t)i;
        sift_down(x, heap, k, 0);
        *floor = x[heap[0]];
    }
}

/* The positions of the k highest ranked of x (0 < k <= n), in rank order, so the host's
   sort (sampling/_rows.c's sort_candidates) only reads them: a min-heap of k, through
   which a block of x that holds nothing above the heap's lowest passes in one test. */
WIDEST_VECTORS
static void top_k_of(const float *restrict x, int64_t n, int32_t *restrict heap, int64_t k) {
    for (int64_t i = 0; i < k; i++) heap[i] = (int32_t)i;
    for (int64_t at = k / 2; at-- > 0;) sift_down(x, heap, k, at);
    float floor = x[heap[0]];
    int64_t i = k;
    for (; i + BLOCK <= n; i += BLOCK) {
        int above = 0;
        for (int j = 0; j < BLOCK; j++) above |= x[i + j] > floor;
        if (above)
            for (int j = 0; j < BLOCK; j++) take(x, heap, k, i + j, &floor);
    }
    for (; i < n; i++) take(x, heap, k, i, &floor);
    for (int64_t end = k - 1; end > 0; end--) { /* the lowest to the back, in turn */
        int32_t lowest = heap[0];
        heap[0] = heap[end];
        heap[end] = lowest;
        sift_down(x, heap, end, 0);
    }
}

/* The op: dst's k positions of its source row's largest logits (one thread: a row's graph
   node is one task either way, as ggml_top_k's is). */
static void top_k_op(struct ggml_tensor *dst, int ith, int nth, void *userdata) {
    (void)nth;
    (void)userdata;
    const struct ggml_tensor *row = dst->src[0];
    if (ith == 0) top_k_of(row->data, row->ne[0], dst->data, dst->ne[0]);
}

/* The row of logits `view` shows, read where the model wrote it. llama.cpp's build_sampling
   gives each sequence a view of one row of PAD(logits, one more row) (so that its graph
   has a row for every chain, even one whose sequence has no output this call), and
   computing that copy of every row took the CPU 35 ms a step at n = 64; when every chain's
   view reads past it, the graph no longer holds it. `view` itself where it is not such a
   view, or is the added row. */
static struct ggml_tensor *unpadded(struct ggml_context *ctx, struct ggml_tensor *view) {
    struct ggml_tensor *padded = view->view_src;
    if (!padded || padded->op != padding.op ||
        memcmp(padded->op_params, padding.params, sizeof padding.params) != 0)
        return view;
    struct ggml_tensor *rows = padded->src[0];
    size_t row = view->view_offs / padded->nb[1];
    if (view->type != GGML_TYPE_F32 || rows->type != GGML_TYPE_F32 ||
        view->ne[0] != rows->ne[0] || view->view_offs % padded->nb[1] != 0 ||
        row >= (size_t)rows->ne[1])
        return view;
    return F.view_1d(ctx, rows, rows->ne[0], row * rows->nb[1]);
}

static const char *cut_name(const struct sampler *smpl) {
    (void)smpl;
    return "cpu-top-k";
}

static void cut_apply(struct sampler *smpl, void *cur_p) {
    struct sampler *host = ((cut *)smpl->ctx)->host;
    host->iface->apply(host, cur_p);
}

static void cut_free(struct sampler *smpl) {
    cut *c = smpl->ctx;
    F.sampler_free(c->host);
    free(c);
}

static bool cut_backend_init(struct sampler *smpl, void *buft) {
    (void)smpl;
    (void)buft;
    return true; /* native.py attaches it only where the output rows are on the CPU */
}

/* As llama.cpp's top_k backend sampler builds it, with top_k_op for ggml_top_k, over the
   row where the model wrote it. */
static void cut_backend_apply(struct sampler *smpl, struct ggml_context *ctx,
                              struct ggml_cgraph *gf, sampler_data *data) {
    (void)gf;
    struct ggml_tensor *logits = unpadded(ctx, data->logits);
    int64_t k = ((cut *)smpl->ctx)->k, n = F.nelements(logits);
    if (k > n) k = n; /* as many as there are */
    struct ggml_tensor *top =
        F.custom_4d(ctx, GGML_TYPE_I32, k, 1, 1, 1, &logits, 1, top_k_op, 1, NULL);
    if (data->candidates) {
        struct ggml_tensor *ids =
            F.reshape_2d(ctx, data->candidates, 1, F.nelements(data->candidates));
        data->candidates = F.reshape_1d(ctx, F.get_rows(ctx, ids, top), k);
    } else {
        data->candidates = top;
    }
    struct ggml_tensor *rows = F.reshape_2d(ctx, logits, 1, n);
    data->logits = F.reshape_1d(ctx, F.get_rows(ctx, rows, top), k);
}

static const sampler_iface cut_iface = {
    .name = cut_name,
    .apply = cut_apply,
    .free = cut_free,
    .backend_init = cut_backend_init,
    .backend_apply = cut_backend_apply,
};

/* Whether the mirror of struct ggml_tensor reads tensors of ggml's own making right, and
   what ggml_pad makes of build_sampling's arguments. */
static bool probe(void) {
    struct ggml_init_params params = {32 * F.tensor_overhead(), NULL, true};
    struct ggml_context *ctx = F.init(params);
    if (!ctx) return false;
    struct ggml_tensor *rows = F.new_tensor_2d(ctx, GGML_TYPE_F32, 7, 3);
    struct ggml_tensor *padded = F.pad(ctx, rows, 0, 1, 0, 0);
    struct ggml_tensor *view = F.view_1d(ctx, padded, 7, 2 * 7 * sizeof(float));
    bool held = rows->type == GGML_TYPE_F32 && rows->ne[0] == 7 && rows->ne[1] == 3 &&
                rows->nb[1] == 7 * sizeof(float) && padded->ne[1] == 4 &&
                padded->src[0] == rows && padded->src[1] == NULL && view->view_src == padded &&
                view->view_offs == 2 * 7 * sizeof(float) && F.nelements(view) == 7 &&
                view->ne[0] == 7 && padded->op != view->op;
    if (held) {
        padding.op = padded->op;
        memcpy(padding.params, padded->op_params, sizeof padding.params);
    }
    F.free_context(ctx);
    return held;
}

static PyObject *bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *addresses;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &addresses)) return NULL;
    if (PyTuple_GET_SIZE(addresses) != (Py_ssize_t)N_FUNCTIONS)
        return PyErr_Format(PyExc_ValueError, "want %d addresses", (int)N_FUNCTIONS);
    void *slots[N_FUNCTIONS];
    for (size_t i = 0; i < N_FUNCTIONS; i++) {
        slots[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(addresses, i));
        if (!slots[i])
            return PyErr_Occurred() ? NULL
                                    : PyErr_Format(PyExc_ValueError, "%s has no address",
                                                   FUNCTIONS[i]);
    }
    memcpy(&F, slots, sizeof F);
    padding.layout = probe();
    return PyBool_FromLong(padding.layout);
}

static PyObject *sampler(PyObject *self, PyObject *args) {
    (void)self;
    int k;
    if (!PyArg_ParseTuple(args, "i", &k)) return NULL;
    if (!padding.layout) return PyErr_Format(PyExc_RuntimeError, "bind() did not hold");
    if (k < 1) return PyErr_Format(PyExc_ValueError, "k must be positive, not %d", k);
    cut *c = malloc(sizeof *c);
    if (!c) return PyErr_NoMemory();
    c->k = k;
    c->host = F.init_top_k(k);
    return PyLong_FromVoidPtr(F.sampler_init(&cut_iface, c));
}

/* A C-contiguous buffer of 4-byte items of `format` ("f" or "i"), native byte order. */
static int items(PyObject *object, Py_buffer *buffer, char format, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object, buffer, flags) < 0) return 0;
    const char *named = buffer->format ? buffer->format : "B", *given = named;
    if (*given == '@' || *given == '=' || (*given == '<' && PY_LITTLE_ENDIAN)) given++;
    if (given[0] == format && !given[1] && buffer->itemsize == 4) return 1;
    PyErr_Format(PyExc_TypeError, "want a contiguous buffer of '%c', not '%s'", format, named);
    PyBuffer_Release(buffer);
    return 0;
}

static PyObject *top_k(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *values_object, *out_object, *result = NULL;
    Py_buffer values, out;
    if (!PyArg_ParseTuple(args, "OO", &values_object, &out_object)) return NULL;
    if (!items(values_object, &values, 'f', 0)) return NULL;
    if (items(out_object, &out, 'i', 1)) {
        int64_t n = values.len / 4, k = out.len / 4;
        if (k < 1 || k > n) {
            PyErr_Format(PyExc_ValueError, "want 1 to len(values) slots, not %lld", (long long)k);
        } else {
            Py_BEGIN_ALLOW_THREADS top_k_of(values.buf, n, out.buf, k);
            Py_END_ALLOW_THREADS result = Py_NewRef(Py_None);
        }
        PyBuffer_Release(&out);
    }
    PyBuffer_Release(&values);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(addresses): the addresses of the functions named in FUNCTIONS, in its order; "
     "whether ggml's tensors read as this module expects (else sampler() refuses)."},
    {"sampler", sampler, METH_VARARGS,
     "sampler(k): the address of a new top_k(k) llama_sampler whose graph op runs on the CPU."},
    {"top_k", top_k, METH_VARARGS,
     "top_k(values, out): the positions of the len(out) largest of the float32 `values` "
     "into the int32 `out`, most likely first (lower positions first among equals), as the "
     "graph op finds them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu_cut", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cpu_cut(void) {
    PyObject *m = PyModule_Create(&module);
    PyObject *names = PyTuple_New(N_FUNCTIONS);
    for (size_t i = 0; names && i < N_FUNCTIONS; i++)
        PyTuple_SET_ITEM(names, i, PyUnicode_FromString(FUNCTIONS[i]));
    if (!m || !names || PyModule_AddObject(m, "FUNCTIONS", names) < 0) {
        Py_XDECREF(names);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
