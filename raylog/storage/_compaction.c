/* raylog.storage._compaction: the compiled fast path of the log cleaner
 * (raylog.storage.cleaner; docs/design.md section 3, "Compaction").
 *
 * The pure-Python code in cleaner.py and offsetmap.py is the reference and
 * the fallback. This module holds:
 *
 *   SlotMap(buffer_bytes, seed)
 *       the offset map in fixed slots (Kafka's SkimpyOffsetMap): the same
 *       interface, names and capacity as raylog.storage.offsetmap.OffsetMap
 *       (put, put_many, get, get_many, clear, capacity, full, latest_offset,
 *       len). One slot, 24 bytes (ENTRY_BYTES), in native byte order:
 *
 *           field    bytes    meaning
 *           name     0..16    a key shorter than 16 bytes: its bytes, zeros,
 *                             and in byte 15 0x80 | its length; a longer key:
 *                             its 16-byte BLAKE2b digest (offsetmap.digest)
 *           word     16..24   0: an empty slot; else the offset + 1
 *                             (bit 63 marks a slot not yet moved while the
 *                             table grows)
 *
 *       Open addressing with linear probing from a seeded hash of the name.
 *       The table starts at INITIAL_SLOTS and doubles in place (realloc,
 *       then every entry moved to its new home) while it is more than half
 *       full, up to buffer_bytes / 24 slots: it never takes more than
 *       buffer_bytes. A new key is refused when the map holds capacity keys
 *       (buffer_bytes / 24 * LOAD_FACTOR, as OffsetMap's).
 *
 *   map_batches(map, buf, start, dirty_from, max_length) -> (pos, status, value)
 *       step 2 of a pass over the batches back to back in buf[start:]: the
 *       key of each record at or after dirty_from of each plain batch (not
 *       control, not transactional) goes into the map at its offset.
 *
 *   plan_batches(map, buf, start, keep_whole, horizon, max_length)
 *       -> (pos, status, value, actions, runs)
 *       step 3: what becomes of each batch of buf[start:]: kept whole
 *       (control, transactional, or every record still the latest of its
 *       key and not an expired tombstone), dropped whole (none is), or
 *       cut: its kept records written again as one batch per run of
 *       consecutive ones, byte for byte as cleaner._run_batch writes them,
 *       back to back in runs. actions: six native int64s an action, in
 *       order: (ACTION_KEEP, position in buf, size, baseOffset, span, 0)
 *       for a batch kept whole, (ACTION_DROP, position, 0, baseOffset, 0,
 *       records removed) for what a batch loses, (ACTION_RUN, position in
 *       runs, size, baseOffset, span, 0) for a run batch.
 *
 *   producer_batches(buf, start) -> (pos, status, value, pairs)
 *       the (producerId, baseOffset) of each batch with a producer id and
 *       a sequence that is not a control batch (cleaner.last_producer_batches).
 *
 * The walks stop at the first batch they do not handle and say why in
 * status; pos is that batch's position:
 *
 *     STATUS_END     every batch to the end of buf was handled
 *     STATUS_TAIL    the batch at pos is not all in buf: value is the bytes
 *                    it needs (61 when its header is cut)
 *     STATUS_SLOW    the reference must handle the batch at pos: compressed
 *                    (the codecs are Python's), a baseOffset in keep_whole
 *                    (the sorted native int64s of a buffer: the producers'
 *                    last batches, of which an empty batch may stay), an
 *                    empty batch, a record batch that fails a
 *                    check (the reference raises the typed error), a null
 *                    key
 *     STATUS_FULL    (map_batches) the map refused a new key: value is the
 *                    offset of that record (where the pass's map stops)
 *
 * A batch is checked as raylog.storage.record_batch.decode_batch checks it
 * (sizes, magic, CRC32C, attributes, count, lastOffsetDelta, every record's
 * varints, lengths, offsetDelta, timestamp, header keys in UTF-8) before any
 * of its keys is used; what is handled gives exactly what the reference
 * gives. The GIL is released while a walk runs: the buffer must not change
 * meanwhile (the cleaner passes its own bytes), and a map belongs to one
 * thread (no call on a map while a walk of it runs).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define RAYLOG_HAVE_SSE42_PATH 1
#include <nmmintrin.h>
#endif

enum {
    STATUS_END = 0,
    STATUS_TAIL = 1,
    STATUS_SLOW = 2,
    STATUS_FULL = 3,
    STATUS_NOMEM = 4,
};

enum {
    ACTION_KEEP = 0,
    ACTION_DROP = 1,
    ACTION_RUN = 2,
};

#define LOG_OVERHEAD 12
#define HEADER_SIZE 61
#define MIN_BATCH_LENGTH (HEADER_SIZE - LOG_OVERHEAD)
#define MAX_BATCH_LENGTH ((1 << 24) - 1)
#define MIN_RECORD_SIZE 7
#define MAGIC 2
#define KNOWN_ATTRIBUTES 0x3F
#define CODEC_MASK 0x07
#define APPEND_TIME 0x08
#define TRANSACTIONAL 0x10
#define CONTROL 0x20

#define ENTRY_BYTES 24
#define NAME_BYTES 16
#define LOAD_FACTOR 0.9
#define INITIAL_SLOTS (1 << 15)
#define STALE ((uint64_t)1 << 63)

/* ------------------------------------------------------------------------ */
/* big-endian fields */

static inline uint32_t
load_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int32_t
load_i32(const unsigned char *p)
{
    uint32_t v = load_u32(p);
    int32_t s;
    memcpy(&s, &v, 4);
    return s;
}

static inline int64_t
load_i64(const unsigned char *p)
{
    uint64_t v = (uint64_t)load_u32(p) << 32 | load_u32(p + 4);
    int64_t s;
    memcpy(&s, &v, 8);
    return s;
}

static inline uint64_t
load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------------------ */
/* CRC32C (Castagnoli), as _speedups.c and the crc32c package compute it */

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[256];

static void
crc_table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t
crc32c_sw(const unsigned char *p, size_t len)
{
    uint32_t c = 0xFFFFFFFFu;
    while (len--)
        c = (c >> 8) ^ crc_table[(c ^ *p++) & 0xFF];
    return ~c;
}

#ifdef RAYLOG_HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t
crc32c_sse42(const unsigned char *p, size_t len)
{
    uint64_t c = 0xFFFFFFFFu;
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

static uint32_t (*crc32c_fn)(const unsigned char *, size_t) = crc32c_sw;

static void
crc_select(void)
{
#ifdef RAYLOG_HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        crc32c_fn = crc32c_sse42;
#endif
}

/* ------------------------------------------------------------------------ */
/* BLAKE2b (RFC 7693) with a 16-byte digest and no key: hashlib's
 * blake2b(key, digest_size=16), the name offsetmap.digest gives a long key */

static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t
rotr64(uint64_t x, int n)
{
    return (x >> n) | (x << (64 - n));
}

#define B2B_G(a, b, c, d, x, y)          \
    do {                                 \
        v[a] = v[a] + v[b] + (x);        \
        v[d] = rotr64(v[d] ^ v[a], 32);  \
        v[c] = v[c] + v[d];              \
        v[b] = rotr64(v[b] ^ v[c], 24);  \
        v[a] = v[a] + v[b] + (y);        \
        v[d] = rotr64(v[d] ^ v[a], 16);  \
        v[c] = v[c] + v[d];              \
        v[b] = rotr64(v[b] ^ v[c], 63);  \
    } while (0)

static void
blake2b_compress(uint64_t h[8], const unsigned char block[128], uint64_t t, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= t;
    if (last)
        v[14] = ~v[14];
    for (int i = 0; i < 16; i++)
        m[i] = load_le64(block + 8 * i);
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = blake2b_sigma[r];
        B2B_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        B2B_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        B2B_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        B2B_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        B2B_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        B2B_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        B2B_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        B2B_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

static void
blake2b_16(const unsigned char *in, size_t len, unsigned char out[16])
{
    uint64_t h[8];
    unsigned char block[128];
    uint64_t t = 0;
    memcpy(h, blake2b_iv, sizeof h);
    h[0] ^= 0x01010000ULL ^ 16;
    while (len > 128) {
        t += 128;
        blake2b_compress(h, in, t, 0);
        in += 128;
        len -= 128;
    }
    memset(block, 0, sizeof block);
    memcpy(block, in, len);
    t += len;
    blake2b_compress(h, block, t, 1);
    for (int i = 0; i < 16; i++)
        out[i] = (unsigned char)(h[i / 8] >> (8 * (i % 8)));
}

/* ------------------------------------------------------------------------ */
/* the map */

typedef struct {
    PyObject_HEAD
    unsigned char *slots;
    int64_t nslots;
    int64_t max_slots;
    int64_t count;
    int64_t capacity;
    int64_t latest;
    uint64_t seed;
} SlotMap;

static inline void
name_of(const unsigned char *key, Py_ssize_t len, unsigned char name[NAME_BYTES])
{
    if (len < NAME_BYTES) {
        memset(name, 0, NAME_BYTES);
        memcpy(name, key, (size_t)len);
        name[NAME_BYTES - 1] = (unsigned char)(0x80 | len);
    }
    else
        blake2b_16(key, (size_t)len, name);
}

static inline uint64_t
mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline int64_t
home_of(const SlotMap *m, const unsigned char *name, int64_t nslots)
{
    uint64_t h = mix64(load_le64(name) ^ m->seed) ^ mix64(load_le64(name + 8) + m->seed);
    return (int64_t)(((unsigned __int128)h * (uint64_t)nslots) >> 64);
}

static inline uint64_t *
word_at(unsigned char *slot)
{
    return (uint64_t *)(slot + NAME_BYTES);
}

/* The slot holding name, else the empty slot where it goes (NULL: the table is full). */
static unsigned char *
find_slot(SlotMap *m, const unsigned char *name)
{
    int64_t i = home_of(m, name, m->nslots);
    for (int64_t n = 0; n < m->nslots; n++) {
        unsigned char *slot = m->slots + i * ENTRY_BYTES;
        if (*word_at(slot) == 0 || memcmp(slot, name, NAME_BYTES) == 0)
            return slot;
        if (++i == m->nslots)
            i = 0;
    }
    return NULL;
}

/* Double the table in place (up to max_slots): realloc, then move every
 * entry, marked STALE first, to its home in the larger table, carrying the
 * stale entry it lands on (if any) to its own home next. 0, or -1 when out of memory. */
static int
grow(SlotMap *m)
{
    int64_t old = m->nslots;
    int64_t n = old * 2 > m->max_slots ? m->max_slots : old * 2;
    unsigned char *s = realloc(m->slots, (size_t)n * ENTRY_BYTES);
    if (s == NULL)
        return -1;
    memset(s + old * ENTRY_BYTES, 0, (size_t)(n - old) * ENTRY_BYTES);
    m->slots = s;
    m->nslots = n;
    for (int64_t i = 0; i < old; i++) {
        uint64_t *w = word_at(s + i * ENTRY_BYTES);
        if (*w)
            *w |= STALE;
    }
    for (int64_t i = 0; i < old; i++) {
        unsigned char carry[ENTRY_BYTES];
        unsigned char *slot = s + i * ENTRY_BYTES;
        if (!(*word_at(slot) & STALE))
            continue;
        memcpy(carry, slot, ENTRY_BYTES);
        memset(slot, 0, ENTRY_BYTES);
        *word_at(carry) &= ~STALE;
        for (;;) {
            int64_t j = home_of(m, carry, n);
            unsigned char *to;
            for (;;) {
                to = s + j * ENTRY_BYTES;
                if (*word_at(to) == 0 || (*word_at(to) & STALE))
                    break;
                if (++j == n)
                    j = 0;
            }
            if (*word_at(to) == 0) {
                memcpy(to, carry, ENTRY_BYTES);
                break;
            }
            unsigned char next[ENTRY_BYTES];
            memcpy(next, to, ENTRY_BYTES);
            memcpy(to, carry, ENTRY_BYTES);
            memcpy(carry, next, ENTRY_BYTES);
            *word_at(carry) &= ~STALE;
        }
    }
    return 0;
}

/* 1: put; 0: refused (a new key, the map full); -1: out of memory. */
static int
map_put(SlotMap *m, const unsigned char *name, int64_t offset)
{
    unsigned char *slot = find_slot(m, name);
    if (slot == NULL || *word_at(slot) == 0) {
        if (m->count >= m->capacity)
            return 0;
        if ((m->count + 1) * 2 > m->nslots && m->nslots < m->max_slots) {
            if (grow(m) < 0)
                return -1;
            slot = find_slot(m, name);
        }
        if (slot == NULL)
            return 0;
        memcpy(slot, name, NAME_BYTES);
        m->count++;
    }
    *word_at(slot) = (uint64_t)offset + 1;
    if (offset > m->latest)
        m->latest = offset;
    return 1;
}

static inline int64_t
map_get(SlotMap *m, const unsigned char *name)
{
    unsigned char *slot = find_slot(m, name);
    if (slot == NULL || *word_at(slot) == 0)
        return -1;
    return (int64_t)*word_at(slot) - 1;
}

static PyTypeObject SlotMapType;

static PyObject *
slotmap_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer_bytes", "seed", NULL};
    long long buffer_bytes;
    unsigned long long seed = 0;
    SlotMap *m;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L|K", kwlist, &buffer_bytes, &seed))
        return NULL;
    if (buffer_bytes < ENTRY_BYTES) {
        PyErr_Format(PyExc_ValueError, "an offset map of %lld bytes holds no key; give it at least %d",
                     buffer_bytes, ENTRY_BYTES);
        return NULL;
    }
    m = (SlotMap *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    m->max_slots = buffer_bytes / ENTRY_BYTES;
    m->capacity = (int64_t)((double)m->max_slots * LOAD_FACTOR);
    if (m->capacity < 1)
        m->capacity = 1;
    m->nslots = m->max_slots < INITIAL_SLOTS ? m->max_slots : INITIAL_SLOTS;
    m->slots = calloc((size_t)m->nslots, ENTRY_BYTES);
    m->latest = -1;
    m->seed = seed;
    if (m->slots == NULL) {
        Py_DECREF(m);
        return PyErr_NoMemory();
    }
    return (PyObject *)m;
}

static void
slotmap_dealloc(SlotMap *m)
{
    free(m->slots);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t
slotmap_len(SlotMap *m)
{
    return (Py_ssize_t)m->count;
}

/* the name of a bytes-like key (0), or -1 with an error set */
static int
name_arg(PyObject *key, unsigned char name[NAME_BYTES])
{
    Py_buffer view;
    if (PyObject_GetBuffer(key, &view, PyBUF_SIMPLE) < 0)
        return -1;
    name_of((const unsigned char *)view.buf, view.len, name);
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *
slotmap_put(SlotMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned char name[NAME_BYTES];
    long long offset;
    int r;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put(key, offset) takes 2 arguments");
        return NULL;
    }
    offset = PyLong_AsLongLong(args[1]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    if (name_arg(args[0], name) < 0)
        return NULL;
    r = map_put(m, name, offset);
    if (r < 0)
        return PyErr_NoMemory();
    return PyBool_FromLong(r);
}

static PyObject *
slotmap_put_many(SlotMap *m, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *seq;
    long long first;
    Py_ssize_t n, i;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put_many(keys, first_offset) takes 2 arguments");
        return NULL;
    }
    first = PyLong_AsLongLong(args[1]);
    if (first == -1 && PyErr_Occurred())
        return NULL;
    seq = PySequence_Fast(args[0], "put_many() takes a sequence of keys");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    for (i = 0; i < n; i++) {
        unsigned char name[NAME_BYTES];
        int r;
        if (name_arg(PySequence_Fast_GET_ITEM(seq, i), name) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        r = map_put(m, name, first + i);
        if (r < 0) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        if (r == 0)
            break;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(i);
}

static PyObject *
slotmap_get(SlotMap *m, PyObject *key)
{
    unsigned char name[NAME_BYTES];
    if (name_arg(key, name) < 0)
        return NULL;
    return PyLong_FromLongLong(map_get(m, name));
}

static PyObject *
slotmap_get_many(SlotMap *m, PyObject *keys)
{
    PyObject *seq, *out;
    Py_ssize_t n, i;
    seq = PySequence_Fast(keys, "get_many() takes a sequence of keys");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        unsigned char name[NAME_BYTES];
        PyObject *v;
        if (name_arg(PySequence_Fast_GET_ITEM(seq, i), name) < 0 ||
            (v = PyLong_FromLongLong(map_get(m, name))) == NULL) {
            Py_DECREF(seq);
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(seq);
    return out;
}

static PyObject *
slotmap_clear(SlotMap *m, PyObject *Py_UNUSED(ignored))
{
    memset(m->slots, 0, (size_t)m->nslots * ENTRY_BYTES);
    m->count = 0;
    m->latest = -1;
    Py_RETURN_NONE;
}

static PyObject *
slotmap_get_capacity(SlotMap *m, void *closure)
{
    return PyLong_FromLongLong(m->capacity);
}

static PyObject *
slotmap_get_full(SlotMap *m, void *closure)
{
    return PyBool_FromLong(m->count >= m->capacity);
}

static PyObject *
slotmap_get_latest(SlotMap *m, void *closure)
{
    return PyLong_FromLongLong(m->latest);
}

static PyObject *
slotmap_get_table_bytes(SlotMap *m, void *closure)
{
    return PyLong_FromLongLong(m->nslots * ENTRY_BYTES);
}

static PyGetSetDef slotmap_getset[] = {
    {"capacity", (getter)slotmap_get_capacity, NULL, "the most keys the map takes", NULL},
    {"full", (getter)slotmap_get_full, NULL, "whether the map holds capacity keys", NULL},
    {"latest_offset", (getter)slotmap_get_latest, NULL, "the largest offset put (-1: none)", NULL},
    {"table_bytes", (getter)slotmap_get_table_bytes, NULL, "the bytes the slots take now (at most buffer_bytes)",
     NULL},
    {NULL},
};

static PyMethodDef slotmap_methods[] = {
    {"put", (PyCFunction)(void (*)(void))slotmap_put, METH_FASTCALL,
     "put(key, offset) -> bool: remember offset as the latest of key; False when key is new and the map full"},
    {"put_many", (PyCFunction)(void (*)(void))slotmap_put_many, METH_FASTCALL,
     "put_many(keys, first_offset) -> int: put keys[i] at first_offset + i in order, up to the first refused"},
    {"get", (PyCFunction)slotmap_get, METH_O, "get(key) -> int: the latest offset of key, -1 when not held"},
    {"get_many", (PyCFunction)slotmap_get_many, METH_O, "get_many(keys) -> list[int]"},
    {"clear", (PyCFunction)slotmap_clear, METH_NOARGS, "clear(): forget every key"},
    {NULL},
};

static PySequenceMethods slotmap_as_sequence = {
    .sq_length = (lenfunc)slotmap_len,
};

static PyTypeObject SlotMapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "raylog.storage._compaction.SlotMap",
    .tp_basicsize = sizeof(SlotMap),
    .tp_dealloc = (destructor)slotmap_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SlotMap(buffer_bytes, seed=0): the offset map in fixed slots (see the module docstring).\n"
              "Thread-safety: none; one map belongs to one cleaning pass on one thread.",
    .tp_new = slotmap_new,
    .tp_methods = slotmap_methods,
    .tp_getset = slotmap_getset,
    .tp_as_sequence = &slotmap_as_sequence,
};

/* ------------------------------------------------------------------------ */
/* the walks */

/* The varint at *pos (before end) of at most max_bytes (5: an i32, 10: an
 * i64) into *out, as record_batch._read_varint; 0 when it runs past end, is
 * longer or out of range. */
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
            return 0;
        u |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            if (max_bytes == 5) {
                uint32_t w;
                if (u >> 32)
                    return 0;
                w = (uint32_t)u;
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

/* Whether b[0:n) is valid UTF-8 as Python's strict decoder takes it (no
 * overlong forms, no surrogates, nothing above U+10FFFF). */
static int
valid_utf8(const unsigned char *b, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = b[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (b[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
            if (i + 2 >= n || b[i + 1] < lo || b[i + 1] > hi || (b[i + 2] & 0xC0) != 0x80)
                return 0;
            i += 3;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
            if (i + 3 >= n || b[i + 1] < lo || b[i + 1] > hi || (b[i + 2] & 0xC0) != 0x80 ||
                (b[i + 3] & 0xC0) != 0x80)
                return 0;
            i += 4;
        }
        else
            return 0;
    }
    return 1;
}

/* one record's parts the cleaner needs */
typedef struct {
    Py_ssize_t key;   /* position of the key in the batch */
    Py_ssize_t tail;  /* position of its key length: the bytes a run batch copies, to end */
    Py_ssize_t end;   /* position after the record */
    int64_t ts;       /* its timestamp as a reader gets it */
    int32_t klen;     /* -1: null */
    int32_t null_value;
} RecordRef;

/* A growable array (no Python objects: used without the GIL). */
typedef struct {
    void *data;
    size_t len, cap, item;
} Vec;

static int
vec_reserve(Vec *v, size_t n)
{
    if (n <= v->cap)
        return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < n)
        cap *= 2;
    void *d = realloc(v->data, cap * v->item);
    if (d == NULL)
        return -1;
    v->data = d;
    v->cap = cap;
    return 0;
}

/* The batch at b (n bytes there, n >= 12 + its batchLength, checked by the
 * caller): checked as decode_batch checks it, its records' key positions
 * into refs. 1: sound; 0: not (or a null key: the reference handles it);
 * -1: out of memory. */
static int
walk_records(const unsigned char *b, int32_t length, Vec *refs)
{
    int16_t attrs = (int16_t)(b[21] << 8 | b[22]);
    int32_t lod = load_i32(b + 23), count = load_i32(b + 57);
    int64_t base_ts = load_i64(b + 27), max_ts = load_i64(b + 35);
    int append_time = (attrs & APPEND_TIME) != 0;
    const unsigned char *s = b + HEADER_SIZE;
    Py_ssize_t end = (Py_ssize_t)length + LOG_OVERHEAD - HEADER_SIZE, pos = 0;
    RecordRef *out;
    if (b[16] != MAGIC)
        return 0;
    if (crc32c_fn(b + 21, (size_t)length + LOG_OVERHEAD - 21) != load_u32(b + 17))
        return 0;
    if ((attrs & ~KNOWN_ATTRIBUTES) || (attrs & CODEC_MASK) > 4 || count < 1)
        return 0;
    if (lod != count - 1 && lod != length + LOG_OVERHEAD - 1)
        return 0;
    if (count > end / MIN_RECORD_SIZE)
        return 0;
    refs->len = 0;
    if (vec_reserve(refs, (size_t)count) < 0)
        return -1;
    out = (RecordRef *)refs->data;
    for (int32_t i = 0; i < count; i++) {
        int64_t rlen, ts_delta, delta, klen, vlen, hcount, ts;
        Py_ssize_t p, rend;
        if (!get_varint(s, &pos, end, 5, &rlen) || rlen < MIN_RECORD_SIZE - 1 || rlen > end - pos)
            return 0;
        rend = pos + (Py_ssize_t)rlen;
        if (s[pos] != 0)
            return 0;
        p = pos + 1;
        if (!get_varint(s, &p, rend, 10, &ts_delta) || !get_varint(s, &p, rend, 5, &delta) || delta != i)
            return 0;
        if (__builtin_add_overflow(base_ts, ts_delta, &ts))
            return 0;
        if (!append_time && ts > max_ts)
            return 0;
        out[i].tail = HEADER_SIZE + p;
        out[i].end = HEADER_SIZE + rend;
        out[i].ts = append_time ? max_ts : ts;
        if (!get_varint(s, &p, rend, 5, &klen) || klen < -1 || klen > rend - p)
            return 0;
        out[i].key = HEADER_SIZE + p;
        out[i].klen = (int32_t)klen;
        p += klen > 0 ? (Py_ssize_t)klen : 0;
        if (!get_varint(s, &p, rend, 5, &vlen) || vlen < -1 || vlen > rend - p)
            return 0;
        out[i].null_value = vlen < 0;
        p += vlen > 0 ? (Py_ssize_t)vlen : 0;
        if (!get_varint(s, &p, rend, 5, &hcount) || hcount < 0 || hcount > rend - p)
            return 0;
        for (int64_t h = 0; h < hcount; h++) {
            int64_t hklen, hvlen;
            if (!get_varint(s, &p, rend, 5, &hklen) || hklen < 0 || hklen > rend - p)
                return 0;
            if (!valid_utf8(s + p, (Py_ssize_t)hklen))
                return 0;
            p += (Py_ssize_t)hklen;
            if (!get_varint(s, &p, rend, 5, &hvlen) || hvlen < -1 || hvlen > rend - p)
                return 0;
            p += hvlen > 0 ? (Py_ssize_t)hvlen : 0;
        }
        if (p != rend)
            return 0;
        pos = rend;
    }
    if (pos != end)
        return 0;
    for (int32_t i = 0; i < count; i++)
        if (out[i].klen < 0)
            return 0;  /* a null key: the reference's affair */
    refs->len = (size_t)count;
    return 1;
}

/* Where the walk over buf[pos:n) stands at a batch: STATUS_END past the
 * end, STATUS_TAIL (with *need) when the batch is cut, STATUS_SLOW when its
 * length is out of bounds, else -1 (a whole batch of *length). */
static inline int
frame_at(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t n, int64_t max_length, int32_t *length,
         int64_t *need)
{
    if (pos >= n)
        return STATUS_END;
    if (n - pos < HEADER_SIZE) {
        *need = HEADER_SIZE;
        return STATUS_TAIL;
    }
    *length = load_i32(buf + pos + 8);
    if (*length < MIN_BATCH_LENGTH || *length > max_length)
        return STATUS_SLOW;
    if (n - pos < (Py_ssize_t)*length + LOG_OVERHEAD) {
        *need = (int64_t)*length + LOG_OVERHEAD;
        return STATUS_TAIL;
    }
    return -1;
}

static int
buffer_arg(PyObject *obj, Py_buffer *view)
{
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

static PyObject *
result(Py_ssize_t pos, int status, int64_t value)
{
    if (status == STATUS_NOMEM)
        return PyErr_NoMemory();
    return Py_BuildValue("(niL)", pos, status, (long long)value);
}

PyDoc_STRVAR(map_batches_doc,
"map_batches(map, buf, start, dirty_from, max_length) -> (pos, status, value)\n\n"
"Put the keys of the records at or after dirty_from of the plain batches\n"
"of buf[start:] into map (a SlotMap); see the module docstring.");

static PyObject *
compaction_map_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t pos, n;
    long long dirty_from, max_length;
    int status = STATUS_END;
    int64_t value = 0;
    SlotMap *m;
    Vec refs = {NULL, 0, 0, sizeof(RecordRef)};
    if (nargs != 5 || !PyObject_TypeCheck(args[0], &SlotMapType)) {
        PyErr_SetString(PyExc_TypeError, "map_batches(map, buf, start, dirty_from, max_length)");
        return NULL;
    }
    m = (SlotMap *)args[0];
    pos = PyLong_AsSsize_t(args[2]);
    dirty_from = PyLong_AsLongLong(args[3]);
    max_length = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (buffer_arg(args[1], &view) < 0)
        return NULL;
    n = view.len;
    if (pos < 0)
        pos = 0;
    Py_BEGIN_ALLOW_THREADS
    const unsigned char *buf = (const unsigned char *)view.buf;
    for (;;) {
        int32_t length;
        int r = frame_at(buf, pos, n, max_length, &length, &value);
        if (r >= 0) {
            status = r;
            break;
        }
        const unsigned char *b = buf + pos;
        int16_t attrs = (int16_t)(b[21] << 8 | b[22]);
        int64_t base = load_i64(b), next = base + load_i32(b + 23) + 1;
        if ((attrs & (CONTROL | TRANSACTIONAL)) || next <= dirty_from) {
            pos += (Py_ssize_t)length + LOG_OVERHEAD;
            continue;
        }
        if (attrs & CODEC_MASK) {
            status = STATUS_SLOW;
            break;
        }
        r = walk_records(b, length, &refs);
        if (r <= 0) {
            status = r < 0 ? STATUS_NOMEM : STATUS_SLOW;
            break;
        }
        RecordRef *rec = (RecordRef *)refs.data;
        int stop = 0;
        for (size_t i = 0; i < refs.len; i++) {
            int64_t offset = base + (int64_t)i;
            unsigned char name[NAME_BYTES];
            if (offset < dirty_from)
                continue;
            name_of(b + rec[i].key, rec[i].klen, name);
            int put = map_put(m, name, offset);
            if (put <= 0) {
                status = put < 0 ? STATUS_NOMEM : STATUS_FULL;
                value = offset;
                stop = 1;
                break;
            }
        }
        if (stop)
            break;
        pos += (Py_ssize_t)length + LOG_OVERHEAD;
    }
    Py_END_ALLOW_THREADS
    free(refs.data);
    PyBuffer_Release(&view);
    return result(pos, status, value);
}

/* Kafka's zigzag varint of v at p; the bytes written (at most 10). */
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

static inline void
store_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void
store_i64(unsigned char *p, int64_t v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    store_u32(p, (uint32_t)(u >> 32));
    store_u32(p + 4, (uint32_t)u);
}

/* The kept records rec[i:j) of the batch b as one batch of their own, as
 * cleaner._run_batch writes it (encode_batch of their keys, values,
 * headers and timestamps, then baseOffset, batchLength, the batch's leader
 * epoch, lastOffsetDelta = n - 1 and the CRC), appended to out. 1, 0 when a
 * timestamp delta overflows (the reference's affair), -1 out of memory. */
static int
encode_run(const unsigned char *b, const RecordRef *rec, size_t i, size_t j, Vec *out)
{
    size_t bound = HEADER_SIZE;
    int64_t base_ts = rec[i].ts, max_ts = rec[i].ts;
    int32_t seq = load_i32(b + 53);
    int16_t attrs = (int16_t)(b[21] << 8 | b[22]);
    for (size_t k = i; k < j; k++) {
        int64_t delta;
        bound += (size_t)(rec[k].end - rec[k].tail) + 5 + 1 + 10 + 5;
        if (__builtin_sub_overflow(rec[k].ts, base_ts, &delta))
            return 0;
        if (rec[k].ts > max_ts)
            max_ts = rec[k].ts;
    }
    if (vec_reserve(out, out->len + bound) < 0)
        return -1;
    unsigned char *h = (unsigned char *)out->data + out->len, *p = h + HEADER_SIZE;
    for (size_t k = i; k < j; k++) {
        unsigned char body[16];
        Py_ssize_t n = 0, rest = rec[k].end - rec[k].tail;
        body[n++] = 0;
        n += put_varint(body + n, rec[k].ts - base_ts);
        n += put_varint(body + n, (int64_t)(k - i));
        p += put_varint(p, (int64_t)n + rest);
        memcpy(p, body, (size_t)n);
        memcpy(p + n, b + rec[k].tail, (size_t)rest);
        p += n + rest;
    }
    size_t size = (size_t)(p - h);
    store_i64(h, load_i64(b) + (int64_t)i);
    store_u32(h + 8, (uint32_t)(size - LOG_OVERHEAD));
    memcpy(h + 12, b + 12, 4);                    /* partitionLeaderEpoch */
    h[16] = MAGIC;
    h[21] = 0;
    h[22] = (unsigned char)(attrs & APPEND_TIME);
    store_u32(h + 23, (uint32_t)(j - i - 1));    /* lastOffsetDelta */
    store_i64(h + 27, base_ts);
    store_i64(h + 35, max_ts);
    memcpy(h + 43, b + 43, 10);                   /* producerId, producerEpoch */
    store_u32(h + 53, seq < 0 ? 0xFFFFFFFFu : (uint32_t)(((int64_t)seq + (int64_t)i) & 0x7FFFFFFF));
    store_u32(h + 57, (uint32_t)(j - i));
    store_u32(h + 17, crc32c_fn(h + 21, size - 21));
    out->len += size;
    return 1;
}

static int
in_sorted(const int64_t *v, Py_ssize_t n, int64_t x)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && v[lo] == x;
}

PyDoc_STRVAR(plan_batches_doc,
"plan_batches(map, buf, start, keep_whole, horizon, max_length) -> (pos, status, value, actions, runs)\n\n"
"What becomes of each batch of buf[start:] (kept, dropped, cut into runs); see the\n"
"module docstring.");

static PyObject *
compaction_plan_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view, keep;
    Py_ssize_t pos, n, nkeep;
    long long horizon, max_length;
    int status = STATUS_END;
    int64_t value = 0;
    SlotMap *m;
    Vec refs = {NULL, 0, 0, sizeof(RecordRef)};
    Vec actions = {NULL, 0, 0, 6 * sizeof(int64_t)};
    Vec keeps = {NULL, 0, 0, 1};
    Vec runs = {NULL, 0, 0, 1};
    PyObject *out, *run_bytes;
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &SlotMapType)) {
        PyErr_SetString(PyExc_TypeError, "plan_batches(map, buf, start, keep_whole, horizon, max_length)");
        return NULL;
    }
    m = (SlotMap *)args[0];
    pos = PyLong_AsSsize_t(args[2]);
    horizon = PyLong_AsLongLong(args[4]);
    max_length = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (buffer_arg(args[1], &view) < 0)
        return NULL;
    if (buffer_arg(args[3], &keep) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    n = view.len;
    nkeep = keep.len / (Py_ssize_t)sizeof(int64_t);
    if (pos < 0)
        pos = 0;
    Py_BEGIN_ALLOW_THREADS
    const unsigned char *buf = (const unsigned char *)view.buf;
    const int64_t *keep_whole = (const int64_t *)keep.buf;
    for (;;) {
        int32_t length;
        int64_t kind, count = 0;
        int r = frame_at(buf, pos, n, max_length, &length, &value);
        if (r >= 0) {
            status = r;
            break;
        }
        const unsigned char *b = buf + pos;
        int16_t attrs = (int16_t)(b[21] << 8 | b[22]);
        int64_t base = load_i64(b), span = (int64_t)load_i32(b + 23) + 1;
        if (attrs & (CONTROL | TRANSACTIONAL))
            kind = ACTION_KEEP;
        else if ((attrs & CODEC_MASK) || in_sorted(keep_whole, nkeep, base)) {
            /* compressed, or its producer's last batch (an empty batch may stay of it): the reference's */
            status = STATUS_SLOW;
            break;
        }
        else {
            r = walk_records(b, length, &refs);
            if (r <= 0) {
                status = r < 0 ? STATUS_NOMEM : STATUS_SLOW;
                break;
            }
            int expired = load_i64(b + 35) <= horizon;
            RecordRef *rec = (RecordRef *)refs.data;
            size_t kept = 0;
            if (vec_reserve(&keeps, refs.len) < 0) {
                status = STATUS_NOMEM;
                break;
            }
            unsigned char *keep_of = (unsigned char *)keeps.data;
            for (size_t i = 0; i < refs.len; i++) {
                unsigned char name[NAME_BYTES];
                name_of(b + rec[i].key, rec[i].klen, name);
                keep_of[i] = map_get(m, name) <= base + (int64_t)i && !(expired && rec[i].null_value);
                kept += keep_of[i];
            }
            if (kept == refs.len)
                kind = ACTION_KEEP;
            else if (kept == 0) {
                kind = ACTION_DROP;
                count = (int64_t)refs.len;
            }
            else {
                /* a dropped part, then one batch per run of kept records (in runs) */
                size_t mark = runs.len, before = actions.len;
                int bad = 0;
                if (vec_reserve(&actions, actions.len + 1 + kept) < 0) {
                    status = STATUS_NOMEM;
                    break;
                }
                int64_t *a = (int64_t *)actions.data + 6 * actions.len++;
                a[0] = ACTION_DROP;
                a[1] = pos;
                a[2] = 0;
                a[3] = base;
                a[4] = 0;
                a[5] = (int64_t)(refs.len - kept);
                for (size_t i = 0; i < refs.len && !bad;) {
                    if (!keep_of[i]) {
                        i++;
                        continue;
                    }
                    size_t j = i, at = runs.len;
                    while (j < refs.len && keep_of[j])
                        j++;
                    r = encode_run(b, rec, i, j, &runs);
                    if (r <= 0) {
                        bad = r < 0 ? STATUS_NOMEM : STATUS_SLOW;
                        break;
                    }
                    a = (int64_t *)actions.data + 6 * actions.len++;
                    a[0] = ACTION_RUN;
                    a[1] = (int64_t)at;
                    a[2] = (int64_t)(runs.len - at);
                    a[3] = base + (int64_t)i;
                    a[4] = (int64_t)(j - i);
                    a[5] = 0;
                    i = j;
                }
                if (bad) {
                    runs.len = mark;
                    actions.len = before;
                    status = bad;
                    break;
                }
                pos += (Py_ssize_t)length + LOG_OVERHEAD;
                continue;
            }
        }
        if (vec_reserve(&actions, actions.len + 1) < 0) {
            status = STATUS_NOMEM;
            break;
        }
        int64_t *a = (int64_t *)actions.data + 6 * actions.len++;
        a[0] = kind;
        a[1] = pos;
        a[2] = (int64_t)length + LOG_OVERHEAD;
        a[3] = base;
        a[4] = span;
        a[5] = count;
        pos += (Py_ssize_t)length + LOG_OVERHEAD;
    }
    Py_END_ALLOW_THREADS
    free(refs.data);
    free(keeps.data);
    PyBuffer_Release(&keep);
    PyBuffer_Release(&view);
    if (status == STATUS_NOMEM) {
        free(actions.data);
        free(runs.data);
        return PyErr_NoMemory();
    }
    out = PyBytes_FromStringAndSize((const char *)actions.data, (Py_ssize_t)(actions.len * actions.item));
    run_bytes = PyBytes_FromStringAndSize((const char *)runs.data, (Py_ssize_t)runs.len);
    free(actions.data);
    free(runs.data);
    if (out == NULL || run_bytes == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(run_bytes);
        return NULL;
    }
    return Py_BuildValue("(niLNN)", pos, status, (long long)value, out, run_bytes);
}

PyDoc_STRVAR(producer_batches_doc,
"producer_batches(buf, start, max_length) -> (pos, status, value, pairs)\n\n"
"(producerId, baseOffset) of each batch of buf[start:] with a producer id\n"
"and a sequence that is not a control batch; see the module docstring.");

static PyObject *
compaction_producer_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t pos, n;
    long long max_length;
    int status;
    int64_t value = 0;
    PyObject *pairs;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "producer_batches(buf, start, max_length)");
        return NULL;
    }
    pos = PyLong_AsSsize_t(args[1]);
    max_length = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (buffer_arg(args[0], &view) < 0)
        return NULL;
    if ((pairs = PyList_New(0)) == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    n = view.len;
    if (pos < 0)
        pos = 0;
    const unsigned char *buf = (const unsigned char *)view.buf;
    for (;;) {
        int32_t length;
        int r = frame_at(buf, pos, n, max_length, &length, &value);
        if (r >= 0) {
            status = r;
            break;
        }
        const unsigned char *b = buf + pos;
        int16_t attrs = (int16_t)(b[21] << 8 | b[22]);
        int64_t pid = load_i64(b + 43);
        if (pid >= 0 && load_i32(b + 53) >= 0 && !(attrs & CONTROL)) {
            PyObject *pair = Py_BuildValue("(LL)", (long long)pid, (long long)load_i64(b));
            if (pair == NULL || PyList_Append(pairs, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(pairs);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(pair);
        }
        pos += (Py_ssize_t)length + LOG_OVERHEAD;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(niLN)", pos, status, (long long)value, pairs);
}

PyDoc_STRVAR(blake2b_16_doc,
"blake2b_16(data) -> bytes\n\n"
"hashlib.blake2b(data, digest_size=16).digest(), as the map names a long key.");

static PyObject *
compaction_blake2b_16(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    unsigned char out[16];
    if (buffer_arg(arg, &view) < 0)
        return NULL;
    blake2b_16((const unsigned char *)view.buf, (size_t)view.len, out);
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize((const char *)out, 16);
}

static PyMethodDef compaction_methods[] = {
    {"map_batches", (PyCFunction)(void (*)(void))compaction_map_batches, METH_FASTCALL, map_batches_doc},
    {"plan_batches", (PyCFunction)(void (*)(void))compaction_plan_batches, METH_FASTCALL, plan_batches_doc},
    {"producer_batches", (PyCFunction)(void (*)(void))compaction_producer_batches, METH_FASTCALL,
     producer_batches_doc},
    {"blake2b_16", (PyCFunction)compaction_blake2b_16, METH_O, blake2b_16_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(module_doc,
"The compiled fast path of raylog.storage.cleaner: the offset map in fixed\n"
"slots and the walks of uncompressed batches; the pure-Python reference\n"
"handles everything else from where they stop.");

static struct PyModuleDef compaction_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "raylog.storage._compaction",
    .m_doc = module_doc,
    .m_size = -1,
    .m_methods = compaction_methods,
};

PyMODINIT_FUNC
PyInit__compaction(void)
{
    PyObject *m;
    crc_table_init();
    crc_select();
    if (PyType_Ready(&SlotMapType) < 0)
        return NULL;
    m = PyModule_Create(&compaction_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SlotMapType);
    if (PyModule_AddObject(m, "SlotMap", (PyObject *)&SlotMapType) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_END", STATUS_END) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_TAIL", STATUS_TAIL) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_SLOW", STATUS_SLOW) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_FULL", STATUS_FULL) < 0 ||
        PyModule_AddIntConstant(m, "ACTION_KEEP", ACTION_KEEP) < 0 ||
        PyModule_AddIntConstant(m, "ACTION_DROP", ACTION_DROP) < 0 ||
        PyModule_AddIntConstant(m, "ACTION_RUN", ACTION_RUN) < 0 ||
        PyModule_AddIntConstant(m, "ENTRY_BYTES", ENTRY_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
