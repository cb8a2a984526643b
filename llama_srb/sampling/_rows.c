/* Loops that numpy makes slowly: over a logits row (sampling/cut.py's Row), and over
   backend sampling's candidates (sampling/device_row.py).

   exp_sum: sum(exp(scale * (x - top))) over a row, in one pass: numpy writes the shifted
   row, then its exp(), then sums it. mask_row: a grammar's mask applied to a row in place,
   and the maxima of the row's grid columns read in the same pass: numpy indexes the
   refused tokens, writes them, then reads the row again for the maxima. top_k: the
   positions of the k largest of a row's column maxima, or of the columns read, by a heap.
   head: where a top-p's column maxima, largest first, reach its mass, by a heap as well.

   Two of the five vectorize, and only those two are compiled for AVX-512 and AVX2 beside
   the baseline (GCC's target_clones; the loader picks the widest the CPU has): exp_sum's
   lanes, in every clone (-fno-trapping-math lets the baseline and AVX2 ones select), and
   mask_row's loops over a word of 32 tokens, a word of allowed and refused tokens in the
   AVX2 and AVX-512 clones only (the baseline, SSE2, has no blend); a word across a grid
   row's end is read one token at a time.
   sort_candidates: backend sampling's candidates, each row in the host path's order, read
   from the rows llama.cpp left them in.
   pick_candidates: the picks a call's branches make from their rows' candidates, each
   branch's llama.cpp chain run over them by its function pointers.
   top_k and head are heaps, one item at a time: scalar (head's first test sums its values
   with exp_sum). GCC 12 -O3 on setup.py's flags, read with -fopt-info-vec-optimized. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDEST_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDEST_VECTORS
#endif

#define LANES 64
#define BLOCK (64 * LANES)

/* exp(x) for x <= 0, relative error under 2e-7: x / ln 2 = i + f with i an integer and
   |f| <= 1/2, e^(f ln 2) from its Taylor series to the 7th power, 2^i into the exponent
   bits. Below 2^-126 it is 0: under 1e-38 of the top token's weight, 1. */
static inline float exp_nonpositive(float x) {
    float t = x * 1.44269504f;
    int tiny = t < -126.0f;
    t = tiny ? -126.0f : t;
    float i = (t + 12582912.0f) - 12582912.0f; /* rounded to the nearest integer */
    float f = (t - i) * 0.693147181f;          /* in [-ln2/2, ln2/2] */
    float p = 1.0f / 5040;
    p = p * f + 1.0f / 720;
    p = p * f + 1.0f / 120;
    p = p * f + 1.0f / 24;
    p = p * f + 1.0f / 6;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    union {
        int32_t bits;
        float value;
    } two_to_i = {.bits = ((int32_t)i + 127) << 23};
    return tiny ? 0.0f : p * two_to_i.value;
}

WIDEST_VECTORS
static double exp_sum_of(const float *restrict x, Py_ssize_t n, float top, float scale) {
    /* float32 lanes for a block of BLOCK, then a double: each lane rounds 64 times, as
       numpy's column sums of the grid did. */
    double sum = 0;
    Py_ssize_t whole = n - n % LANES, i = 0;
    while (i < whole) {
        Py_ssize_t end = i + BLOCK < whole ? i + BLOCK : whole;
        float lanes[LANES] = {0};
        for (; i < end; i += LANES)
            for (int j = 0; j < LANES; j++) lanes[j] += exp_nonpositive((x[i + j] - top) * scale);
        for (int j = 0; j < LANES; j++) sum += lanes[j];
    }
    for (; i < n; i++) sum += exp_nonpositive((x[i] - top) * scale);
    return sum;
}

/* The mask's bit t allows token t; token t is at column t % n_cols of the grid. */
WIDEST_VECTORS
static void mask_row_of(float *restrict x, const uint32_t *restrict mask, Py_ssize_t n,
                        Py_ssize_t n_cols, float *restrict colmax) {
    for (Py_ssize_t c = 0; c < n_cols; c++) colmax[c] = -INFINITY;
    Py_ssize_t col = 0; /* the column of the word's first token */
    for (Py_ssize_t start = 0; start < n; start += 32) {
        uint32_t allowed = mask[start / 32];
        float *restrict word = x + start;
        float *restrict peak = colmax + col;
        if (start + 32 <= n && col + 32 <= n_cols) { /* the word lies in one grid row */
            if (allowed == UINT32_MAX) {
                for (int j = 0; j < 32; j++) peak[j] = word[j] > peak[j] ? word[j] : peak[j];
            } else if (allowed == 0) {
                for (int j = 0; j < 32; j++) word[j] = -INFINITY;
            } else {
                for (int j = 0; j < 32; j++) {
                    float v = (allowed >> j) & 1 ? word[j] : -INFINITY;
                    word[j] = v;
                    peak[j] = v > peak[j] ? v : peak[j];
                }
            }
            col += 32;
        } else { /* across a grid row's end, or the row's last, partial word */
            for (Py_ssize_t j = 0; j < 32 && start + j < n; j++) {
                if (!((allowed >> j) & 1)) word[j] = -INFINITY;
                if (word[j] > colmax[col]) colmax[col] = word[j];
                col = col + 1 == n_cols ? 0 : col + 1;
            }
            continue;
        }
        if (col == n_cols) col = 0;
    }
}

/* The heap[at..] of positions of x put in order again: the least x first. */
static void sift_down(const float *restrict x, int64_t *restrict heap, Py_ssize_t k,
                      Py_ssize_t at) {
    int64_t item = heap[at];
    for (Py_ssize_t child; (child = 2 * at + 1) < k; at = child) {
        if (child + 1 < k && x[heap[child + 1]] < x[heap[child]]) child++;
        if (!(x[heap[child]] < x[item])) break;
        heap[at] = heap[child];
    }
    heap[at] = item;
}

/* The positions of the k largest of x (0 < k <= n), in no order: a min-heap of k, which
   most of x passes with one comparison (numpy's argpartition takes 35 us for 40 of
   4,096). Of equals, -inf ones included, the first come are kept. */
static void top_k_of(const float *restrict x, Py_ssize_t n, int64_t *restrict heap,
                     Py_ssize_t k) {
    for (Py_ssize_t i = 0; i < k; i++) heap[i] = i;
    for (Py_ssize_t at = k / 2; at-- > 0;) sift_down(x, heap, k, at);
    for (Py_ssize_t i = k; i < n; i++)
        if (x[i] > x[heap[0]]) {
            heap[0] = i;
            sift_down(x, heap, k, 0);
        }
}

/* The max-heap heap[at..k) of floats put in order again: the largest first. */
static void sift_down_max(float *restrict heap, Py_ssize_t k, Py_ssize_t at) {
    float item = heap[at];
    for (Py_ssize_t child; (child = 2 * at + 1) < k; at = child) {
        if (child + 1 < k && heap[child + 1] > heap[child]) child++;
        if (!(heap[child] > item)) break;
        heap[at] = heap[child];
    }
    heap[at] = item;
}

/* The largest x[i] such that the weights exp(scale * (x - top)) of every x >= it add up
   to `target` at least, taking x largest first: a max-heap of x, emptied only as far as
   that (numpy sorts all 4,096 column maxima in 50 us). The least finite x when they all
   add up to less; -inf when none is finite. `heap`: room for n floats. */
static float head_of(const float *restrict x, Py_ssize_t n, float top, float scale,
                     double target, float *restrict heap) {
    Py_ssize_t k = 0;
    float least = INFINITY;
    for (Py_ssize_t i = 0; i < n; i++)
        if (x[i] > -INFINITY) {
            heap[k++] = x[i];
            least = x[i] < least ? x[i] : least;
        }
    if (k == 0) return -INFINITY;
    if (exp_sum_of(heap, k, top, scale) < target) return least;
    for (Py_ssize_t at = k / 2; at-- > 0;) sift_down_max(heap, k, at);
    double sum = 0;
    for (;;) {
        float largest = heap[0];
        sum += exp_nonpositive((largest - top) * scale);
        if (sum >= target || k == 1) return largest;
        heap[0] = heap[--k];
        sift_down_max(heap, k, 0);
    }
}

/* Rows `rows` of the candidates (ids, logits; `stride` apart, the first k of each) in
   the order the host path reads a cut: most likely first, lower ids first among equals
   (-0.0 equals 0.0, as floats compare), and whether each row holds any of the n_marked
   ids `marked` (the model's end of generation). Read where llama.cpp left them: a
   numpy gather of them first costs more than this, right after a decode. An insertion
   sort of positions: llama.cpp's CPU top_k leaves a row sorted but for its first two, a
   few moves; any order is at most k * k / 2 compares a row. */
static void sort_candidates_of(const int32_t *restrict ids, const float *restrict values,
                               Py_ssize_t stride, const Py_ssize_t *restrict rows,
                               Py_ssize_t m, Py_ssize_t k, const int64_t *restrict marked,
                               Py_ssize_t n_marked, int64_t *restrict out_ids,
                               float *restrict out_values, uint8_t *restrict holds,
                               Py_ssize_t *restrict order) {
    for (Py_ssize_t row = 0; row < m; row++) {
        const int32_t *id = ids + rows[row] * stride;
        const float *value = values + rows[row] * stride;
        uint8_t held = 0;
        for (Py_ssize_t i = 0; i < k; i++) {
            for (Py_ssize_t j = 0; j < n_marked; j++) held |= id[i] == marked[j];
            Py_ssize_t at = i;
            for (; at > 0; at--) {
                Py_ssize_t before = order[at - 1];
                if (value[before] > value[i] || (value[before] == value[i] && id[before] < id[i]))
                    break;
                order[at] = before;
            }
            order[at] = i;
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            out_ids[row * k + i] = id[order[i]];
            out_values[row * k + i] = value[order[i]];
        }
        holds[row] = held;
    }
}

/* llama.h's llama_token_data and llama_token_data_array, and the two calls a pick makes
   (llama_sampler_apply, llama_sampler_accept), whose addresses the caller passes. */
typedef struct {
    int32_t id;
    float logit;
    float p;
} token_data;

typedef struct {
    token_data *data;
    size_t size;
    int64_t selected;
    bool sorted;
} token_data_array;

typedef void (*apply_fn)(void *chain, token_data_array *candidates);
typedef void (*accept_fn)(void *chain, int32_t token);

/* A branch's cut, as sampling/branch.py's BranchSampler plans it for the device. */
enum { CUT_GREEDY = 0, CUT_TOP_K = 1, CUT_MIN_P = 2 };

typedef struct {
    Py_ssize_t slot;  /* its row of the sorted candidates */
    int mask_eog;     /* end of generation is masked (ignore_eos, min_tokens) */
    uint64_t chain;   /* the finishing chain (0: greedy has none) */
    int kind;
    int top_k;
    double scale;     /* the temperatures before the cut */
    double log_min_p; /* log(min_p), for CUT_MIN_P */
} pick_item;

/* One branch's pick from its row of k candidates (sorted: most likely first, lower ids
   first among equals), as BranchSampler._sample_device picks it from a DeviceRow
   (sampling/device_row.py says what the candidates prove): the end-of-generation ids
   dropped when masked (masked, they sort last), the cut, the candidates at the chain's
   scale through its chain, the token accepted. -2 when the candidates cannot prove the
   pick (nothing accepted). `data`: room for k. */
static int64_t pick_of(const pick_item *item, const int64_t *restrict ids,
                       const float *restrict values, Py_ssize_t k, int holds_eog,
                       const int64_t *restrict eog, Py_ssize_t n_eog, int complete,
                       apply_fn apply, accept_fn accept, token_data *restrict data) {
    const int64_t *id = ids + item->slot * k;
    const float *value = values + item->slot * k;
    float floor = complete ? -INFINITY : value[k - 1];
    Py_ssize_t n = 0; /* the candidates left, the masked ones after them at -inf */
    for (Py_ssize_t i = 0; i < k; i++) {
        int masked = 0;
        if (item->mask_eog && holds_eog)
            for (Py_ssize_t j = 0; j < n_eog; j++) masked |= id[i] == eog[j];
        if (!masked) {
            data[n].id = (int32_t)id[i];
            data[n].logit = value[i];
            data[n].p = 0.0f;
            n++;
        }
    }
#define AT(i) ((i) < n ? data[i].logit : -INFINITY)
    Py_ssize_t cut;
    if (item->kind == CUT_GREEDY) {
        return AT(0) > floor ? data[0].id : -2;
    } else if (item->kind == CUT_TOP_K) {
        if (item->top_k >= k && floor > -INFINITY) return -2;
        cut = item->top_k < k ? item->top_k : k;
        if (cut < 1 || !(AT(cut - 1) > floor) || (cut < k && AT(cut) == AT(cut - 1))) return -2;
    } else {
        float threshold = (float)((double)AT(0) + item->log_min_p / item->scale);
        if (floor >= threshold) return -2;
        for (cut = 0; cut < n && data[cut].logit >= threshold; cut++);
    }
#undef AT
    if (item->scale != 1.0) {
        float scale = (float)item->scale;
        for (Py_ssize_t i = 0; i < cut; i++) data[i].logit *= scale;
    }
    token_data_array array = {data, (size_t)cut, -1, true};
    apply((void *)(uintptr_t)item->chain, &array);
    int64_t token = array.selected >= 0 ? array.data[array.selected].id : -1;
    accept((void *)(uintptr_t)item->chain, (int32_t)token);
    return token;
}

/* A C-contiguous buffer of `size`-byte items of one of `formats` ("f": float32, "i":
   int32, "lq": int64) in the machine's byte order (numpy's views of ctypes memory say so:
   "<f"). */
static int items(PyObject *object, Py_buffer *buffer, const char *formats, Py_ssize_t size,
                 int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object, buffer, flags) < 0) return 0;
    const char *given = buffer->format ? buffer->format : "B";
    if (*given == '@' || *given == '=' || (*given == '<' && PY_LITTLE_ENDIAN)) given++;
    if (buffer->itemsize == size && given[0] && !given[1] && strchr(formats, given[0]))
        return 1;
    PyErr_Format(PyExc_ValueError, "%s: not a buffer of %s", name,
                 formats[0] == 'f' ? "float32" : size == 4 ? "int32" : "int64");
    PyBuffer_Release(buffer);
    return 0;
}

static PyObject *exp_sum(PyObject *self, PyObject *args) {
    PyObject *row_object;
    float top, scale;
    Py_buffer row;
    if (!PyArg_ParseTuple(args, "Off", &row_object, &top, &scale) ||
        !items(row_object, &row, "f", 4, 0, "row"))
        return NULL;
    double sum;
    Py_BEGIN_ALLOW_THREADS;
    sum = exp_sum_of(row.buf, row.len / 4, top, scale);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&row);
    return PyFloat_FromDouble(sum);
}

static PyObject *mask_row(PyObject *self, PyObject *args) {
    PyObject *row_object, *mask_object, *colmax_object;
    if (!PyArg_ParseTuple(args, "OOO", &row_object, &mask_object, &colmax_object)) return NULL;
    Py_buffer row, mask, colmax;
    if (!items(row_object, &row, "f", 4, 1, "row")) return NULL;
    if (!items(mask_object, &mask, "i", 4, 0, "mask")) {
        PyBuffer_Release(&row);
        return NULL;
    }
    if (!items(colmax_object, &colmax, "f", 4, 1, "colmax")) {
        PyBuffer_Release(&row);
        PyBuffer_Release(&mask);
        return NULL;
    }
    Py_ssize_t n = row.len / 4, n_cols = colmax.len / 4;
    if (n_cols == 0 || n % n_cols)
        PyErr_SetString(PyExc_ValueError, "colmax: not a column count of the row");
    else if (mask.len / 4 < (n + 31) / 32)
        PyErr_SetString(PyExc_ValueError, "mask: shorter than the row's words");
    else
        mask_row_of(row.buf, mask.buf, n, n_cols, colmax.buf);
    PyBuffer_Release(&row);
    PyBuffer_Release(&mask);
    PyBuffer_Release(&colmax);
    return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

static PyObject *top_k(PyObject *self, PyObject *args) {
    PyObject *values_object, *out_object;
    if (!PyArg_ParseTuple(args, "OO", &values_object, &out_object)) return NULL;
    Py_buffer values, out;
    if (!items(values_object, &values, "f", 4, 0, "values")) return NULL;
    if (!items(out_object, &out, "lq", 8, 1, "out")) {
        PyBuffer_Release(&values);
        return NULL;
    }
    Py_ssize_t n = values.len / 4, k = out.len / 8;
    if (k > n)
        PyErr_SetString(PyExc_ValueError, "out: longer than values");
    else if (k > 0)
        top_k_of(values.buf, n, out.buf, k);
    PyBuffer_Release(&values);
    PyBuffer_Release(&out);
    return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

static PyObject *head(PyObject *self, PyObject *args) {
    PyObject *values_object;
    float top, scale;
    double target;
    if (!PyArg_ParseTuple(args, "Offd", &values_object, &top, &scale, &target)) return NULL;
    Py_buffer values;
    if (!items(values_object, &values, "f", 4, 0, "values")) return NULL;
    Py_ssize_t n = values.len / 4;
    float *heap = PyMem_Malloc(n ? n * sizeof(float) : 1);
    float threshold = heap ? head_of(values.buf, n, top, scale, target, heap) : 0;
    PyMem_Free(heap);
    PyBuffer_Release(&values);
    return heap ? PyFloat_FromDouble(threshold) : PyErr_NoMemory();
}

static PyObject *sort_candidates(PyObject *self, PyObject *args) {
    enum { IDS, VALUES, MARKED, OUT_IDS, OUT_VALUES, HOLDS, N };
    static const char *formats[N] = {"i", "f", "lq", "lq", "f", "?"};
    static const char *names[N] = {"ids", "values", "marked", "out_ids", "out_values", "holds"};
    static const Py_ssize_t sizes[N] = {4, 4, 8, 8, 4, 1};
    PyObject *objects[N], *rows_list;
    Py_ssize_t stride, k;
    if (!PyArg_ParseTuple(args, "OOnO!nOOOO", &objects[IDS], &objects[VALUES], &stride,
                          &PyList_Type, &rows_list, &k, &objects[MARKED], &objects[OUT_IDS],
                          &objects[OUT_VALUES], &objects[HOLDS]))
        return NULL;
    Py_buffer buffers[N];
    int held = 0;
    for (; held < N; held++)
        if (!items(objects[held], &buffers[held], formats[held], sizes[held], held >= OUT_IDS,
                   names[held]))
            break;
    if (held == N) {
        Py_ssize_t n = buffers[IDS].len / 4, m = PyList_GET_SIZE(rows_list);
        Py_ssize_t n_rows = stride > 0 ? n / stride : 0;
        Py_ssize_t *order = k > 0 ? PyMem_Malloc(k * sizeof(Py_ssize_t)) : NULL;
        Py_ssize_t *rows = PyMem_Malloc((m ? m : 1) * sizeof(Py_ssize_t));
        for (Py_ssize_t i = 0; rows && i < m; i++) {
            rows[i] = PyLong_AsSsize_t(PyList_GET_ITEM(rows_list, i));
            if (rows[i] < 0 || rows[i] >= n_rows) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "rows: not rows of ids");
                break;
            }
        }
        if (PyErr_Occurred())
            ;
        else if (k <= 0 || k > stride || n % stride)
            PyErr_SetString(PyExc_ValueError, "k, stride: not a row length of ids");
        else if (buffers[VALUES].len / 4 != n || buffers[OUT_IDS].len / 8 != m * k ||
                 buffers[OUT_VALUES].len / 4 != m * k || buffers[HOLDS].len != m)
            PyErr_SetString(PyExc_ValueError,
                            "values, out_ids, out_values, holds: not shaped as ids, rows, k");
        else if (!order || !rows)
            PyErr_NoMemory();
        else
            sort_candidates_of(buffers[IDS].buf, buffers[VALUES].buf, stride, rows, m, k,
                               buffers[MARKED].buf, buffers[MARKED].len / 8,
                               buffers[OUT_IDS].buf, buffers[OUT_VALUES].buf,
                               buffers[HOLDS].buf, order);
        PyMem_Free(order);
        PyMem_Free(rows);
    }
    while (held-- > 0) PyBuffer_Release(&buffers[held]);
    return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

static PyObject *pick_candidates(PyObject *self, PyObject *args) {
    enum { IDS, VALUES, HOLDS, EOG, N };
    static const char *formats[N] = {"lq", "f", "?", "lq"};
    static const char *names[N] = {"ids", "values", "holds", "eog"};
    static const Py_ssize_t sizes[N] = {8, 4, 1, 8};
    PyObject *objects[N], *list;
    Py_ssize_t k;
    int complete;
    unsigned long long apply, accept;
    if (!PyArg_ParseTuple(args, "OOnOOpKKO!", &objects[IDS], &objects[VALUES], &k,
                          &objects[HOLDS], &objects[EOG], &complete, &apply, &accept,
                          &PyList_Type, &list))
        return NULL;
    /* a tuple of the work: parsing an item may run Python code (__index__), which must
       not change what is read */
    PyObject *work = PyList_AsTuple(list);
    if (!work)
        return NULL;
    Py_buffer buffers[N];
    int held = 0;
    for (; held < N; held++)
        if (!items(objects[held], &buffers[held], formats[held], sizes[held], 0, names[held]))
            break;
    Py_ssize_t m = PyTuple_GET_SIZE(work), rows = held == N ? buffers[HOLDS].len : 0;
    Py_ssize_t n_ids = held == N ? buffers[IDS].len / 8 : 0;
    /* k candidates a row of holds, checked by division: no product to overflow */
    int shaped = held == N && k > 0 && n_ids % k == 0 && n_ids / k == rows &&
                 buffers[VALUES].len / 4 == n_ids;
    pick_item *picks = shaped ? PyMem_Malloc((m ? m : 1) * sizeof(pick_item)) : NULL;
    token_data *data = shaped ? PyMem_Malloc(k * sizeof(token_data)) : NULL;
    int64_t *tokens = shaped ? PyMem_Malloc((m ? m : 1) * sizeof(int64_t)) : NULL;
    PyObject *out = NULL;
    if (held < N)
        ;
    else if (!shaped)
        PyErr_SetString(PyExc_ValueError, "ids, values: not k candidates a row of holds");
    else if (!picks || !data || !tokens)
        PyErr_NoMemory();
    else {
        Py_ssize_t i = 0;
        for (; i < m; i++) { /* (slot, mask_eog, (chain, kind, top_k, scale, log_min_p)) */
            pick_item *item = &picks[i];
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(work, i), "np(Kiidd)", &item->slot,
                                  &item->mask_eog, &item->chain, &item->kind, &item->top_k,
                                  &item->scale, &item->log_min_p))
                break;
            if (item->slot < 0 || item->slot >= rows || item->kind < CUT_GREEDY ||
                item->kind > CUT_MIN_P || (item->kind != CUT_GREEDY && !item->chain) ||
                !(item->scale > 0)) {
                PyErr_SetString(PyExc_ValueError, "work: not a row and a device's chain");
                break;
            }
        }
        if (i == m) {
            const uint8_t *holds = buffers[HOLDS].buf;
            Py_BEGIN_ALLOW_THREADS;
            for (i = 0; i < m; i++)
                tokens[i] = pick_of(&picks[i], buffers[IDS].buf, buffers[VALUES].buf, k,
                                    holds[picks[i].slot], buffers[EOG].buf,
                                    buffers[EOG].len / 8, complete, (apply_fn)(uintptr_t)apply,
                                    (accept_fn)(uintptr_t)accept, data);
            Py_END_ALLOW_THREADS;
            out = PyList_New(m);
            for (i = 0; out && i < m; i++) {
                PyObject *token = tokens[i] == -2 ? Py_NewRef(Py_None) : PyLong_FromLongLong(tokens[i]);
                if (!token) Py_CLEAR(out);
                else PyList_SET_ITEM(out, i, token);
            }
        }
    }
    PyMem_Free(picks);
    PyMem_Free(data);
    PyMem_Free(tokens);
    while (held-- > 0) PyBuffer_Release(&buffers[held]);
    Py_DECREF(work);
    return out;
}

static PyMethodDef methods[] = {
    {"exp_sum", exp_sum, METH_VARARGS,
     "exp_sum(row, top, scale) -> sum(exp(scale * (row - top))) of a float32 row (top its "
     "maximum, scale > 0), in double."},
    {"mask_row", mask_row, METH_VARARGS,
     "mask_row(row, mask, colmax): the tokens the int32 bitmask `mask` refuses set to -inf "
     "in the float32 `row`, and the maxima of the row's len(colmax) columns into `colmax`."},
    {"top_k", top_k, METH_VARARGS,
     "top_k(values, out): the positions of the len(out) largest of the float32 `values` "
     "into the int64 `out`, in no order."},
    {"head", head, METH_VARARGS,
     "head(values, top, scale, target): the largest of the float32 `values` (top their "
     "maximum) at which their weights exp(scale * (value - top)), largest first, add up to "
     "`target`; the least finite value when they add up to less, -inf when none is finite."},
    {"sort_candidates", sort_candidates, METH_VARARGS,
     "sort_candidates(ids, values, stride, rows, k, marked, out_ids, out_values, holds): "
     "the first k of each row in the list `rows` of the int32 `ids` and float32 `values` "
     "(rows `stride` long), most likely first and lower ids first among equals, into the "
     "int64 `out_ids` and float32 `out_values` (a row of k each); `holds`: the bool of each, "
     "whether it holds any of the int64 ids `marked`."},
    {"pick_candidates", pick_candidates, METH_VARARGS,
     "pick_candidates(ids, values, k, holds, eog, complete, apply, accept, work) -> list: "
     "for each (slot, mask_eog, (chain, kind, top_k, scale, log_min_p)) of `work`, the token "
     "its chain picks from row `slot` of the sorted candidates (int64 `ids`, float32 "
     "`values`, k a row; `holds`: the row holds an id of the int64 `eog`), accepted, or None "
     "when the candidates cannot prove it. `apply`, `accept`: the addresses of "
     "llama_sampler_apply and llama_sampler_accept."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
