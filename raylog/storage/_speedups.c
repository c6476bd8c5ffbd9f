/* raylog.storage._speedups: the compiled fast path of raylog.storage.message
 * (format 1) and raylog.storage.record_batch (format 2, the batch_* functions).
 *
 * The pure-Python code in message.py is the reference and the fallback. This
 * module only walks runs of *plain* messages (magic 1, attributes 0, a key
 * length that fits, a matching CRC32C; docs/design.md section 2) and stops at the
 * first message it does not fully handle, telling the caller where and why:
 *
 *     STATUS_END     the whole buffer was plain, valid messages
 *     STATUS_TAIL    fewer than 22 bytes left, or a size field below 18, above
 *                    max_message_bytes or past the end of the buffer
 *     STATUS_CRC     a CRC32C mismatch
 *     STATUS_HEADER  magic, attributes or key length are not those of a plain
 *                    message (a compressed wrapper, or a bad header); its CRC
 *                    is not checked (the reference checks it first)
 *     STATUS_ARGS    an argument it does not handle (not an exact int, a
 *                    record type that is not a tuple subclass); nothing done
 *
 * The caller runs the reference from that position, which raises the typed
 * error (so every error message comes from one place) or decodes the
 * wrapper. Everything before the stop is exactly what the reference would
 * have produced.
 *
 * Functions:
 *
 *     scan(buf, max_message_bytes) -> (valid_bytes, count, status)
 *     decode(buf, base_offset, max_message_bytes, record_type, p0, p1)
 *         -> (records, consumed, status)
 *         records: (offset, timestamp, key, value) tuples, or with a
 *         record_type (a tuple subclass such as raylog.Message) instances
 *         of it holding (p0, p1, offset, timestamp, key, value)
 *     timestamps(buf, start, end) -> (largest, consumed)
 *         the time index's pass over an appended set (reference:
 *         raylog.storage.timeindex.timestamps)
 *     batch_records(values, keys) -> bytes | None
 *     batch_encode(values, keys, timestamp, attributes, producer_id, producer_epoch, base_sequence)
 *         -> bytes | None
 *     batch_validate(buf, start, end, count, base_ts, max_ts, append_time) -> bool
 *     batch_decode(buf, start, end, count, base_ts, max_ts, append_time, offset, skip[, record_type[, prefix]])
 *     batches_decode(buf, start, end, max_length, record_type, prefix[, last_type]) -> (rows, ends, stop)
 *     batches_index(buf, start, end, max_length) -> (offsets, timestamps, bounds, nexts, stop)
 *     batches_prepare(buf, start, end, max_length, header_type) -> (pairs, records, stop)
 *     batches_count(buf, start, end, max_length) -> (records, stop)
 *     batches_runs(buf, start, end) -> runs | None
 *     batches_stamp(buf, start, end, base, leader_epoch, header_type) -> pairs | None
 *     batches_largest_ts(buf, start, end) -> (largest, consumed)
 *         format 2 (raylog.storage.record_batch, the reference): the
 *         records section buf[start:end) of a batch (uncompressed, or
 *         decompressed by the caller), encoded, checked or
 *         decoded; None/False on anything the reference must handle
 *     crc32c(data, value=0) -> int            (what scan/decode use)
 *     crc32c_table(data, value=0) -> int      (the software implementation)
 *     CRC32C_IMPL: "sse4.2" or "table"
 *
 * Every buffer argument may be any C-contiguous buffer (bytes, bytearray,
 * memoryview); it is read in place. The GIL is released while CRCs of at
 * least GIL_RELEASE_BYTES bytes in all are checked; a buffer that another
 * thread changes meanwhile gives meaningless (but memory-safe) results.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define RAYLOG_HAVE_SSE42_PATH 1
#include <nmmintrin.h>
#endif

enum {
    STATUS_END = 0,
    STATUS_TAIL = 1,
    STATUS_CRC = 2,
    STATUS_HEADER = 3,
    STATUS_ARGS = 4,
};

#define LOG_OVERHEAD 4
#define HEADER_SIZE 22
#define MIN_MESSAGE_SIZE 18
#define MAGIC 1
#define GIL_RELEASE_BYTES (64 * 1024)

/* ------------------------------------------------------------------------ */
/* CRC32C (Castagnoli), reflected polynomial 0x82F63B78, as the crc32c
 * package computes it: crc32c(data, value) continues a CRC from value. */

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[8][256];

static void
crc_table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int t = 1; t < 8; t++) {
            c = (c >> 8) ^ crc_table[0][c & 0xFF];
            crc_table[t][n] = c;
        }
    }
}

/* slicing-by-8 */
static uint32_t
crc32c_sw(uint32_t crc, const unsigned char *p, size_t len)
{
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFF];
        len--;
    }
    while (len >= 8) {
        /* little-endian word order, whatever the machine's */
        uint32_t lo = ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24) ^ c;
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFF];
    return ~c;
}

#ifdef RAYLOG_HAVE_SSE42_PATH
/* The SSE4.2 crc32 instruction; compiled for that target only, called only
 * when the CPU reports it. */
__attribute__((target("sse4.2"))) static uint32_t
crc32c_sse42(uint32_t crc, const unsigned char *p, size_t len)
{
    uint64_t c = (uint32_t)~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

static uint32_t (*crc32c_fn)(uint32_t, const unsigned char *, size_t) = crc32c_sw;
static const char *crc32c_impl = "table";

static void
crc_select(void)
{
#ifdef RAYLOG_HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc32c_fn = crc32c_sse42;
        crc32c_impl = "sse4.2";
    }
#endif
}

/* ------------------------------------------------------------------------ */
/* the message layout */

static inline uint32_t
load_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int64_t
load_i64(const unsigned char *p)
{
    uint64_t v = (uint64_t)load_u32(p) << 32 | load_u32(p + 4);
    int64_t s;
    memcpy(&s, &v, 8);
    return s;
}

static inline int32_t
load_i32(const unsigned char *p)
{
    uint32_t v = load_u32(p);
    int32_t s;
    memcpy(&s, &v, 4);
    return s;
}

/* Whether the message at m (whose size field holds size, already bounded)
 * has the header of a plain message: magic 1, attributes 0, a key length
 * from -1 to size - 18. */
static inline int
plain_header(const unsigned char *m, uint32_t size)
{
    int32_t klen = load_i32(m + 18);
    return m[8] == MAGIC && m[9] == 0 && klen >= -1 && (int64_t)klen <= (int64_t)size - MIN_MESSAGE_SIZE;
}

/* Walk the plain messages of buf[0:n) from position 0 as the reference's
 * loop does. Sets *stop to the position of the first message not handled
 * (n when there is none) and *count to the number of messages before it;
 * returns the status. Touches no Python object: may run without the GIL. */
static int
walk(const unsigned char *buf, Py_ssize_t n, int64_t max_bytes, Py_ssize_t *stop, Py_ssize_t *count)
{
    Py_ssize_t pos = 0, c = 0;
    int status = STATUS_END;
    uint32_t (*crc)(uint32_t, const unsigned char *, size_t) = crc32c_fn;
    while (pos < n) {
        const unsigned char *m = buf + pos;
        uint32_t size;
        if (n - pos < HEADER_SIZE) {
            status = STATUS_TAIL;
            break;
        }
        size = load_u32(m);
        if ((int64_t)size > max_bytes || size < MIN_MESSAGE_SIZE ||
            (int64_t)size > (int64_t)(n - pos - LOG_OVERHEAD)) {
            status = STATUS_TAIL;
            break;
        }
        /* The header before the CRC: a wrapper's CRC is left to the
         * reference, which checks it before anything else, so that it is
         * computed once. */
        if (!plain_header(m, size)) {
            status = STATUS_HEADER;
            break;
        }
        if (crc(0, m + 8, (size_t)size - 4) != load_u32(m + 4)) {
            status = STATUS_CRC;
            break;
        }
        pos += LOG_OVERHEAD + (Py_ssize_t)size;
        c++;
    }
    *stop = pos;
    *count = c;
    return status;
}

static int
walk_maybe_nogil(const unsigned char *buf, Py_ssize_t n, int64_t max_bytes, Py_ssize_t *stop, Py_ssize_t *count)
{
    int status;
    if (n < GIL_RELEASE_BYTES)
        return walk(buf, n, max_bytes, stop, count);
    Py_BEGIN_ALLOW_THREADS
    status = walk(buf, n, max_bytes, stop, count);
    Py_END_ALLOW_THREADS
    return status;
}

/* ------------------------------------------------------------------------ */
/* arguments */

/* An exact int as an int64, saturated; 0 when obj is something else. */
static int
limit_arg(PyObject *obj, int64_t *out)
{
    int overflow;
    long long v;
    if (!PyLong_CheckExact(obj))
        return 0;
    v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow > 0)
        v = INT64_MAX;
    else if (overflow < 0)
        v = INT64_MIN;
    else if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

/* An exact int whose sum with any position of an n-byte buffer fits in an
 * int64; 0 when obj is something else. */
static int
offset_arg(PyObject *obj, Py_ssize_t n, int64_t *out)
{
    int overflow;
    long long v;
    if (!PyLong_CheckExact(obj))
        return 0;
    v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v > INT64_MAX - (long long)n)
        return 0;
    *out = (int64_t)v;
    return 1;
}

static PyObject *
result3(PyObject *first, Py_ssize_t second, int status)
{
    /* steals first */
    PyObject *res, *b, *c;
    if (first == NULL)
        return NULL;
    b = PyLong_FromSsize_t(second);
    c = PyLong_FromLong(status);
    if (b == NULL || c == NULL) {
        Py_DECREF(first);
        Py_XDECREF(b);
        Py_XDECREF(c);
        return NULL;
    }
    res = PyTuple_New(3);
    if (res == NULL) {
        Py_DECREF(first);
        Py_DECREF(b);
        Py_DECREF(c);
        return NULL;
    }
    PyTuple_SET_ITEM(res, 0, first);
    PyTuple_SET_ITEM(res, 1, b);
    PyTuple_SET_ITEM(res, 2, c);
    return res;
}

/* ------------------------------------------------------------------------ */
/* scan */

PyDoc_STRVAR(scan_doc,
"scan(buf, max_message_bytes) -> (valid_bytes, count, status)\n\n"
"Walk the plain messages at the start of buf (checking size bounds, CRC32C,\n"
"magic, attributes and key length) up to the first message it does not\n"
"handle; status says why it stopped there (STATUS_END: the end of buf).");

static PyObject *
speedups_scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t max_bytes;
    Py_ssize_t stop = 0, count = 0;
    int status;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "scan() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (!limit_arg(args[1], &max_bytes))
        status = STATUS_ARGS;
    else
        status = walk_maybe_nogil((const unsigned char *)view.buf, view.len, max_bytes, &stop, &count);
    PyBuffer_Release(&view);
    return result3(PyLong_FromSsize_t(stop), count, status);
}

/* ------------------------------------------------------------------------ */
/* timestamps (the time index's pass over an appended set) */

PyDoc_STRVAR(timestamps_doc,
"timestamps(buf, start, end) -> (largest, consumed)\n\n"
"The largest timestamp of the messages in buf[start:end] and the bytes of\n"
"the whole messages walked, exactly as raylog.storage.timeindex.timestamps\n"
"(the reference): size fields only, no CRC; stops at a size below 12 or a\n"
"message cut by end. largest is -2**63 when there is none.");

static PyObject *
speedups_timestamps(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t start, end, pos;
    int64_t largest = INT64_MIN;
    PyObject *a, *b, *res;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "timestamps() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    start = PyLong_AsSsize_t(args[1]);
    end = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || end == -1) && PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "timestamps(): start and end must satisfy 0 <= start <= end <= len(buf)");
        return NULL;
    }
    pos = start;
    {
        const unsigned char *buf = (const unsigned char *)view.buf;
        /* the reference: while end - pos >= 4 + 10 + 4 */
        while (end - pos >= LOG_OVERHEAD + 10 + 4) {
            uint32_t size = load_u32(buf + pos);
            int64_t ts;
            if (size < 10 + 4 || (int64_t)pos + LOG_OVERHEAD + (int64_t)size > (int64_t)end)
                break;
            ts = load_i64(buf + pos + 10);
            if (ts > largest)
                largest = ts;
            pos += LOG_OVERHEAD + (Py_ssize_t)size;
        }
    }
    PyBuffer_Release(&view);
    a = PyLong_FromLongLong(largest);
    b = PyLong_FromSsize_t(pos - start);
    if (a == NULL || b == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    res = PyTuple_Pack(2, a, b);
    Py_DECREF(a);
    Py_DECREF(b);
    return res;
}

/* ------------------------------------------------------------------------ */
/* decode */

/* A new record: a tuple of the n items (stolen), or an instance of the tuple
 * subclass type built as tuple.__new__(type, items) builds it.
 *
 * A record whose items are all untracked by the garbage collector (str, int,
 * bytes, None: what a decoded message holds) cannot be part of a reference
 * cycle, so it is untracked at once, as CPython untracks such tuples on
 * their first collection; a type whose instances have a __dict__ stays
 * tracked. Without this, a consumer holding a million messages pays for the
 * collector walking all of them again and again (several times the cost of
 * building them). */
static PyObject *
new_record(PyTypeObject *type, PyObject **items, Py_ssize_t n)
{
    PyObject *rec = type == &PyTuple_Type ? PyTuple_New(n) : type->tp_alloc(type, n);
    int atomic = type == &PyTuple_Type || type->tp_dictoffset == 0;
    if (rec == NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            Py_DECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (atomic && PyObject_IS_GC(item) && PyObject_GC_IsTracked(item))
            atomic = 0;
        PyTuple_SET_ITEM(rec, i, item);
    }
    if (atomic && PyObject_GC_IsTracked(rec))
        PyObject_GC_UnTrack(rec);
    return rec;
}

PyDoc_STRVAR(decode_doc,
"decode(buf, base_offset, max_message_bytes, record_type, p0, p1[, counted])\n"
"    -> (records, consumed, status)\n\n"
"Decode the plain messages at the start of buf up to the first message it\n"
"does not handle (status says why; STATUS_END: the end of buf). Records are\n"
"(offset, timestamp, key, value) tuples, or with record_type (a tuple\n"
"subclass, or None) record_type instances of (p0, p1, offset, timestamp,\n"
"key, value). A message's offset is base_offset plus its byte position in\n"
"buf; with counted true, base_offset plus its index (the inner messages of\n"
"a wrapper stored at base_offset).");

static PyObject *
speedups_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    const unsigned char *buf;
    Py_ssize_t n, stop = 0, count = 0, pos = 0, i;
    int64_t base, max_bytes, last_ts = 0;
    int status, counted = 0;
    PyTypeObject *type = NULL;
    PyObject *records = NULL, *p0, *p1, *ts_obj = NULL;

    if (nargs != 6 && nargs != 7) {
        PyErr_Format(PyExc_TypeError, "decode() takes 6 or 7 arguments (%zd given)", nargs);
        return NULL;
    }
    if (nargs == 7 && (counted = PyObject_IsTrue(args[6])) < 0)
        return NULL;
    p0 = args[4];
    p1 = args[5];
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    buf = (const unsigned char *)view.buf;
    n = view.len;
    if (args[3] != Py_None) {
        if (PyType_Check(args[3]) && PyType_IsSubtype((PyTypeObject *)args[3], &PyTuple_Type))
            type = (PyTypeObject *)args[3];
    }
    if (!offset_arg(args[1], n, &base) || !limit_arg(args[2], &max_bytes) ||
        (args[3] != Py_None && type == NULL)) {
        PyBuffer_Release(&view);
        return result3(PyList_New(0), 0, STATUS_ARGS);
    }

    /* pass 1: sizes, CRCs and headers, maybe without the GIL */
    status = walk_maybe_nogil(buf, n, max_bytes, &stop, &count);

    /* pass 2: the records of the messages before the stop */
    records = PyList_New(count);
    if (records == NULL)
        goto error;
    for (i = 0; i < count; i++) {
        const unsigned char *m = buf + pos;
        uint32_t size;
        int32_t klen;
        int64_t ts;
        Py_ssize_t kbytes;
        PyObject *items[6], **f = items;
        PyObject *rec;

        /* Pass 1 checked these; checked again so that a buffer changed by
         * another thread meanwhile never leads outside it. */
        if (stop - pos < HEADER_SIZE || (size = load_u32(m)) < MIN_MESSAGE_SIZE ||
            (int64_t)size > (int64_t)(stop - pos - LOG_OVERHEAD) || !plain_header(m, size)) {
            if (PyList_SetSlice(records, i, count, NULL) < 0)
                goto error;
            status = STATUS_ARGS;
            break;
        }
        klen = load_i32(m + 18);
        kbytes = klen < 0 ? 0 : klen;
        ts = load_i64(m + 10);
        if (ts_obj == NULL || ts != last_ts) {
            /* one int object for a run of equal timestamps */
            Py_XDECREF(ts_obj);
            ts_obj = PyLong_FromLongLong(ts);
            if (ts_obj == NULL)
                goto error;
            last_ts = ts;
        }
        if (type != NULL) {
            Py_INCREF(p0);
            Py_INCREF(p1);
            *f++ = p0;
            *f++ = p1;
        }
        f[0] = PyLong_FromLongLong(counted ? base + i : base + pos);
        Py_INCREF(ts_obj);
        f[1] = ts_obj;
        if (klen < 0) {
            Py_INCREF(Py_None);
            f[2] = Py_None;
        }
        else
            f[2] = PyBytes_FromStringAndSize((const char *)m + HEADER_SIZE, kbytes);
        f[3] = PyBytes_FromStringAndSize((const char *)m + HEADER_SIZE + kbytes,
                                         (Py_ssize_t)size - MIN_MESSAGE_SIZE - kbytes);
        if (f[0] == NULL || f[2] == NULL || f[3] == NULL) {
            for (PyObject **it = items; it < f + 4; it++)
                Py_XDECREF(*it);
            goto error;
        }
        rec = new_record(type ? type : &PyTuple_Type, items, (f - items) + 4);
        if (rec == NULL)
            goto error;
        PyList_SET_ITEM(records, i, rec);
        pos += LOG_OVERHEAD + (Py_ssize_t)size;
    }
    Py_XDECREF(ts_obj);
    PyBuffer_Release(&view);
    return result3(records, pos, status);

error:
    Py_XDECREF(ts_obj);
    Py_XDECREF(records);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* encode (the producer's message sets) */

static inline void
store_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void
store_i64(unsigned char *p, int64_t s)
{
    uint64_t v;
    memcpy(&v, &s, 8);
    store_u32(p, (uint32_t)(v >> 32));
    store_u32(p + 4, (uint32_t)v);
}

/* An int (or int subclass) as an int64; 0 when obj is something else or out
 * of range (the reference raises for those). */
static int
ts_arg(PyObject *obj, int64_t *out)
{
    int overflow;
    long long v;
    if (!PyLong_Check(obj))
        return 0;
    v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

PyDoc_STRVAR(encode_doc,
"encode(values, keys, timestamp) -> bytes | None\n\n"
"The uncompressed message set of values (a list or tuple of bytes) with\n"
"keys (None, or one bytes or None per value) and timestamp (one int for\n"
"every message, or a list or tuple of one int per value), byte for byte as\n"
"raylog.storage.message.encode_message_set (the reference) builds it.\n"
"None when an argument is not one of those (not exact bytes, a length that\n"
"differs, a timestamp outside int64, a message over 4 GiB): the reference\n"
"then builds the set or raises.");

static PyObject *
speedups_encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *values, *keys, *tss, *out;
    PyObject **vitems, **kitems = NULL, **titems = NULL;
    Py_ssize_t n, i;
    int64_t one_ts = 0;
    uint64_t total = 0;
    unsigned char *p;
    uint32_t (*crc)(uint32_t, const unsigned char *, size_t) = crc32c_fn;

    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "encode() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    values = args[0];
    keys = args[1];
    tss = args[2];
    if (!PyList_CheckExact(values) && !PyTuple_CheckExact(values))
        Py_RETURN_NONE;
    n = PySequence_Fast_GET_SIZE(values);
    vitems = PySequence_Fast_ITEMS(values);
    if (keys != Py_None) {
        if ((!PyList_CheckExact(keys) && !PyTuple_CheckExact(keys)) || PySequence_Fast_GET_SIZE(keys) != n)
            Py_RETURN_NONE;
        kitems = PySequence_Fast_ITEMS(keys);
    }
    if (PyList_CheckExact(tss) || PyTuple_CheckExact(tss)) {
        if (PySequence_Fast_GET_SIZE(tss) != n)
            Py_RETURN_NONE;
        titems = PySequence_Fast_ITEMS(tss);
    }
    else if (!ts_arg(tss, &one_ts))
        Py_RETURN_NONE;

    /* pass 1: check every item, add up the sizes (the lists are not changed
     * meanwhile: no Python code runs between the passes) */
    for (i = 0; i < n; i++) {
        PyObject *k = kitems ? kitems[i] : Py_None;
        uint64_t size;
        int64_t ts;
        if (!PyBytes_CheckExact(vitems[i]) || (k != Py_None && !PyBytes_CheckExact(k)))
            Py_RETURN_NONE;
        if (titems && !ts_arg(titems[i], &ts))
            Py_RETURN_NONE;
        size = (uint64_t)MIN_MESSAGE_SIZE + (uint64_t)PyBytes_GET_SIZE(vitems[i]) +
               (k == Py_None ? 0 : (uint64_t)PyBytes_GET_SIZE(k));
        if (size > 0xFFFFFFFFu || (k != Py_None && PyBytes_GET_SIZE(k) > INT32_MAX))
            Py_RETURN_NONE;
        total += LOG_OVERHEAD + size;
    }
    if (total > (uint64_t)PY_SSIZE_T_MAX)
        Py_RETURN_NONE;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL)
        return NULL;

    /* pass 2: write the messages (fields 1-8 of docs/design.md section 2) */
    p = (unsigned char *)PyBytes_AS_STRING(out);
    for (i = 0; i < n; i++) {
        PyObject *k = kitems ? kitems[i] : Py_None;
        Py_ssize_t vlen = PyBytes_GET_SIZE(vitems[i]);
        Py_ssize_t klen = k == Py_None ? 0 : PyBytes_GET_SIZE(k);
        uint32_t size = (uint32_t)(MIN_MESSAGE_SIZE + klen + vlen);
        int64_t ts = one_ts;
        if (titems)
            ts_arg(titems[i], &ts);  /* checked in pass 1 */
        store_u32(p, size);
        p[8] = MAGIC;
        p[9] = 0;
        store_i64(p + 10, ts);
        store_u32(p + 18, k == Py_None ? 0xFFFFFFFFu : (uint32_t)klen);
        if (klen)
            memcpy(p + HEADER_SIZE, PyBytes_AS_STRING(k), (size_t)klen);
        memcpy(p + HEADER_SIZE + klen, PyBytes_AS_STRING(vitems[i]), (size_t)vlen);
        store_u32(p + 4, crc(0, p + 8, (size_t)size - 4));
        p += LOG_OVERHEAD + size;
    }
    return out;
}

/* ------------------------------------------------------------------------ */
/* group (the producer's keyed batches) */

PyDoc_STRVAR(group_doc,
"group(values, keys, partitions) -> list | None\n\n"
"values and keys split by partition: keyed messages by crc32c(key) mod\n"
"partitions, keyless ones (key None) under -1. One tuple per partition met,\n"
"by increasing partition: (partition, positions, values, keys, total,\n"
"largest), with positions the places in the call (increasing), total the\n"
"sum and largest the maximum of len(key) + len(value) over the group.\n"
"Exactly raylog.producer.partitioner.group_by_partition (the reference);\n"
"None when an argument is not a list or tuple of bytes (keys: bytes or\n"
"None) of the same length, or partitions not an int from 1 to 2**20.");

static PyObject *
speedups_group(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *values, *keys, *res = NULL;
    PyObject **vitems, **kitems;
    Py_ssize_t n, i, groups = 0;
    int64_t parts;
    int32_t *of = NULL;
    Py_ssize_t *counts = NULL, *fill = NULL;
    PyObject **lists = NULL, *out = NULL;
    uint64_t *sums = NULL;
    uint32_t (*crc)(uint32_t, const unsigned char *, size_t) = crc32c_fn;

    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "group() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    values = args[0];
    keys = args[1];
    if ((!PyList_CheckExact(values) && !PyTuple_CheckExact(values)) ||
        (!PyList_CheckExact(keys) && !PyTuple_CheckExact(keys)) ||
        PySequence_Fast_GET_SIZE(values) != PySequence_Fast_GET_SIZE(keys) ||
        !limit_arg(args[2], &parts) || parts < 1 || parts > (1 << 20))
        Py_RETURN_NONE;
    n = PySequence_Fast_GET_SIZE(values);
    vitems = PySequence_Fast_ITEMS(values);
    kitems = PySequence_Fast_ITEMS(keys);
    of = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    /* counts[0] holds the keyless ones, counts[p + 1] partition p */
    counts = PyMem_Calloc((size_t)parts + 1, sizeof(Py_ssize_t));
    if (of == NULL || counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *k = kitems[i];
        if (!PyBytes_CheckExact(vitems[i]))
            goto none;
        if (k == Py_None)
            of[i] = -1;
        else if (PyBytes_CheckExact(k))
            of[i] = (int32_t)(crc(0, (const unsigned char *)PyBytes_AS_STRING(k), (size_t)PyBytes_GET_SIZE(k)) %
                              (uint32_t)parts);
        else
            goto none;
        if (counts[of[i] + 1]++ == 0)
            groups++;
    }
    /* one pass: each message into its group's lists (counting sort) */
    lists = PyMem_Calloc((size_t)(parts + 1) * 3, sizeof(PyObject *));
    fill = PyMem_Calloc((size_t)parts + 1, sizeof(Py_ssize_t));
    sums = PyMem_Calloc((size_t)(parts + 1) * 2, sizeof(uint64_t));
    if (lists == NULL || fill == NULL || sums == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int64_t slot = 0; slot <= parts; slot++) {
        if (counts[slot] == 0)
            continue;
        for (int f = 0; f < 3; f++)
            if ((lists[slot * 3 + f] = PyList_New(counts[slot])) == NULL)
                goto done;
    }
    for (i = 0; i < n; i++) {
        Py_ssize_t slot = of[i] + 1, j = fill[slot]++;
        PyObject *index = PyLong_FromSsize_t(i);
        uint64_t len = (uint64_t)PyBytes_GET_SIZE(vitems[i]) +
                       (kitems[i] == Py_None ? 0 : (uint64_t)PyBytes_GET_SIZE(kitems[i]));
        if (index == NULL)
            goto done;
        PyList_SET_ITEM(lists[slot * 3], j, index);
        Py_INCREF(vitems[i]);
        PyList_SET_ITEM(lists[slot * 3 + 1], j, vitems[i]);
        Py_INCREF(kitems[i]);
        PyList_SET_ITEM(lists[slot * 3 + 2], j, kitems[i]);
        sums[slot * 2] += len;
        if (len > sums[slot * 2 + 1])
            sums[slot * 2 + 1] = len;
    }
    out = PyList_New(groups);
    if (out == NULL)
        goto done;
    {
        Py_ssize_t g = 0;
        for (int64_t slot = 0; slot <= parts; slot++) {
            PyObject *item;
            if (counts[slot] == 0)
                continue;
            /* N steals the three lists */
            item = Py_BuildValue("(LNNNKK)", (long long)(slot - 1), lists[slot * 3], lists[slot * 3 + 1],
                                 lists[slot * 3 + 2], (unsigned long long)sums[slot * 2],
                                 (unsigned long long)sums[slot * 2 + 1]);
            lists[slot * 3] = lists[slot * 3 + 1] = lists[slot * 3 + 2] = NULL;
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
            PyList_SET_ITEM(out, g++, item);
        }
    }
    res = out;
    goto done;
none:
    res = Py_None;
    Py_INCREF(res);
done:
    if (lists != NULL)
        for (int64_t s = 0; s < (parts + 1) * 3; s++)
            Py_XDECREF(lists[s]);
    PyMem_Free(lists);
    PyMem_Free(fill);
    PyMem_Free(sums);
    PyMem_Free(of);
    PyMem_Free(counts);
    return res;
}

/* ------------------------------------------------------------------------ */
/* index (the consumer's batch path) */

PyDoc_STRVAR(index_doc,
"index(buf, base_offset, max_message_bytes)\n"
"    -> (offsets, timestamps, bounds, consumed, status)\n\n"
"The plain messages at the start of buf up to the first it does not handle,\n"
"checked as decode checks them (status says why it stopped), as columns of\n"
"native int64s in bytes, one row per message: offsets, timestamps, and\n"
"bounds (three per message: the key's start in buf or -1 without a key,\n"
"the value's start, the value's end). Nothing of buf is copied.");

static PyObject *
speedups_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    const unsigned char *buf;
    Py_ssize_t n, stop = 0, count = 0, pos = 0, i;
    int64_t base, max_bytes;
    int status;
    PyObject *offs = NULL, *tss = NULL, *bounds = NULL;
    int64_t *op, *tp, *bp;

    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "index() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    buf = (const unsigned char *)view.buf;
    n = view.len;
    if (!offset_arg(args[1], n, &base) || !limit_arg(args[2], &max_bytes)) {
        PyBuffer_Release(&view);
        return Py_BuildValue("(yyyni)", "", "", "", (Py_ssize_t)0, STATUS_ARGS);
    }
    status = walk_maybe_nogil(buf, n, max_bytes, &stop, &count);
    offs = PyBytes_FromStringAndSize(NULL, count * 8);
    tss = PyBytes_FromStringAndSize(NULL, count * 8);
    bounds = PyBytes_FromStringAndSize(NULL, count * 24);
    if (offs == NULL || tss == NULL || bounds == NULL)
        goto error;
    op = (int64_t *)PyBytes_AS_STRING(offs);
    tp = (int64_t *)PyBytes_AS_STRING(tss);
    bp = (int64_t *)PyBytes_AS_STRING(bounds);
    for (i = 0; i < count; i++) {
        const unsigned char *m = buf + pos;
        uint32_t size;
        int32_t klen;
        /* pass 1 checked these; checked again so that a buffer changed by
         * another thread meanwhile never leads outside it */
        if (stop - pos < HEADER_SIZE || (size = load_u32(m)) < MIN_MESSAGE_SIZE ||
            (int64_t)size > (int64_t)(stop - pos - LOG_OVERHEAD) || !plain_header(m, size)) {
            count = i;
            status = STATUS_ARGS;
            if (_PyBytes_Resize(&offs, count * 8) < 0 || _PyBytes_Resize(&tss, count * 8) < 0 ||
                _PyBytes_Resize(&bounds, count * 24) < 0)
                goto error;
            break;
        }
        klen = load_i32(m + 18);
        op[i] = base + pos;
        tp[i] = load_i64(m + 10);
        bp[3 * i] = klen < 0 ? -1 : (int64_t)(pos + HEADER_SIZE);
        bp[3 * i + 1] = pos + HEADER_SIZE + (klen < 0 ? 0 : klen);
        bp[3 * i + 2] = pos + LOG_OVERHEAD + (Py_ssize_t)size;
        pos += LOG_OVERHEAD + (Py_ssize_t)size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NNNni)", offs, tss, bounds, pos, status);

error:
    Py_XDECREF(offs);
    Py_XDECREF(tss);
    Py_XDECREF(bounds);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* crc32c */

static PyObject *
crc_call(PyObject *const *args, Py_ssize_t nargs, const char *name,
         uint32_t (*fn)(uint32_t, const unsigned char *, size_t))
{
    Py_buffer view;
    unsigned long value = 0;
    uint32_t crc;
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 1 or 2 arguments (%zd given)", name, nargs);
        return NULL;
    }
    if (nargs == 2) {
        value = PyLong_AsUnsignedLong(args[1]);
        if (value == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        if (value > 0xFFFFFFFFul) {
            PyErr_Format(PyExc_OverflowError, "%s(): value must fit in 32 bits", name);
            return NULL;
        }
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len >= GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        crc = fn((uint32_t)value, (const unsigned char *)view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    }
    else
        crc = fn((uint32_t)value, (const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc32c_doc,
"crc32c(data, value=0) -> int\n\n"
"CRC32C of data, continuing from value, as scan and decode compute it\n"
"(SSE4.2 when the CPU has it, else a table).");

static PyObject *
speedups_crc32c(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return crc_call(args, nargs, "crc32c", crc32c_fn);
}

PyDoc_STRVAR(crc32c_table_doc,
"crc32c_table(data, value=0) -> int\n\n"
"CRC32C of data, continuing from value, by the software (slicing-by-8) table.");

static PyObject *
speedups_crc32c_table(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return crc_call(args, nargs, "crc32c_table", crc32c_sw);
}

/* ------------------------------------------------------------------------ */
/* format 2: uncompressed record batches (reference: raylog/storage/record_batch.py,
 * where the layout is documented field by field). These functions see only the
 * records section of a batch whose header the reference has checked; on any
 * doubt they answer None/False and the reference does the work or raises. */

#define BATCH_HEADER_SIZE 61
#define MIN_RECORD_SIZE 7

/* Kafka's zigzag varint of v (at most 10 bytes) at p; returns the bytes written. */
static inline Py_ssize_t
put_varint(unsigned char *p, int64_t v)
{
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    Py_ssize_t n = 0;
    while (u >= 0x80) {
        p[n++] = (unsigned char)(u | 0x80);
        u >>= 7;
    }
    p[n++] = (unsigned char)u;
    return n;
}

static inline Py_ssize_t
varint_size(int64_t v)
{
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    Py_ssize_t n = 1;
    while (u >= 0x80) {
        n++;
        u >>= 7;
    }
    return n;
}

/* Read the varint at *pos (before end) of at most max_bytes (5: an i32,
 * 10: an i64) into *out; 0 when it runs past end, is longer or out of range. */
static inline int
get_varint(const unsigned char *b, Py_ssize_t *pos, Py_ssize_t end, int max_bytes, int64_t *out)
{
    uint64_t u = 0;
    int shift = 0, i;
    Py_ssize_t p = *pos;
    for (i = 0; i < max_bytes; i++) {
        unsigned char c;
        if (p >= end)
            return 0;
        c = b[p++];
        if (i == 9 && (c & 0x7F) > 1)
            return 0;  /* past 64 bits */
        u |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            if (max_bytes == 5 && (u >> 32))
                return 0;
            if (max_bytes == 5) {
                uint32_t w = (uint32_t)u;
                *out = (int64_t)(int32_t)((w >> 1) ^ (0u - (w & 1)));
            }
            else {
                uint64_t z = (u >> 1) ^ (0 - (u & 1));
                memcpy(out, &z, 8);
            }
            *pos = p;
            return 1;
        }
        shift += 7;
    }
    return 0;
}

PyDoc_STRVAR(batch_records_doc,
"batch_records(values, keys) -> bytes | None\n\n"
"The uncompressed records section of a batch of values (a list or tuple of\n"
"bytes or None) with keys (None, or one bytes or None per value), every\n"
"timestampDelta 0 and no headers, byte for byte as\n"
"raylog.storage.record_batch.encode_batch (the reference) builds it. None\n"
"when an argument is not one of those or a length exceeds an i32.");

PyDoc_STRVAR(batch_encode_doc,
"batch_encode(values, keys, timestamp, attributes, producer_id, producer_epoch, base_sequence)\n"
"    -> bytes | None\n\n"
"The whole uncompressed batch of batch_records(values, keys) with one\n"
"timestamp for every record: the 61-byte header (baseOffset 0,\n"
"partitionLeaderEpoch -1, raylog's lastOffsetDelta, the crc) and the records,\n"
"byte for byte as raylog.storage.record_batch.encode_batch builds it. None as\n"
"for batch_records, or when an int argument is out of its field's range.");

static inline void
store_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

/* The records of values/keys (checked) written after `head` bytes left for
 * the caller; NULL with no error set when an argument is not handled. */
static PyObject *
records_into(PyObject *values, PyObject *keys, Py_ssize_t head, int *declined)
{
    PyObject *out;
    PyObject **vitems, **kitems = NULL;
    Py_ssize_t n, i;
    uint64_t total = 0;
    unsigned char *p;

    *declined = 1;
    if (!PyList_CheckExact(values) && !PyTuple_CheckExact(values))
        return NULL;
    n = PySequence_Fast_GET_SIZE(values);
    vitems = PySequence_Fast_ITEMS(values);
    if (n > INT32_MAX)
        return NULL;
    if (keys != Py_None) {
        if ((!PyList_CheckExact(keys) && !PyTuple_CheckExact(keys)) || PySequence_Fast_GET_SIZE(keys) != n)
            return NULL;
        kitems = PySequence_Fast_ITEMS(keys);
    }
    /* pass 1: check the items, add up the sizes */
    for (i = 0; i < n; i++) {
        PyObject *k = kitems ? kitems[i] : Py_None, *v = vitems[i];
        int64_t klen, vlen, body;
        if ((v != Py_None && !PyBytes_CheckExact(v)) || (k != Py_None && !PyBytes_CheckExact(k)))
            return NULL;
        klen = k == Py_None ? -1 : PyBytes_GET_SIZE(k);
        vlen = v == Py_None ? -1 : PyBytes_GET_SIZE(v);
        body = 1 + 1 + varint_size(i) + varint_size(klen) + (klen > 0 ? klen : 0) + varint_size(vlen) +
               (vlen > 0 ? vlen : 0) + 1;
        if (body > INT32_MAX)
            return NULL;
        total += (uint64_t)(varint_size(body) + body);
    }
    if (total + (uint64_t)head > (uint64_t)INT32_MAX)
        return NULL;
    *declined = 0;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total + (uint64_t)head));
    if (out == NULL)
        return NULL;
    /* pass 2: write the records (no Python code ran in between) */
    p = (unsigned char *)PyBytes_AS_STRING(out) + head;
    for (i = 0; i < n; i++) {
        PyObject *k = kitems ? kitems[i] : Py_None, *v = vitems[i];
        int64_t klen = k == Py_None ? -1 : PyBytes_GET_SIZE(k);
        int64_t vlen = v == Py_None ? -1 : PyBytes_GET_SIZE(v);
        int64_t body = 1 + 1 + varint_size(i) + varint_size(klen) + (klen > 0 ? klen : 0) + varint_size(vlen) +
                       (vlen > 0 ? vlen : 0) + 1;
        p += put_varint(p, body);
        *p++ = 0;  /* attributes */
        *p++ = 0;  /* timestampDelta 0 */
        p += put_varint(p, i);
        p += put_varint(p, klen);
        if (klen > 0) {
            memcpy(p, PyBytes_AS_STRING(k), (size_t)klen);
            p += klen;
        }
        p += put_varint(p, vlen);
        if (vlen > 0) {
            memcpy(p, PyBytes_AS_STRING(v), (size_t)vlen);
            p += vlen;
        }
        *p++ = 0;  /* no headers */
    }
    return out;
}

static PyObject *
speedups_batch_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *out;
    int declined;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "batch_records() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    out = records_into(args[0], args[1], 0, &declined);
    if (out == NULL && declined)
        Py_RETURN_NONE;
    return out;
}

static PyObject *
speedups_batch_encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *out;
    int64_t ts, attrs, pid, epoch, seq;
    int declined;
    unsigned char *b;
    Py_ssize_t size;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "batch_encode() takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!ts_arg(args[2], &ts) || !ts_arg(args[3], &attrs) || !ts_arg(args[4], &pid) || !ts_arg(args[5], &epoch) ||
        !ts_arg(args[6], &seq))
        Py_RETURN_NONE;
    if (attrs < INT16_MIN || attrs > INT16_MAX || epoch < INT16_MIN || epoch > INT16_MAX || seq < INT32_MIN ||
        seq > INT32_MAX)
        Py_RETURN_NONE;
    if ((!PyList_CheckExact(args[0]) && !PyTuple_CheckExact(args[0])) || PySequence_Fast_GET_SIZE(args[0]) < 1)
        Py_RETURN_NONE;
    out = records_into(args[0], args[1], BATCH_HEADER_SIZE, &declined);
    if (out == NULL) {
        if (declined)
            Py_RETURN_NONE;
        return NULL;
    }
    b = (unsigned char *)PyBytes_AS_STRING(out);
    size = PyBytes_GET_SIZE(out);
    /* the header, fields 1-13 of record_batch.py */
    store_i64(b, 0);                                           /* baseOffset */
    store_u32(b + 8, (uint32_t)(size - 12));                   /* batchLength */
    store_u32(b + 12, 0xFFFFFFFFu);                            /* partitionLeaderEpoch -1 */
    b[16] = 2;                                                 /* magic */
    store_u16(b + 21, (uint16_t)(int16_t)attrs);               /* attributes */
    store_u32(b + 23, (uint32_t)(size - 1));                   /* lastOffsetDelta */
    store_i64(b + 27, ts);                                     /* baseTimestamp */
    store_i64(b + 35, ts);                                     /* maxTimestamp */
    store_i64(b + 43, pid);                                    /* producerId */
    store_u16(b + 51, (uint16_t)(int16_t)epoch);               /* producerEpoch */
    store_u32(b + 53, (uint32_t)(int32_t)seq);                 /* baseSequence */
    store_u32(b + 57, (uint32_t)PySequence_Fast_GET_SIZE(args[0])); /* count */
    store_u32(b + 17, crc32c_fn(0, b + 21, (size_t)(size - 21)));  /* crc */
    return out;
}

/* Walk the records section b[0:end) of a batch as the reference's _walk does.
 * With rows (a list), append one row per record of index >= skip: a
 * record_type instance (a tuple subclass, or a tuple when record_type is
 * tuple) of (offset, timestamp, key, value, headers); with prefix (a
 * 2-tuple (p0, p1)) of (p0, p1, offset, timestamp, key, value), and the
 * headers list as a seventh item only when it is not empty (the consumer's
 * messages: raylog.consumer.record). With last_type, the last record is a
 * last_type instance (its type has a __dict__) with _next_offset =
 * next_offset. A record holding no list is untracked by the collector (see
 * new_record). Returns 1 when every record is sound, 0 when not (the
 * reference raises), -1 on a Python error. */
static PyObject *next_offset_name;  /* "_next_offset", interned at import */

static int
walk_batch(const unsigned char *b, Py_ssize_t end, int64_t count, int64_t base_ts, int64_t max_ts,
           int append_time, int64_t offset, int64_t skip, PyObject *rows, PyTypeObject *record_type,
           PyObject *prefix, PyTypeObject *last_type, int64_t next_offset)
{
    Py_ssize_t pos = 0;
    int64_t i;
    if (count > end / MIN_RECORD_SIZE)
        return 0;
    for (i = 0; i < count; i++) {
        int64_t length, ts_delta, delta, klen, vlen, hcount, h, ts;
        Py_ssize_t p, rend, kpos, vpos;
        PyObject *headers = NULL;
        int want = rows != NULL && i >= skip;
        if (!get_varint(b, &pos, end, 5, &length) || length < MIN_RECORD_SIZE - 1 || length > end - pos)
            return 0;
        rend = pos + (Py_ssize_t)length;
        if (b[pos] != 0)
            return 0;
        p = pos + 1;
        if (!get_varint(b, &p, rend, 10, &ts_delta) || !get_varint(b, &p, rend, 5, &delta) || delta != i)
            return 0;
        if (__builtin_add_overflow(base_ts, ts_delta, &ts))
            return 0;
        if (!append_time && ts > max_ts)
            return 0;
        if (!get_varint(b, &p, rend, 5, &klen) || klen < -1 || klen > rend - p)
            return 0;
        kpos = p;
        p += klen > 0 ? (Py_ssize_t)klen : 0;
        if (!get_varint(b, &p, rend, 5, &vlen) || vlen < -1 || vlen > rend - p)
            return 0;
        vpos = p;
        p += vlen > 0 ? (Py_ssize_t)vlen : 0;
        if (!get_varint(b, &p, rend, 5, &hcount) || hcount < 0 || hcount > rend - p)
            return 0;
        if (want && (hcount > 0 || prefix == NULL) && (headers = PyList_New(0)) == NULL)
            return -1;
        for (h = 0; h < hcount; h++) {
            int64_t hklen, hvlen;
            PyObject *hkey, *hval, *pair;
            if (!get_varint(b, &p, rend, 5, &hklen) || hklen < 0 || hklen > rend - p)
                goto bad;
            hkey = PyUnicode_DecodeUTF8((const char *)b + p, (Py_ssize_t)hklen, "strict");
            if (hkey == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                    goto fail;
                PyErr_Clear();
                goto bad;
            }
            p += (Py_ssize_t)hklen;
            if (!get_varint(b, &p, rend, 5, &hvlen) || hvlen < -1 || hvlen > rend - p) {
                Py_DECREF(hkey);
                goto bad;
            }
            if (!want) {
                Py_DECREF(hkey);
                p += hvlen > 0 ? (Py_ssize_t)hvlen : 0;
                continue;
            }
            if (hvlen < 0) {
                hval = Py_None;
                Py_INCREF(hval);
            }
            else if ((hval = PyBytes_FromStringAndSize((const char *)b + p, (Py_ssize_t)hvlen)) == NULL) {
                Py_DECREF(hkey);
                goto fail;
            }
            p += hvlen > 0 ? (Py_ssize_t)hvlen : 0;
            pair = PyTuple_New(2);
            if (pair == NULL) {
                Py_DECREF(hkey);
                Py_DECREF(hval);
                goto fail;
            }
            PyTuple_SET_ITEM(pair, 0, hkey);
            PyTuple_SET_ITEM(pair, 1, hval);
            if (PyList_Append(headers, pair) < 0) {
                Py_DECREF(pair);
                goto fail;
            }
            Py_DECREF(pair);
        }
        if (p != rend)
            goto bad;
        if (want) {
            Py_ssize_t at = prefix != NULL ? 2 : 0;
            Py_ssize_t items = prefix == NULL ? 5 : headers != NULL ? 7 : 6;  /* (prefix: a list only for hcount > 0) */
            PyTypeObject *type = last_type != NULL && i == count - 1 ? last_type : record_type;
            PyObject *rec = type == &PyTuple_Type ? PyTuple_New(items) : type->tp_alloc(type, items);
            PyObject *o, *t, *k, *v;
            if (rec == NULL)
                goto fail;
            o = PyLong_FromLongLong(offset + i);
            t = PyLong_FromLongLong(append_time ? max_ts : ts);
            if (klen < 0) {
                k = Py_None;
                Py_INCREF(k);
            }
            else
                k = PyBytes_FromStringAndSize((const char *)b + kpos, (Py_ssize_t)klen);
            if (vlen < 0) {
                v = Py_None;
                Py_INCREF(v);
            }
            else
                v = PyBytes_FromStringAndSize((const char *)b + vpos, (Py_ssize_t)vlen);
            if (prefix != NULL) {
                PyObject *p0 = PyTuple_GET_ITEM(prefix, 0), *p1 = PyTuple_GET_ITEM(prefix, 1);
                Py_INCREF(p0);
                Py_INCREF(p1);
                PyTuple_SET_ITEM(rec, 0, p0);
                PyTuple_SET_ITEM(rec, 1, p1);
            }
            PyTuple_SET_ITEM(rec, at + 0, o);
            PyTuple_SET_ITEM(rec, at + 1, t);
            PyTuple_SET_ITEM(rec, at + 2, k);
            PyTuple_SET_ITEM(rec, at + 3, v);
            if (items != 6)
                PyTuple_SET_ITEM(rec, at + 4, headers);
            headers = NULL;
            if (o == NULL || t == NULL || k == NULL || v == NULL) {
                Py_DECREF(rec);
                return -1;
            }
            if (type == last_type) {
                /* the batch's last record: its next offset is the batch's end, kept in its __dict__ */
                PyObject *next = PyLong_FromLongLong(next_offset);
                int failed = next == NULL || PyObject_GenericSetAttr(rec, next_offset_name, next) < 0;
                Py_XDECREF(next);
                if (failed) {
                    Py_DECREF(rec);
                    return -1;
                }
                /* Its __dict__ holds one int (an untracked dict) and its items
                 * no list: no cycle can pass through it unless someone sets an
                 * attribute on a received message (messages are immutable
                 * tuples to their users), so it is untracked as the others
                 * are. A batch of single records otherwise makes every
                 * message one more object for each collection to walk. */
                if (items != 7 && PyObject_GC_IsTracked(rec))
                    PyObject_GC_UnTrack(rec);
            }
            else if (items != 7 && (type == &PyTuple_Type || type->tp_dictoffset == 0) && PyObject_GC_IsTracked(rec))
                PyObject_GC_UnTrack(rec);  /* str, int, bytes, None only: no cycle (see new_record) */
            if (PyList_Append(rows, rec) < 0) {
                Py_DECREF(rec);
                return -1;
            }
            Py_DECREF(rec);
        }
        pos = rend;
        continue;
    bad:
        Py_XDECREF(headers);
        return 0;
    fail:
        Py_XDECREF(headers);
        return -1;
    }
    return pos == end;
}

/* The records section [start, end) of args[0], checked to lie in the buffer;
 * v: start, end, count, base_ts, max_ts, append_time. */
static int
batch_args(PyObject *const *args, Py_buffer *view, Py_ssize_t *start, Py_ssize_t *end, int64_t v[6])
{
    int k;
    for (k = 0; k < 6; k++)
        if (!ts_arg(args[1 + k], &v[k]))
            return 0;
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0)
        return -1;
    if (v[0] < 0 || v[1] < v[0] || v[1] > view->len) {
        PyBuffer_Release(view);
        return 0;
    }
    *start = (Py_ssize_t)v[0];
    *end = (Py_ssize_t)v[1];
    return 1;
}

PyDoc_STRVAR(batch_validate_doc,
"batch_validate(buf, start, end, count, base_ts, max_ts, append_time) -> bool\n\n"
"Whether the records section buf[start:end) of a batch (uncompressed, or\n"
"decompressed; the caller checked the header and crc) passes every check of the reference\n"
"(raylog.storage.record_batch._walk). False: the reference raises.");

static PyObject *
speedups_batch_validate(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t start, end;
    int64_t v[6];
    int ok;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "batch_validate() takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    ok = batch_args(args, &view, &start, &end, v);
    if (ok < 0)
        return NULL;
    if (ok == 0)
        Py_RETURN_FALSE;
    ok = walk_batch((const unsigned char *)view.buf + start, end - start, v[2], v[3], v[4],
                    PyObject_IsTrue(args[6]) == 1, 0, 0, NULL, NULL, NULL, NULL, 0);
    PyBuffer_Release(&view);
    if (ok < 0)
        return NULL;
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(batch_decode_doc,
"batch_decode(buf, start, end, count, base_ts, max_ts, append_time, offset, skip[, record_type[, prefix]])\n"
"    -> list | None\n\n"
"The records of index >= skip of the records section buf[start:end) of a batch\n"
"as (offset, timestamp, key, value, headers) tuples (or record_type instances,\n"
"a tuple subclass), exactly as the reference decodes them; with prefix (a\n"
"2-tuple), record_type instances of (*prefix, offset, timestamp, key, value)\n"
"and the headers list as a seventh item when not empty. None when a record\n"
"fails a check: the reference raises.");

static PyObject *
speedups_batch_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t start, end;
    int64_t v[6], offset, skip;
    PyObject *rows;
    PyTypeObject *record_type = &PyTuple_Type;
    PyObject *prefix = NULL;
    int ok;
    if (nargs < 9 || nargs > 11) {
        PyErr_Format(PyExc_TypeError, "batch_decode() takes 9 to 11 arguments (%zd given)", nargs);
        return NULL;
    }
    if (nargs >= 10) {
        if (!PyType_Check(args[9]) || !PyType_IsSubtype((PyTypeObject *)args[9], &PyTuple_Type))
            Py_RETURN_NONE;
        record_type = (PyTypeObject *)args[9];
    }
    if (nargs == 11) {
        if (!PyTuple_CheckExact(args[10]) || PyTuple_GET_SIZE(args[10]) != 2)
            Py_RETURN_NONE;
        prefix = args[10];
    }
    if (!ts_arg(args[7], &offset) || !ts_arg(args[8], &skip))
        Py_RETURN_NONE;
    ok = batch_args(args, &view, &start, &end, v);
    if (ok < 0)
        return NULL;
    if (ok == 0)
        Py_RETURN_NONE;
    rows = PyList_New(0);
    if (rows == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    ok = walk_batch((const unsigned char *)view.buf + start, end - start, v[2], v[3], v[4],
                    PyObject_IsTrue(args[6]) == 1, offset, skip, rows, record_type, prefix, NULL, 0);
    PyBuffer_Release(&view);
    if (ok <= 0) {
        Py_DECREF(rows);
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    return rows;
}

/* args[0] a buffer, args[1] and args[2] a range [start, end) within it:
 * 1 with the buffer held in view (flags: PyBUF_SIMPLE or PyBUF_WRITABLE),
 * 0 when the range is not two ints inside the buffer (the caller returns
 * None), -1 on a Python error. */
static int
buffer_range(PyObject *const *args, int flags, Py_buffer *view, int64_t *start, int64_t *end)
{
    if (!ts_arg(args[1], start) || !ts_arg(args[2], end))
        return 0;
    if (PyObject_GetBuffer(args[0], view, flags) < 0)
        return -1;
    if (*start < 0 || *end < *start || *end > view->len) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* The arguments (buf, start, end[, max_length]) that open a compiled pass
 * over the batches of a buffer (nargs must be want; max_length, when not
 * NULL, is args[3]): 1 with buf held in view, 0 when the pass does not take
 * them (the caller returns None), -1 on a Python error. */
static int
batch_pass_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name, Py_buffer *view,
                int64_t *start, int64_t *end, int64_t *max_length)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    if (max_length != NULL && !ts_arg(args[3], max_length))
        return 0;
    return buffer_range(args, PyBUF_SIMPLE, view, start, end);
}

/* The size (12 + batchLength) of the batch at b + pos when its frame passes
 * the checks of the reference's check_frame that a compiled pass makes
 * before it walks the records: whole before end, batchLength within
 * max_length (and format 2's 16 MiB - 1) and at least 49, magic 2,
 * attributes within allowed (bits outside it: the reference takes the
 * batch), count at least 1, lastOffsetDelta raylog's or a Kafka client's,
 * and the crc. 0 when not. */
static int64_t
plain_frame(const unsigned char *b, Py_ssize_t pos, int64_t end, int64_t max_length, unsigned allowed)
{
    int64_t length, size, count, lod;
    unsigned attrs;
    if (end - pos < 61)
        return 0;
    length = load_i32(b + pos + 8);
    if (length < 49 || length > max_length || length > (1 << 24) - 1 || pos + 12 + length > end)
        return 0;
    size = 12 + length;
    attrs = ((unsigned)b[pos + 21] << 8) | b[pos + 22];
    if (b[pos + 16] != 2 || (attrs & ~allowed))
        return 0;
    lod = load_i32(b + pos + 23);
    count = load_i32(b + pos + 57);
    if (count < 1 || (lod != count - 1 && lod != size - 1))
        return 0;
    if (load_u32(b + pos + 17) != crc32c_fn(0, b + pos + 21, (size_t)(size - 21)))
        return 0;
    return size;
}

/* Walk the records of the batch at b (its frame checked by plain_frame) as
 * walk_batch does: 1 sound, 0 not, -1 on a Python error. */
static inline int
plain_records_sound(const unsigned char *b, int64_t size)
{
    unsigned attrs = ((unsigned)b[21] << 8) | b[22];
    return walk_batch(b + 61, (Py_ssize_t)(size - 61), load_i32(b + 57), load_i64(b + 27), load_i64(b + 35),
                      (attrs & 0x08u) != 0, 0, 0, NULL, NULL, NULL, NULL, 0);
}

PyDoc_STRVAR(batches_decode_doc,
"batches_decode(buf, start, end, max_length, record_type, prefix[, last_type])\n"
"    -> (rows, ends, stop)\n\n"
"The consumer's messages of the uncompressed, non-control record batches back\n"
"to back in buf[start:end), each checked as raylog.storage.record_batch.decode_batch\n"
"checks it (batchLength within max_length and at least 49, whole, magic 2, crc,\n"
"attributes, count, lastOffsetDelta, every record): rows as batch_decode with\n"
"prefix builds them (the records of the batch at p: offset baseOffset + i, or\n"
"p + i for an unstamped one), ends the (index in rows, next offset) of each\n"
"batch's last record, stop the position of the first batch not taken (end, a\n"
"cut, compressed, control or faulty batch: the reference decodes or refuses it).\n"
"With last_type (a tuple subclass whose instances have a __dict__), each\n"
"batch's last record is a last_type instance whose _next_offset attribute is\n"
"the batch's next offset, and ends stays empty.");

static PyObject *
speedups_batches_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t start, end, max_length, size;
    PyTypeObject *record_type;
    PyObject *prefix, *rows = NULL, *ends = NULL, *result = NULL;
    const unsigned char *b;
    Py_ssize_t pos;
    PyTypeObject *last_type = NULL;
    int ok;
    if (nargs != 6 && nargs != 7) {
        PyErr_Format(PyExc_TypeError, "batches_decode() takes 6 or 7 arguments (%zd given)", nargs);
        return NULL;
    }
    if (nargs == 7 && args[6] != Py_None) {
        if (!PyType_Check(args[6]) || !PyType_IsSubtype((PyTypeObject *)args[6], &PyTuple_Type)
            || ((PyTypeObject *)args[6])->tp_dictoffset == 0)
            Py_RETURN_NONE;
        last_type = (PyTypeObject *)args[6];
    }
    if (!ts_arg(args[3], &max_length))
        Py_RETURN_NONE;
    if (!PyType_Check(args[4]) || !PyType_IsSubtype((PyTypeObject *)args[4], &PyTuple_Type))
        Py_RETURN_NONE;
    record_type = (PyTypeObject *)args[4];
    prefix = args[5];
    if (!PyTuple_CheckExact(prefix) || PyTuple_GET_SIZE(prefix) != 2)
        Py_RETURN_NONE;
    ok = buffer_range(args, PyBUF_SIMPLE, &view, &start, &end);
    if (ok <= 0) {
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    b = (const unsigned char *)view.buf;
    rows = PyList_New(0);
    ends = PyList_New(0);
    if (rows == NULL || ends == NULL)
        goto done;
    pos = (Py_ssize_t)start;
    while ((size = plain_frame(b, pos, end, max_length, 0x08u)) > 0) {
        int64_t count = load_i32(b + pos + 57), lod = load_i32(b + pos + 23), base = load_i64(b + pos);
        int64_t offset = base ? base : (int64_t)pos;
        Py_ssize_t before = PyList_GET_SIZE(rows);
        ok = walk_batch(b + pos + 61, (Py_ssize_t)(size - 61), count, load_i64(b + pos + 27), load_i64(b + pos + 35),
                        b[pos + 22] & 0x08u, offset, 0, rows, record_type, prefix, last_type, base + lod + 1);
        if (ok < 0)
            goto done;
        if (ok == 0) {  /* the rows of this batch are dropped: the reference raises */
            if (PyList_SetSlice(rows, before, PyList_GET_SIZE(rows), NULL) < 0)
                goto done;
            break;
        }
        if (last_type == NULL) {
            PyObject *pair = Py_BuildValue("(nL)", PyList_GET_SIZE(rows) - 1, (long long)(base + lod + 1));
            if (pair == NULL || PyList_Append(ends, pair) < 0) {
                Py_XDECREF(pair);
                goto done;
            }
            Py_DECREF(pair);
        }
        pos += (Py_ssize_t)size;
    }
    result = Py_BuildValue("(OOn)", rows, ends, pos);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(rows);
    Py_XDECREF(ends);
    return result;
}

/* The 13 header fields of the batch at h as a header_type instance (a tuple
 * subclass built as tuple.__new__(header_type, fields), as read_header's
 * BatchHeader._make builds it): baseOffset, batchLength,
 * partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
 * baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence,
 * recordCount. */
static PyObject *
header_fields(PyTypeObject *header_type, const unsigned char *h)
{
    PyObject *items[13];
    int k;
    items[0] = PyLong_FromLongLong(load_i64(h));
    items[1] = PyLong_FromLong(load_i32(h + 8));
    items[2] = PyLong_FromLong(load_i32(h + 12));
    items[3] = PyLong_FromLong(h[16]);
    items[4] = PyLong_FromUnsignedLong(load_u32(h + 17));
    items[5] = PyLong_FromLong((int16_t)((h[21] << 8) | h[22]));
    items[6] = PyLong_FromLong(load_i32(h + 23));
    items[7] = PyLong_FromLongLong(load_i64(h + 27));
    items[8] = PyLong_FromLongLong(load_i64(h + 35));
    items[9] = PyLong_FromLongLong(load_i64(h + 43));
    items[10] = PyLong_FromLong((int16_t)((h[51] << 8) | h[52]));
    items[11] = PyLong_FromLong(load_i32(h + 53));
    items[12] = PyLong_FromLong(load_i32(h + 57));
    for (k = 0; k < 13; k++)
        if (items[k] == NULL) {
            for (k = 0; k < 13; k++)
                Py_XDECREF(items[k]);
            return NULL;
        }
    return new_record(header_type, items, 13);
}

PyDoc_STRVAR(batches_prepare_doc,
"batches_prepare(buf, start, end, max_length, header_type) -> (pairs, records, stop)\n\n"
"The append-side check of the record batches back to back in buf[start:end)\n"
"(raylog.storage.batch_validation.prepare_append, the reference), for the run\n"
"of batches without a codec or the control bit from start: each whole, its\n"
"batchLength within max_length, magic, crc, attributes, count, lastOffsetDelta\n"
"and every record as validate_batch checks them. pairs: (position, header)\n"
"of each (header a header_type instance of the 13 fields, as read_header\n"
"builds it), records: their record count, stop: the position of the first\n"
"batch not taken (end, or a batch the reference takes or refuses).");

static PyObject *
speedups_batches_prepare(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t start, end, max_length, size, records = 0;
    PyTypeObject *header_type;
    PyObject *pairs = NULL, *result = NULL;
    const unsigned char *b;
    Py_ssize_t pos;
    int ok;
    if (nargs == 5 && (!PyType_Check(args[4]) || !PyType_IsSubtype((PyTypeObject *)args[4], &PyTuple_Type)))
        Py_RETURN_NONE;
    ok = batch_pass_args(args, nargs, 5, "batches_prepare", &view, &start, &end, &max_length);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    header_type = (PyTypeObject *)args[4];
    b = (const unsigned char *)view.buf;
    if ((pairs = PyList_New(0)) == NULL)
        goto done;
    pos = (Py_ssize_t)start;
    /* no codec and no control bit; the transactional bit is checked as the reference checks it */
    while ((size = plain_frame(b, pos, end, max_length, 0x18u)) > 0) {
        PyObject *header, *pair;
        ok = plain_records_sound(b + pos, size);
        if (ok < 0)
            goto done;
        if (ok == 0)
            break;
        if ((header = header_fields(header_type, b + pos)) == NULL)
            goto done;
        pair = Py_BuildValue("(nN)", pos, header);
        if (pair == NULL || PyList_Append(pairs, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
        records += load_i32(b + pos + 57);
        pos += (Py_ssize_t)size;
    }
    result = Py_BuildValue("(OLn)", pairs, (long long)records, pos);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(pairs);
    return result;
}

PyDoc_STRVAR(batches_count_doc,
"batches_count(buf, start, end, max_length) -> (records, stop)\n\n"
"COUNT's walk of stored record batches (raylog.storage.counting, the reference:\n"
"validate_batch of each): for the run of batches without a codec or the control\n"
"bit from start, each checked as batches_prepare checks it, the records they\n"
"hold and the position of the first batch not taken (end, or a batch the\n"
"reference counts or refuses).");

static PyObject *
speedups_batches_count(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t start, end, max_length, size, records = 0;
    const unsigned char *b;
    Py_ssize_t pos;
    int ok;
    ok = batch_pass_args(args, nargs, 4, "batches_count", &view, &start, &end, &max_length);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    b = (const unsigned char *)view.buf;
    pos = (Py_ssize_t)start;
    while ((size = plain_frame(b, pos, end, max_length, 0x18u)) > 0) {
        ok = plain_records_sound(b + pos, size);
        if (ok < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (ok == 0)
            break;
        records += load_i32(b + pos + 57);
        pos += (Py_ssize_t)size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Ln)", (long long)records, pos);
}

PyDoc_STRVAR(batches_runs_doc,
"batches_runs(buf, start, end) -> runs | None\n\n"
"The idempotent producers' runs of the checked record batches back to back in\n"
"buf[start:end) (raylog.storage.batch_producers.producer_runs, the reference):\n"
"(producer_id, producer_epoch, first_sequence, last_sequence, first, stop) for\n"
"each longest stretch of batches first..stop-1 (indexes in buf's batches) of one\n"
"producer id and epoch whose sequences follow one another; a batch without a\n"
"producer id or a sequence, or a control batch, is in no run. None when the\n"
"batches do not tile buf[start:end).");

static PyObject *
speedups_batches_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t start, end;
    PyObject *runs = NULL, *result = NULL;
    const unsigned char *b;
    Py_ssize_t pos, index = 0, first = 0;
    int64_t pid = -1, last = 0, first_seq = 0;
    int epoch = 0, open = 0, ok;
    ok = batch_pass_args(args, nargs, 3, "batches_runs", &view, &start, &end, NULL);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    b = (const unsigned char *)view.buf;
    if ((runs = PyList_New(0)) == NULL)
        goto done;
#define CLOSE_RUN()                                                                                          \
    do {                                                                                                      \
        if (open) {                                                                                           \
            PyObject *run = Py_BuildValue("(LiLLnn)", (long long)pid, epoch, (long long)first_seq,           \
                                          (long long)last, first, index);                                    \
            if (run == NULL || PyList_Append(runs, run) < 0) {                                                \
                Py_XDECREF(run);                                                                              \
                goto done;                                                                                    \
            }                                                                                                 \
            Py_DECREF(run);                                                                                   \
            open = 0;                                                                                         \
        }                                                                                                     \
    } while (0)
    for (pos = (Py_ssize_t)start; pos < end; index++) {
        const unsigned char *h = b + pos;
        int64_t length, seq, count, bpid;
        int bepoch;
        unsigned attrs;
        if (end - pos < 61)
            goto done_none;
        length = load_i32(h + 8);
        if (length < 49 || pos + 12 + length > end)
            goto done_none;
        attrs = ((unsigned)h[21] << 8) | h[22];
        bpid = load_i64(h + 43);
        bepoch = (int16_t)((h[51] << 8) | h[52]);
        seq = load_i32(h + 53);
        count = load_i32(h + 57);
        if (bpid >= 0 && seq >= 0 && !(attrs & 0x20u)) {
            int64_t blast = (seq + count - 1) & 0x7FFFFFFF;
            if (!(open && bpid == pid && bepoch == epoch && seq == ((last + 1) & 0x7FFFFFFF))) {
                CLOSE_RUN();
                open = 1;
                pid = bpid;
                epoch = bepoch;
                first_seq = seq;
                first = index;
            }
            last = blast;
        } else {
            CLOSE_RUN();
        }
        pos += (Py_ssize_t)(12 + length);
    }
    CLOSE_RUN();
#undef CLOSE_RUN
    result = runs;
    runs = NULL;
    goto done;
done_none:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&view);
    Py_XDECREF(runs);
    return result;
}

PyDoc_STRVAR(batches_stamp_doc,
"batches_stamp(buf, start, end, base, leader_epoch, header_type) -> pairs\n\n"
"Stamp, in place, the validated batches back to back in the bytearray\n"
"buf[start:end) for the log offset base (raylog.storage.record_batch.stamp_into,\n"
"the reference, for each: baseOffset = base + its position - start,\n"
"partitionLeaderEpoch = leader_epoch, and raylog's lastOffsetDelta with the crc\n"
"made again where a Kafka client's was there). pairs: (offset, header as\n"
"stored) of each. None when the batches do not tile buf[start:end).");

static PyObject *
speedups_batches_stamp(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t start, end, base, epoch;
    PyTypeObject *header_type;
    PyObject *pairs = NULL, *result = NULL;
    unsigned char *b;
    Py_ssize_t pos;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "batches_stamp() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    int ok;
    if (!ts_arg(args[3], &base) || !ts_arg(args[4], &epoch) || epoch < INT32_MIN || epoch > INT32_MAX)
        Py_RETURN_NONE;
    if (!PyType_Check(args[5]) || !PyType_IsSubtype((PyTypeObject *)args[5], &PyTuple_Type))
        Py_RETURN_NONE;
    header_type = (PyTypeObject *)args[5];
    if (!PyByteArray_Check(args[0]))
        Py_RETURN_NONE;
    ok = buffer_range(args, PyBUF_WRITABLE, &view, &start, &end);
    if (ok <= 0) {
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    b = (unsigned char *)view.buf;
    /* the batches must tile [start, end) before anything is written */
    for (pos = (Py_ssize_t)start; pos < end;) {
        int64_t length;
        if (end - pos < 61)
            goto done_none;
        length = load_i32(b + pos + 8);
        if (length < 49 || pos + 12 + length > end)
            goto done_none;
        pos += (Py_ssize_t)(12 + length);
    }
    if ((pairs = PyList_New(0)) == NULL)
        goto done;
    for (pos = (Py_ssize_t)start; pos < end;) {
        int64_t size = 12 + (int64_t)load_i32(b + pos + 8), offset = base + (pos - (Py_ssize_t)start);
        PyObject *header, *pair;
        store_i64(b + pos, offset);
        store_u32(b + pos + 12, (uint32_t)(int32_t)epoch);
        if ((int64_t)load_i32(b + pos + 23) != size - 1) {
            store_u32(b + pos + 23, (uint32_t)(size - 1));
            store_u32(b + pos + 17, crc32c_fn(0, b + pos + 21, (size_t)(size - 21)));
        }
        if ((header = header_fields(header_type, b + pos)) == NULL)
            goto done;
        pair = Py_BuildValue("(LN)", (long long)offset, header);
        if (pair == NULL || PyList_Append(pairs, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
        pos += (Py_ssize_t)size;
    }
    result = pairs;
    pairs = NULL;
    goto done;
done_none:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&view);
    Py_XDECREF(pairs);
    return result;
}

PyDoc_STRVAR(batches_largest_ts_doc,
"batches_largest_ts(buf, start, end) -> (largest, consumed)\n\n"
"raylog.storage.timeindex.batch_timestamps (the reference): the largest\n"
"maxTimestamp of the whole batches in buf[start:end) and the bytes they take.");

static PyObject *
speedups_batches_largest_ts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t start, end, largest = INT64_MIN;
    const unsigned char *b;
    Py_ssize_t pos;
    int ok = batch_pass_args(args, nargs, 3, "batches_largest_ts", &view, &start, &end, NULL);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    b = (const unsigned char *)view.buf;
    pos = (Py_ssize_t)start;
    while (end - pos >= 61) {
        int64_t size = 12 + (int64_t)load_i32(b + pos + 8), ts;
        if (size < 61 || pos + size > end)
            break;
        ts = load_i64(b + pos + 35);
        if (ts > largest)
            largest = ts;
        pos += (Py_ssize_t)size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Ln)", (long long)largest, pos - (Py_ssize_t)start);
}

/* The records of a checked batch's records section b[0:end): for each,
 * its offset (offset + i), timestamp, the bounds of its key and value in
 * the whole buffer (section_at: where b starts there; -1 for a null key's
 * start, -1 for a null value's start and end) and its next offset (offset +
 * i + 1, next_offset for the last), into the arrays from index at (four
 * bounds a record: key start and end, value start and end). Returns
 * 1, or 0 when a record has headers (the index does not hold them) or does
 * not parse. With cols NULL, only says which. */
static int
index_records(const unsigned char *b, Py_ssize_t end, int64_t count, int64_t base_ts, int64_t max_ts,
              int append_time, int64_t offset, int64_t next_offset, Py_ssize_t section_at, int64_t *cols[4],
              Py_ssize_t at)
{
    Py_ssize_t pos = 0;
    int64_t i;
    for (i = 0; i < count; i++) {
        int64_t length, ts_delta, delta, klen, vlen, hcount;
        Py_ssize_t p, rend;
        if (!get_varint(b, &pos, end, 5, &length) || length > end - pos)
            return 0;
        rend = pos + (Py_ssize_t)length;
        p = pos + 1;
        if (!get_varint(b, &p, rend, 10, &ts_delta) || !get_varint(b, &p, rend, 5, &delta))
            return 0;
        if (!get_varint(b, &p, rend, 5, &klen) || klen < -1 || klen > rend - p)
            return 0;
        if (cols != NULL) {
            cols[0][at + i] = offset + i;
            cols[1][at + i] = append_time ? max_ts : base_ts + ts_delta;
            cols[2][4 * (at + i)] = klen < 0 ? -1 : section_at + p;
            cols[2][4 * (at + i) + 1] = klen < 0 ? -1 : section_at + p + klen;
        }
        p += klen > 0 ? (Py_ssize_t)klen : 0;
        if (!get_varint(b, &p, rend, 5, &vlen) || vlen < -1 || vlen > rend - p)
            return 0;
        if (cols != NULL) {
            cols[2][4 * (at + i) + 2] = vlen < 0 ? -1 : section_at + p;
            cols[2][4 * (at + i) + 3] = vlen < 0 ? -1 : section_at + p + vlen;
            cols[3][at + i] = i == count - 1 ? next_offset : offset + i + 1;
        }
        p += vlen > 0 ? (Py_ssize_t)vlen : 0;
        if (!get_varint(b, &p, rend, 5, &hcount) || hcount != 0)
            return 0;
        pos = rend;
    }
    return 1;
}

PyDoc_STRVAR(batches_index_doc,
"batches_index(buf, start, end, max_length) -> (offsets, timestamps, bounds, nexts, stop)\n\n"
"The consumer's columns of the uncompressed, non-control record batches\n"
"without headers back to back in buf[start:end), each checked as\n"
"batches_decode checks it: offsets, timestamps and nexts (each record's next\n"
"offset) as int64 bytes, bounds four int64 per record (key start and end,\n"
"value start and end; -1 for a null key or value) into buf; stop the position\n"
"of the first batch not taken (end, a cut batch, or one the decoder takes:\n"
"compressed, control, with headers, or faulty).");

static PyObject *
speedups_batches_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t start, end, max_length, size, records = 0;
    const unsigned char *b;
    Py_ssize_t pos, stop, at = 0;
    PyObject *cols[4] = {NULL, NULL, NULL, NULL}, *result = NULL;
    int64_t *arrays[4];
    int k, ok;
    ok = batch_pass_args(args, nargs, 4, "batches_index", &view, &start, &end, &max_length);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    b = (const unsigned char *)view.buf;
    /* first pass: which batches are taken (checked whole, no headers), and how many records */
    pos = (Py_ssize_t)start;
    while ((size = plain_frame(b, pos, end, max_length, 0x08u)) > 0) {
        ok = plain_records_sound(b + pos, size);
        if (ok < 0)
            goto done;
        if (ok == 0 || !index_records(b + pos + 61, (Py_ssize_t)(size - 61), load_i32(b + pos + 57), 0, 0, 0, 0, 0, 0,
                                      NULL, 0))
            break;
        records += load_i32(b + pos + 57);
        pos += (Py_ssize_t)size;
    }
    stop = pos;
    for (k = 0; k < 4; k++) {
        cols[k] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(records * 8 * (k == 2 ? 4 : 1)));
        if (cols[k] == NULL)
            goto done;
        arrays[k] = (int64_t *)PyBytes_AS_STRING(cols[k]);
    }
    /* second pass: the columns */
    for (pos = (Py_ssize_t)start; pos < stop;) {
        int64_t size = 12 + (int64_t)load_i32(b + pos + 8), count = load_i32(b + pos + 57);
        int64_t lod = load_i32(b + pos + 23), base = load_i64(b + pos);
        int64_t offset = base ? base : (int64_t)pos;
        unsigned attrs = ((unsigned)b[pos + 21] << 8) | b[pos + 22];
        index_records(b + pos + 61, (Py_ssize_t)(size - 61), count, load_i64(b + pos + 27), load_i64(b + pos + 35),
                      (attrs & 0x08u) != 0, offset, offset + lod + 1, pos + 61, arrays, at);
        at += (Py_ssize_t)count;
        pos += (Py_ssize_t)size;
    }
    result = Py_BuildValue("(OOOOn)", cols[0], cols[1], cols[2], cols[3], stop);
done:
    PyBuffer_Release(&view);
    for (k = 0; k < 4; k++)
        Py_XDECREF(cols[k]);
    return result;
}

/* ------------------------------------------------------------------------ */
/* the module */

static PyMethodDef speedups_methods[] = {
    {"scan", (PyCFunction)(void (*)(void))speedups_scan, METH_FASTCALL, scan_doc},
    {"timestamps", (PyCFunction)(void (*)(void))speedups_timestamps, METH_FASTCALL, timestamps_doc},
    {"decode", (PyCFunction)(void (*)(void))speedups_decode, METH_FASTCALL, decode_doc},
    {"encode", (PyCFunction)(void (*)(void))speedups_encode, METH_FASTCALL, encode_doc},
    {"index", (PyCFunction)(void (*)(void))speedups_index, METH_FASTCALL, index_doc},
    {"group", (PyCFunction)(void (*)(void))speedups_group, METH_FASTCALL, group_doc},
    {"batch_records", (PyCFunction)(void (*)(void))speedups_batch_records, METH_FASTCALL, batch_records_doc},
    {"batch_encode", (PyCFunction)(void (*)(void))speedups_batch_encode, METH_FASTCALL, batch_encode_doc},
    {"batch_validate", (PyCFunction)(void (*)(void))speedups_batch_validate, METH_FASTCALL, batch_validate_doc},
    {"batch_decode", (PyCFunction)(void (*)(void))speedups_batch_decode, METH_FASTCALL, batch_decode_doc},
    {"batches_decode", (PyCFunction)(void (*)(void))speedups_batches_decode, METH_FASTCALL, batches_decode_doc},
    {"batches_index", (PyCFunction)(void (*)(void))speedups_batches_index, METH_FASTCALL, batches_index_doc},
    {"batches_prepare", (PyCFunction)(void (*)(void))speedups_batches_prepare, METH_FASTCALL, batches_prepare_doc},
    {"batches_count", (PyCFunction)(void (*)(void))speedups_batches_count, METH_FASTCALL, batches_count_doc},
    {"batches_runs", (PyCFunction)(void (*)(void))speedups_batches_runs, METH_FASTCALL, batches_runs_doc},
    {"batches_stamp", (PyCFunction)(void (*)(void))speedups_batches_stamp, METH_FASTCALL, batches_stamp_doc},
    {"batches_largest_ts", (PyCFunction)(void (*)(void))speedups_batches_largest_ts, METH_FASTCALL,
     batches_largest_ts_doc},
    {"crc32c", (PyCFunction)(void (*)(void))speedups_crc32c, METH_FASTCALL, crc32c_doc},
    {"crc32c_table", (PyCFunction)(void (*)(void))speedups_crc32c_table, METH_FASTCALL, crc32c_table_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(module_doc,
"The compiled fast path of raylog.storage.message: plain messages only;\n"
"the pure-Python reference handles everything else from where it stops.");

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "raylog.storage._speedups",
    .m_doc = module_doc,
    .m_size = -1,
    .m_methods = speedups_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m;
    crc_table_init();
    crc_select();
    next_offset_name = PyUnicode_InternFromString("_next_offset");
    if (next_offset_name == NULL)
        return NULL;
    m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "STATUS_END", STATUS_END) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_TAIL", STATUS_TAIL) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_CRC", STATUS_CRC) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_HEADER", STATUS_HEADER) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_ARGS", STATUS_ARGS) < 0 ||
        PyModule_AddIntConstant(m, "GIL_RELEASE_BYTES", GIL_RELEASE_BYTES) < 0 ||
        PyModule_AddStringConstant(m, "CRC32C_IMPL", crc32c_impl) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
