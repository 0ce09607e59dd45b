/* _fastformat: the compiled loop of `probescope report`'s text output.
 *
 * Pure Python reaches ~0.7x the speed of `trace-cmd report` on a recording; this module is the
 * small accelerator the project allows where a benchmark proves Python cannot reach a target.
 * It walks the raw sub-buffers of every CPU, merges them in the order the kernel's `trace`
 * prints (exactly as `traceevent/merge.py: merge_cpu_batches` does, bisections included), and
 * formats each record with a "format program" that Python compiled from the same knowledge
 * the text sink uses (`sinks/text_program.py`). It knows nothing of tracing beyond that:
 *
 * - what a line starts with comes from Python callbacks, cached here: the task column by
 *   thread id, the five flag letters by (flags << 8 | preempt_count);
 * - an event type without a program (a tracepoint's print fmt, a symbol...) is printed by a
 *   Python callback from the same record, at the same place of the merged stream;
 * - anything odd in a sub-buffer (bad header, unknown record type, short record, string
 *   location past the record) is handed to the Python decoder, which raises the error the
 *   pure-Python path raises, at the same point of the output.
 *
 * Little-endian layouts only (the Python side checks); timestamps are 128-bit so that they
 * never wrap where Python's integers would not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef unsigned __int128 u128;

#define COMMIT_MASK ((1u << 27) - 1)
#define RB_MISSED_EVENTS (1ull << 31)
#define RB_MISSED_STORED (1ull << 30)
#define TS_MSB ((u128)0xF8 << 56)
#define EVENT_IDS 65536
#define FLAG_KEYS 65536
#define FLUSH_AT (256 * 1024)

/* Program byte codes (see sinks/text_program.py, which writes them). */
enum { MODE_FORMAT = 1, MODE_FALLBACK = 2 };
enum { OP_LITERAL = 'L', OP_INT = 'I', OP_CHAR = 'C', OP_STRING = 'S' };

static inline unsigned rd16(const unsigned char *p) { return p[0] | (p[1] << 8); }
static inline uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* ---- output buffer, written to the Python stream in large pieces ---- */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    PyObject *write;
} Out;

/* A short write is written on from where it stopped: a pipe whose reader left mid-write takes
   part of a chunk, and only the next write raises BrokenPipeError (`report | head`). */
static int out_flush(Out *o) {
    Py_ssize_t done = 0;
    while (done < o->len) {
        PyObject *chunk = PyBytes_FromStringAndSize(o->data + done, o->len - done);
        if (!chunk) return -1;
        PyObject *r = PyObject_CallOneArg(o->write, chunk);
        Py_DECREF(chunk);
        if (!r) return -1;
        Py_ssize_t n = PyLong_AsSsize_t(r);  /* binary streams return the count written */
        Py_DECREF(r);
        if (n <= 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OSError, "the output took no bytes");
            return -1;
        }
        done += n;
    }
    o->len = 0;
    return 0;
}

static int out_reserve(Out *o, Py_ssize_t n) {
    if (o->len + n <= o->cap) return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4 * FLUSH_AT;
    while (cap < o->len + n) cap *= 2;
    char *data = PyMem_Realloc(o->data, cap);
    if (!data) { PyErr_NoMemory(); return -1; }
    o->data = data;
    o->cap = cap;
    return 0;
}

static int out_put(Out *o, const char *s, Py_ssize_t n) {
    if (out_reserve(o, n) < 0) return -1;
    memcpy(o->data + o->len, s, n);
    o->len += n;
    return 0;
}

static int out_bytes(Out *o, PyObject *b) {
    return out_put(o, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b));
}

/* Decimal digits of v, right-aligned in buf (40 bytes); returns the first digit. */
static char *digits(u128 v, char *end) {
    char *p = end;
    do { *--p = '0' + (char)(v % 10); v /= 10; } while (v);
    return p;
}

/* Python's '%d' (hex=0) or '%x' (hex=1) of an integer given as sign and magnitude, zero
 * padded to `width` when `zero`, else space padded (like '%5d'). */
static int out_number(Out *o, int negative, u128 magnitude, int hex, int width, int zero) {
    char buf[48], *end = buf + sizeof buf, *p = end;
    if (hex) {
        do { *--p = "0123456789abcdef"[magnitude & 15]; magnitude >>= 4; } while (magnitude);
    } else {
        p = digits(magnitude, end);
    }
    int len = (int)(end - p) + negative;
    if (out_reserve(o, len > width ? len : width) < 0) return -1;
    char *w = o->data + o->len;
    if (!zero) for (int i = len; i < width; i++) *w++ = ' ';
    if (negative) *w++ = '-';
    if (zero) for (int i = len; i < width; i++) *w++ = '0';
    memcpy(w, p, end - p);
    w += end - p;
    o->len = w - o->data;
    return 0;
}

/* ---- per-CPU streams of sub-buffers ---- */

typedef struct {
    u128 ts;
    uint32_t start, pos;
    PyObject *program; /* borrowed from the program table */
} Rec;

typedef struct {
    PyObject *chunks;    /* iterator of bytes: whole sub-buffers back to back */
    PyObject *chunk;     /* the current chunk */
    Py_ssize_t next;     /* offset of the next sub-buffer in the chunk */
    const unsigned char *sb;
    PyObject *sb_bytes;  /* the current sub-buffer as bytes, made when Python needs it */
    long cpu;
    Py_ssize_t index;       /* in the list of streams, for the Python callbacks */
    Py_ssize_t size, data_offset, ts_offset, commit_offset, long_size;
    Rec *recs;
    Py_ssize_t n, first, cap;
    long long lost;      /* carried to the next run taken from this stream */
    int live;            /* has a current batch in the merge */
} Stream;

typedef struct {
    int type_len_bits, data_max, padding, time_extend, time_stamp;
    PyObject *resolve, *skip, *task, *flags, *fallback, *check;
    PyObject *programs[EVENT_IDS];
    PyObject *flag_text[FLAG_KEYS];
    PyObject *tasks;     /* dict: tid -> bytes */
    long last_tid;
    PyObject *last_task;
    int in_ns, lost_lines;
    u128 second_base;
    char second_text[32];
    Py_ssize_t second_len;
    long long events, lost_total;
    Out out;
} Ctx;

static PyObject *ts_object(u128 ts) {
    if (ts >> 64 == 0) return PyLong_FromUnsignedLongLong((unsigned long long)ts);
    char buf[48], *end = buf + sizeof buf - 1;
    *end = 0;
    return PyLong_FromString(digits(ts, end), NULL, 10);
}

static PyObject *sub_buffer_bytes(Stream *s) {
    if (!s->sb_bytes) s->sb_bytes = PyBytes_FromStringAndSize((const char *)s->sb, s->size);
    return s->sb_bytes;
}

/* Something in the sub-buffer is not as expected: the Python decoder raises the error the
 * pure-Python path raises for it. */
static int anomaly(Ctx *c, Stream *s) {
    PyObject *sb = sub_buffer_bytes(s);
    if (!sb) return -1;
    PyObject *r = PyObject_CallFunction(c->check, "nO", s->index, sb);
    if (!r) return -1;
    Py_DECREF(r);
    PyErr_Format(PyExc_RuntimeError,
                 "report accelerator: cpu %ld: a sub-buffer the Python decoder reads was "
                 "refused here (set PROBESCOPE_NO_ACCEL=1)", s->cpu);
    return -1;
}

/* The program of an event id: a bytes object, or None (records the decoder skips). */
static PyObject *program_of(Ctx *c, unsigned id) {
    if (!c->programs[id]) {
        PyObject *p = PyObject_CallFunction(c->resolve, "I", id);
        if (!p) return NULL;
        if (p != Py_None && !PyBytes_Check(p)) {
            Py_DECREF(p);
            PyErr_SetString(PyExc_TypeError, "a format program must be bytes or None");
            return NULL;
        }
        c->programs[id] = p;
    }
    return c->programs[id];
}

/* Whether a record satisfies its program's checks: its fixed size and string locations. */
static int record_ok(PyObject *program, const unsigned char *sb, uint32_t start, uint32_t pos) {
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(program);
    if (pos - start < rd16(p + 1)) return 0;
    unsigned checks = rd16(p + 3);
    for (unsigned i = 0; i < checks; i++) {
        const unsigned char *k = p + 5 + 4 * i;
        uint32_t loc = rd32(sb + start + rd16(k));
        uint32_t length = loc >> 16;
        if (length && start + rd16(k + 2) + (loc & 0xffff) + length > pos) return 0;
    }
    return 1;
}

/* Decode the stream's current sub-buffer into records; returns 0, or -1 with an error. */
static int walk(Ctx *c, Stream *s, long long *lost) {
    const unsigned char *sb = s->sb;
    Py_ssize_t size = s->size;
    if (size < s->data_offset || size % 4) return anomaly(c, s);
    u128 ts = rd64(sb + s->ts_offset);
    uint64_t commit = s->long_size == 8 ? rd64(sb + s->commit_offset)
                                        : rd32(sb + s->commit_offset);
    Py_ssize_t used = commit & COMMIT_MASK;
    if (used > size - s->data_offset) return anomaly(c, s);
    *lost = 0;
    if (commit & RB_MISSED_EVENTS) {
        if (commit & RB_MISSED_STORED) {
            Py_ssize_t at = s->data_offset + used;
            if (at + s->long_size > size) return anomaly(c, s);
            *lost = (long long)(s->long_size == 8 ? rd64(sb + at) : rd32(sb + at));
        } else {
            *lost = -1;
        }
    }
    unsigned type_mask = (1u << c->type_len_bits) - 1;
    int delta_bits = 32 - c->type_len_bits;
    uint32_t pos = (uint32_t)s->data_offset, end = (uint32_t)(s->data_offset + used), start;
    s->n = s->first = 0;
    while (pos < end) {
        uint32_t word = rd32(sb + pos);
        unsigned type_len = word & type_mask;
        uint32_t delta = word >> c->type_len_bits;
        if (type_len >= 1 && (int)type_len <= c->data_max) {
            ts += delta;
            start = pos + 4;
            pos = start + (type_len << 2);
        } else if (type_len == 0) {
            if (pos + 8 > end) return anomaly(c, s);
            uint32_t length = rd32(sb + pos + 4);
            if (length < 4) return anomaly(c, s);
            ts += delta;
            start = pos + 8;
            pos = start + ((length - 1) & ~3u);
        } else if ((int)type_len == c->padding) {
            if (!delta) break;
            if (pos + 8 > end) return anomaly(c, s);
            ts += delta;
            uint64_t next = (uint64_t)pos + 4 + rd32(sb + pos + 4);
            if (next > end) return anomaly(c, s);
            pos = (uint32_t)next;
            continue;
        } else if ((int)type_len == c->time_extend) {
            if (pos + 8 > end) return anomaly(c, s);
            ts += ((u128)rd32(sb + pos + 4) << delta_bits) | delta;
            pos += 8;
            continue;
        } else if ((int)type_len == c->time_stamp) {
            if (pos + 8 > end) return anomaly(c, s);
            u128 stamp = ((u128)rd32(sb + pos + 4) << delta_bits) | delta;
            if (ts & TS_MSB) { /* the kernel's rb_fix_abs_ts */
                stamp |= ts & TS_MSB;
                if (stamp < ts) stamp += (u128)1 << 59;
            }
            ts = stamp;
            pos += 8;
            continue;
        } else {
            return anomaly(c, s);
        }
        if (pos > end || start + 4 > size) return anomaly(c, s);
        unsigned id = rd16(sb + start);
        PyObject *program = program_of(c, id);
        if (!program) return -1;
        if (program == Py_None) {
            PyObject *r = PyObject_CallFunction(c->skip, "I", id);
            if (!r) return -1;
            Py_DECREF(r);
            continue;
        }
        if (!record_ok(program, sb, start, pos)) return anomaly(c, s);
        if (s->n == s->cap) {
            Py_ssize_t cap = s->cap ? 2 * s->cap : 256;
            Rec *recs = PyMem_Realloc(s->recs, cap * sizeof(Rec));
            if (!recs) { PyErr_NoMemory(); return -1; }
            s->recs = recs;
            s->cap = cap;
        }
        s->recs[s->n++] = (Rec){ts, start, pos, program};
    }
    return 0;
}

/* Move to the stream's next sub-buffer; 1 if there is one, 0 at the end, -1 on error. */
static int next_sub_buffer(Stream *s) {
    Py_CLEAR(s->sb_bytes);
    while (!s->chunk || s->next >= PyBytes_GET_SIZE(s->chunk)) {
        Py_CLEAR(s->chunk);
        PyObject *chunk = PyIter_Next(s->chunks);
        if (!chunk) return PyErr_Occurred() ? -1 : 0;
        if (!PyBytes_Check(chunk) || PyBytes_GET_SIZE(chunk) % s->size) {
            Py_DECREF(chunk);
            PyErr_SetString(PyExc_TypeError, "chunks must be bytes of whole sub-buffers");
            return -1;
        }
        s->chunk = chunk;
        s->next = 0;
    }
    s->sb = (const unsigned char *)PyBytes_AS_STRING(s->chunk) + s->next;
    s->next += s->size;
    return 1;
}

static long long add_lost(long long total, long long lost) {
    if (total < 0 || lost < 0) return (total || lost) ? -1 : 0;
    return total + lost;
}

static int lost_line(Ctx *c, long cpu, long long lost) {
    if (!lost) return 0;
    if (lost > 0) c->lost_total += lost;
    if (!c->lost_lines) return 0;
    char text[96];
    int n = lost < 0 ? snprintf(text, sizeof text, "CPU:%ld [LOST EVENTS]\n", cpu)
                     : snprintf(text, sizeof text, "CPU:%ld [LOST %lld EVENTS]\n", cpu, lost);
    return out_put(&c->out, text, n);
}

/* `load` of merge_cpu_batches: the stream's next sub-buffer with records, the losses before
 * it carried; a loss at the stream's end is printed where the stream ends. */
static int load(Ctx *c, Stream *s) {
    long long lost = 0;
    s->live = 0;
    for (;;) {
        if (PyErr_CheckSignals() < 0) return -1; /* Ctrl-C during a long report */
        int more = next_sub_buffer(s);
        if (more < 0) return -1;
        if (!more) return lost_line(c, s->cpu, lost);
        long long batch_lost;
        if (walk(c, s, &batch_lost) < 0) return -1;
        lost = add_lost(lost, batch_lost);
        if (s->n) {
            s->lost = lost;
            s->live = 1;
            return 0;
        }
    }
}

/* ---- one line ---- */

static PyObject *task_text(Ctx *c, long tid) {
    if (c->last_task && tid == c->last_tid) return c->last_task;
    PyObject *key = PyLong_FromLong(tid);
    if (!key) return NULL;
    PyObject *text = PyDict_GetItemWithError(c->tasks, key);
    if (!text) {
        if (PyErr_Occurred()) { Py_DECREF(key); return NULL; }
        text = PyObject_CallOneArg(c->task, key);
        if (!text || !PyBytes_Check(text) || PyDict_SetItem(c->tasks, key, text) < 0) {
            if (text && !PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "the task column must be bytes");
            Py_XDECREF(text);
            Py_DECREF(key);
            return NULL;
        }
        Py_DECREF(text); /* the dict holds it */
    }
    Py_DECREF(key);
    c->last_tid = tid;
    c->last_task = text;
    return text;
}

static int timestamp(Ctx *c, u128 ts) {
    Out *o = &c->out;
    if (!c->in_ns) {
        if (out_put(o, " ", 1) < 0 || out_number(o, 0, ts, 0, 12, 0) < 0) return -1;
        return out_put(o, ": ", 2);
    }
    u128 micros = (ts + 500) / 1000;
    if (micros < c->second_base || micros - c->second_base >= 1000000) {
        u128 seconds = micros / 1000000;
        c->second_base = seconds * 1000000;
        char buf[48], *end = buf + sizeof buf, *p = digits(seconds, end);
        int len = (int)(end - p), i = 0;
        c->second_text[i++] = ' ';
        for (; len + i - 1 < 5; ) c->second_text[i++] = ' ';
        memcpy(c->second_text + i, p, len);
        i += len;
        c->second_text[i++] = '.';
        c->second_len = i;
    }
    if (out_put(o, c->second_text, c->second_len) < 0) return -1;
    if (out_number(o, 0, micros - c->second_base, 0, 6, 1) < 0) return -1;
    return out_put(o, ": ", 2);
}

static int int_value(Out *o, const unsigned char *at, int size, int is_signed, int hex) {
    uint64_t raw = size == 1 ? at[0] : size == 2 ? rd16(at) : size == 4 ? rd32(at) : rd64(at);
    int negative = 0;
    if (is_signed && size < 8 && (raw >> (8 * size - 1)) & 1) raw |= ~0ull << (8 * size);
    if (is_signed && (int64_t)raw < 0) { negative = 1; raw = -raw; }
    return out_number(o, negative, raw, hex, 0, 0);
}

static int format_line(Ctx *c, Stream *s, const Rec *r) {
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(r->program);
    const unsigned char *end = p + PyBytes_GET_SIZE(r->program);
    const unsigned char *rec = s->sb + r->start;
    Out *o = &c->out;
    if (p[0] == MODE_FALLBACK) {
        PyObject *sb = sub_buffer_bytes(s);
        if (!sb) return -1;
        PyObject *ts = ts_object(r->ts);
        if (!ts) return -1;
        PyObject *line = PyObject_CallFunction(c->fallback, "nOIIO", s->index, sb, r->start,
                                               r->pos, ts);
        Py_DECREF(ts);
        if (!line) return -1;
        int err = PyBytes_Check(line) ? out_bytes(o, line) : -1;
        if (err && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a line must be bytes");
        Py_DECREF(line);
        return err;
    }
    p += 5 + 4 * rd16(p + 3);
    /* the context columns: task, cpu, flags, time */
    int32_t tid = (int32_t)rd32(rec + rd16(p + 4));
    PyObject *task = task_text(c, tid);
    if (!task || out_bytes(o, task) < 0) return -1;
    if (out_put(o, "[", 1) < 0 || out_number(o, s->cpu < 0, s->cpu < 0 ? -s->cpu : s->cpu,
                                             0, 3, 1) < 0 || out_put(o, "] ", 2) < 0)
        return -1;
    if (c->flags != Py_None) {
        unsigned key = rec[rd16(p)] << 8 | rec[rd16(p + 2)];
        if (!c->flag_text[key]) {
            PyObject *text = PyObject_CallFunction(c->flags, "I", key);
            if (!text) return -1;
            if (!PyBytes_Check(text)) {
                Py_DECREF(text);
                PyErr_SetString(PyExc_TypeError, "the flags column must be bytes");
                return -1;
            }
            c->flag_text[key] = text;
        }
        if (out_bytes(o, c->flag_text[key]) < 0) return -1;
    }
    if (timestamp(c, r->ts) < 0) return -1;
    /* the event's own text */
    for (p += 6; p < end;) {
        switch (*p) {
        case OP_LITERAL: {
            unsigned n = rd16(p + 1);
            if (out_put(o, (const char *)p + 3, n) < 0) return -1;
            p += 3 + n;
            break;
        }
        case OP_INT:
            if (int_value(o, rec + rd16(p + 1), p[3], p[4], p[5]) < 0) return -1;
            p += 6;
            break;
        case OP_CHAR:
            if (out_put(o, (const char *)rec + rd16(p + 1), 1) < 0) return -1;
            p += 3;
            break;
        case OP_STRING: {
            uint32_t loc = rd32(rec + rd16(p + 1)), length = loc >> 16;
            if (!length) {
                if (out_put(o, "(fault)", 7) < 0) return -1;
            } else {
                const char *text = (const char *)rec + rd16(p + 3) + (loc & 0xffff);
                if (out_put(o, "\"", 1) < 0 || out_put(o, text, length - 1) < 0 ||
                    out_put(o, "\"", 1) < 0)
                    return -1;
            }
            p += 5;
            break;
        }
        default:
            PyErr_Format(PyExc_ValueError, "unknown format program op %d", *p);
            return -1;
        }
    }
    return out_put(o, "\n", 1);
}

/* ---- the merge (merge_cpu_batches, record for record) ---- */

/* Whether stream a's next record sorts before stream b's: (timestamp, cpu, index). */
static int before(const Stream *a, Py_ssize_t ia, const Stream *b, Py_ssize_t ib) {
    u128 ta = a->recs[a->first].ts, tb = b->recs[b->first].ts;
    if (ta != tb) return ta < tb;
    if (a->cpu != b->cpu) return a->cpu < b->cpu;
    return ia < ib;
}

static int run_merge(Ctx *c, Stream *streams, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++)
        if (load(c, &streams[i]) < 0) return -1;
    for (;;) {
        Py_ssize_t best = -1, second = -1;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (!streams[i].live) continue;
            if (best < 0 || before(&streams[i], i, &streams[best], best)) {
                second = best;
                best = i;
            } else if (second < 0 || before(&streams[i], i, &streams[second], second)) {
                second = i;
            }
        }
        if (best < 0) return 0;
        Stream *s = &streams[best];
        Py_ssize_t stop = s->n;
        if (second >= 0) { /* bisect_right on a tie the lower cpu wins, else bisect_left */
            const Stream *limit = &streams[second];
            u128 x = limit->recs[limit->first].ts;
            int right = s->cpu < limit->cpu;
            Py_ssize_t lo = s->first + 1, hi = s->n;
            while (lo < hi) {
                Py_ssize_t mid = (lo + hi) / 2;
                if (right ? x < s->recs[mid].ts : s->recs[mid].ts < x) {
                    if (right) hi = mid; else lo = mid + 1;
                } else {
                    if (right) lo = mid + 1; else hi = mid;
                }
            }
            stop = lo;
        }
        if (lost_line(c, s->cpu, s->lost) < 0) return -1;
        s->lost = 0;
        for (Py_ssize_t k = s->first; k < stop; k++)
            if (format_line(c, s, &s->recs[k]) < 0) return -1;
        c->events += stop - s->first;
        if (c->out.len >= FLUSH_AT && out_flush(&c->out) < 0) return -1;
        if (stop < s->n) {
            s->first = stop;
        } else if (load(c, s) < 0) {
            return -1;
        }
    }
}

static PyObject *render(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"streams", "header_event", "resolve", "skip", "task", "flags",
                            "fallback", "check", "write", "in_ns", "lost_lines", NULL};
    PyObject *stream_list, *header;
    Ctx *c = PyMem_Calloc(1, sizeof(Ctx));
    if (!c) return PyErr_NoMemory();
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!OOOOOOOpp", names, &PyList_Type,
                                     &stream_list, &PyTuple_Type, &header, &c->resolve,
                                     &c->skip, &c->task, &c->flags, &c->fallback, &c->check,
                                     &c->out.write, &c->in_ns, &c->lost_lines)) {
        PyMem_Free(c);
        return NULL;
    }
    if (!PyArg_ParseTuple(header, "iiiii", &c->type_len_bits, &c->data_max, &c->padding,
                          &c->time_extend, &c->time_stamp)) {
        PyMem_Free(c);
        return NULL;
    }
    c->second_base = ~(u128)0; /* no second cached yet: any time misses */
    Py_ssize_t count = PyList_GET_SIZE(stream_list);
    Stream *streams = PyMem_Calloc(count ? count : 1, sizeof(Stream));
    PyObject *result = NULL;
    c->tasks = PyDict_New();
    if (!streams || !c->tasks) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < count; i++) {
        Stream *s = &streams[i];
        PyObject *chunks;
        s->index = i;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(stream_list, i), "lnnnnnO", &s->cpu, &s->size,
                              &s->data_offset, &s->ts_offset, &s->commit_offset,
                              &s->long_size, &chunks))
            goto done;
        if (s->size <= 0 || s->ts_offset + 8 > s->size ||
            s->commit_offset + s->long_size > s->size ||
            (s->long_size != 4 && s->long_size != 8)) {
            PyErr_SetString(PyExc_ValueError, "a sub-buffer layout the accelerator cannot read");
            goto done;
        }
        s->chunks = PyObject_GetIter(chunks);
        if (!s->chunks) goto done;
    }
    if (run_merge(c, streams, count) == 0 && out_flush(&c->out) == 0)
        result = Py_BuildValue("LL", c->events, c->lost_total);
    else if (c->out.len) { /* print what was formatted before the error, as Python would */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (out_flush(&c->out) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
done:
    for (Py_ssize_t i = 0; streams && i < count; i++) {
        Py_XDECREF(streams[i].chunks);
        Py_XDECREF(streams[i].chunk);
        Py_XDECREF(streams[i].sb_bytes);
        PyMem_Free(streams[i].recs);
    }
    PyMem_Free(streams);
    for (int i = 0; i < EVENT_IDS; i++) Py_XDECREF(c->programs[i]);
    for (int i = 0; i < FLAG_KEYS; i++) Py_XDECREF(c->flag_text[i]);
    Py_XDECREF(c->tasks);
    PyMem_Free(c->out.data);
    PyMem_Free(c);
    return result;
}

static PyMethodDef methods[] = {
    {"render", (PyCFunction)(void (*)(void))render, METH_VARARGS | METH_KEYWORDS,
     "render(streams, header_event, resolve, skip, task, flags, fallback, check, write, "
     "in_ns, lost_lines) -> (events, lost): print merged per-CPU sub-buffers as text."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastformat",
    "The compiled loop of `probescope report`'s text output (see sinks/text_program.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__fastformat(void) { return PyModule_Create(&module); }
