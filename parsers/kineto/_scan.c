/*
 * Fast path of the Kineto parser: one pass over the bytes of a `traceEvents` array that fills
 * Arrow-ready column buffers directly, with no Python object per event.
 *
 * It reads the keys every event has (ph, cat, name, pid, tid, ts, dur, id, args), keeps the
 * complete raw text of `args` (lossless), and pulls the few args keys that become columns.
 * `ts` and `dur` are converted from their decimal text to exact int64 nanoseconds (digits beyond
 * the nanosecond round half to even, as the Decimal path in _tolerant.py does).
 *
 * Anything unusual (malformed JSON, NaN tokens, an element that is not an object) makes scan()
 * raise ValueError; the caller then uses the tolerant pure-Python path, which repairs and
 * salvages. So this file only has to be right for well-formed input, and fast.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* xxHash 0.8 (BSD-2, vendor/xxhash.LICENSE): the content id of a mapped file, hashed while it
 * is scanned. Inlined: nothing to link. */
#define XXH_INLINE_ALL
#include "vendor/xxhash.h"

/* The per-byte and per-value helpers are inlined into the element loop whatever the
 * compiler's heuristics say: called as functions, each stored the cursor (and a column's
 * buffer fields) to memory and loaded them back, ~20 % of the scan's CPU time
 * (docs/performance.md, log 50). */
#if defined(__GNUC__)
#define HOT static inline __attribute__((always_inline))
#else
#define HOT static inline
#endif

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    int mapped; /* data is an anonymous mapping of cap bytes (see buf_reserve), not malloc'd */
} Buf;

/* Buffers from MAP_FROM (64 KiB) up live in their own anonymous mappings and grow by
 * mremap, which moves page tables instead of bytes. realloc copied them: glibc's mmap
 * threshold rises to 32 MB once a process frees a large block, so most columns sat in the
 * heap and each doubling copied the column into freshly faulted pages (more than half of the
 * scan's page faults; docs/performance.md, log 22). They are not advised onto transparent
 * huge pages: on the project's VM that made the scan's system time swing 3x from run to run
 * and cost ~20 MB of peak RSS, for a slower median. */
#define MAP_FROM (64 << 10)

/* Into a mapping of cap bytes: a mapped buffer's pages move there (nothing is copied unless
 * mremap is missing, as on macOS, or fails); a malloc'd one is copied once. */
static int map_grow(Buf *b, Py_ssize_t cap) {
    char *to = MAP_FAILED;
#ifdef MREMAP_MAYMOVE
    if (b->mapped) to = mremap(b->data, (size_t)b->cap, (size_t)cap, MREMAP_MAYMOVE);
#endif
    if (to == MAP_FAILED) {
        to = mmap(NULL, (size_t)cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (to == MAP_FAILED) return -1;
        if (b->len) memcpy(to, b->data, (size_t)b->len);
        if (b->mapped) munmap(b->data, (size_t)b->cap);
        else free(b->data);
    }
    b->data = to;
    b->cap = cap;
    b->mapped = 1;
    return 0;
}

HOT int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    if (cap >= MAP_FROM) return map_grow(b, cap);
    char *d = realloc(b->data, (size_t)cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

static void buf_free(Buf *b) {
    if (b->mapped) munmap(b->data, (size_t)b->cap);
    else free(b->data);
    memset(b, 0, sizeof(Buf));
}

HOT int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

/* Distinct strings of a text column that repeats (names, categories, phases ...): rows hold
 * an index into it, so each name is stored once instead of once per event. Open addressing. */
typedef struct {
    Buf data;        /* the distinct strings, back to back */
    Buf offsets;     /* int64 offsets, entries + 1 */
    uint32_t *slots; /* entry + 1; 0 = empty */
    uint64_t *slot_hash;
    Py_ssize_t cap, n;
} Dict;

/* Validity is kept as one byte per row while scanning and packed into a bitmap at the end.
 * Integer columns start as (row, value) pairs: most args columns hold a value on few rows, and
 * a dense int64 column per args key was most of the scanner's memory. A column that turns out
 * to hold values on at least 1/8 of the rows switches to dense values (row-indexed) early;
 * sparse ones go out as pairs, which the caller spreads over one batch of rows at a time. */
typedef struct Col {
    const char *name;
    int is_str;  /* 1: text column, 0: int64 column */
    int is_dict; /* text stored as dictionary indices (int32 per row) */
    int dense;   /* integers: row-indexed values + validity bytes, not pairs */
    Buf values;  /* int64 values, string bytes, or int32 dictionary indices */
    Buf offsets; /* int64 offsets (plain text), or uint32 row numbers (sparse integers) */
    Buf valid;   /* one byte per row (text, dense integers) */
    Buf scratch; /* unescaped text before interning */
    Dict dict;
    int any;     /* at least one non-null value */
    /* per-event staging: where this event's value is, if any */
    int has;
    int64_t ival;
    const char *s;
    Py_ssize_t slen;
    int s_escaped; /* string needs unescaping */
    int s_raw;     /* not a JSON string: keep the raw text */
    /* the last tail_rows rows, scanned by the second thread and handed over as a chunk of
     * their own (see scan_rest); this column then holds the rows before them */
    struct Col *tail;
    Py_ssize_t tail_rows;
} Col;

enum {
    C_PH, C_CAT, C_NAME, C_PID, C_PID_LABEL, C_TID, C_TID_LABEL, C_TS, C_DUR, C_ID, C_ARGS,
    /* args */
    A_EXTERNAL_ID, A_CORRELATION, A_DEVICE, A_STREAM, A_COLLECTIVE_NAME, A_PG_NAME, A_PG_DESC,
    A_PG_RANKS, A_SEQ, A_IN_NELEMS, A_OUT_NELEMS, A_DTYPE, A_GROUP_SIZE, A_BYTES, A_FLOPS,
    A_MEM_BYTES, A_MEM_TOTAL_ALLOCATED, A_MEM_TOTAL_RESERVED, A_MEM_DEVICE,
    N_COLS
};

static const char *COL_NAMES[N_COLS] = {
    "ph", "category", "name", "pid", "pid_label", "tid", "tid_label", "ts_ns", "dur_ns",
    "flow_id", "args_json", "external_id", "correlation", "device", "stream", "collective_name",
    "pg_name", "pg_desc", "pg_ranks", "seq", "in_nelems", "out_nelems", "dtype", "group_size",
    "bytes", "flops", "mem_bytes", "mem_total_allocated", "mem_total_reserved", "mem_device",
};

/* Text columns whose values repeat: interned (see Dict). */
static const int COL_IS_DICT[N_COLS] = {
    1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
};

static const int COL_IS_STR[N_COLS] = {
    1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
};

/* args keys -> columns: a copy of traceview/schema.py's KINETO_ARGS (and COL_IS_STR of its
 * KINETO_TEXT_ARGS); tests/test_kineto_args.py fails when they drift apart. Older spellings map
 * to the same column; the first key seen in the list order wins when both are present, as in
 * the Python path (current spelling first). */
typedef struct {
    const char *key;
    int col;
    int priority; /* 0 = current spelling, 1 = alias */
} ArgKey;

#define KEY_IS(k, n, lit) ((n) == (Py_ssize_t)(sizeof(lit) - 1) && memcmp((k), (lit), sizeof(lit) - 1) == 0)

static const ArgKey ARG_KEYS[] = {
    {"External id", A_EXTERNAL_ID, 0}, {"external id", A_EXTERNAL_ID, 1},
    {"correlation", A_CORRELATION, 0}, {"device", A_DEVICE, 0}, {"stream", A_STREAM, 0},
    {"Collective name", A_COLLECTIVE_NAME, 0}, {"Process Group Name", A_PG_NAME, 0},
    {"Process Group Description", A_PG_DESC, 0}, {"Process Group Ranks", A_PG_RANKS, 0},
    {"Seq", A_SEQ, 0}, {"seq", A_SEQ, 1}, {"In msg nelems", A_IN_NELEMS, 0},
    {"Out msg nelems", A_OUT_NELEMS, 0}, {"dtype", A_DTYPE, 0}, {"Group size", A_GROUP_SIZE, 0},
    {"bytes", A_BYTES, 0}, {"flops", A_FLOPS, 0}, {"Bytes", A_MEM_BYTES, 0},
    {"Total Allocated", A_MEM_TOTAL_ALLOCATED, 0}, {"Total Reserved", A_MEM_TOTAL_RESERVED, 0},
    {"Device Id", A_MEM_DEVICE, 0},
};
#define N_ARG_KEYS ((int)(sizeof(ARG_KEYS) / sizeof(ARG_KEYS[0])))
static Py_ssize_t ARG_KEY_LEN[N_ARG_KEYS];
/* The args key with a given (length, first byte), + 1; 0 for none. No two keys share both
 * (checked at import), so a key is matched with one lookup and one memcmp. */
#define ARG_MAX_LEN 32
static signed char ARG_BY_SHAPE[ARG_MAX_LEN][128];

typedef struct {
    const char *p, *end, *start;
    const char *err;
    /* With a memory map as input, pages of the event array already scanned are handed back
     * to the kernel as the scan moves on, so the input does not stay resident next to the
     * columns built from it. A file mapping faults them back in if read again; a private
     * anonymous one (inflated gzip) reads zeros, so its caller must not reuse the buffer
     * after a failed scan. Never set for other memory. */
    int release;
    const char *released;
    /* Following a producer (gzip inflated in another thread, see scan()): `end` is how far
     * the bytes are known, `progress` says how far they are published and whether the
     * producer finished. Element scans that run into `end` before the buffer's real end are
     * resumed at `resume` once more bytes are there (`resume_after`: just after an element,
     * rather than at one). */
    int64_t *progress;
    const char *real_end;
    const char *resume;
    int resume_after;
    int in_array; /* the event array has begun: rows may be committed, no restart from the top */
    Py_ssize_t follow_step; /* bytes to wait for before scanning on */
    Py_ssize_t waits;       /* how often it waited (reported, so tests can see it followed) */
    /* The bounds on one event (parsers/kineto/_bounds.py): an element spanning more bytes,
     * or nesting deeper, is skipped and counted, not stored. `level`: how deep the value
     * being read sits (the event's own object is 1); `deepest`: the deepest level this
     * event reached. */
    Py_ssize_t max_event_bytes;
    int max_depth, level, deepest;
    Py_ssize_t too_large, too_deep;
    /* The input is a memory-mapped file: reads past an end another process cut it to raise
     * SIGBUS, which the element scans turn into an error (see guarded_elements). */
    int mapped_file;
    /* keep_damaged (scan()'s last argument): a failure inside the event array keeps the rows
     * committed before it, and `resume` says where the first element not read begins (the
     * caller checks that nothing complete follows it: _salvage.ends_in_damage).
     * `broken`: the columns may hold part of a row (a commit that failed, a file cut short
     * under a read), so no row can be kept. */
    int keep_damaged, broken;
} Scanner;

/* ------------------------------------------------------------------ a mapped file cut short
 *
 * A page of a mapped file past the end another process truncated it to (a profiler rewriting
 * its trace, a copy started over) raises SIGBUS on the thread that reads it, which kills the
 * process with no word said. While scan() reads a mapped file, SIGBUS on a thread reading it
 * jumps back to where that thread began (its landing), and the scan fails like one of damaged
 * input: the caller reads the file again, sees it changed, and says so. SIGBUS anywhere else
 * goes to whatever handled it before (Python's faulthandler, or the default: the process
 * dies, as it would have). */
static __thread sigjmp_buf *bus_landing;
static pthread_mutex_t bus_lock = PTHREAD_MUTEX_INITIALIZER;
static int bus_guards; /* scans reading a mapped file now: the handler is ours while > 0 */
static struct sigaction bus_before;
static const char *const CUT_SHORT = "the file was cut short while it was read";

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    if (bus_landing) siglongjmp(*bus_landing, 1);
    if (bus_before.sa_flags & SA_SIGINFO) {
        bus_before.sa_sigaction(sig, info, context);
    } else if (bus_before.sa_handler != SIG_DFL && bus_before.sa_handler != SIG_IGN) {
        bus_before.sa_handler(sig);
    } else {
        /* the default: returning re-runs the faulting read, which now ends the process */
        struct sigaction fallback;
        memset(&fallback, 0, sizeof(fallback));
        fallback.sa_handler = SIG_DFL;
        sigaction(sig, &fallback, NULL);
    }
}

static void guard_mapped_reads(void) {
    pthread_mutex_lock(&bus_lock);
    if (bus_guards++ == 0) {
        struct sigaction ours;
        memset(&ours, 0, sizeof(ours));
        ours.sa_sigaction = on_sigbus;
        ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&ours.sa_mask);
        sigaction(SIGBUS, &ours, &bus_before);
    }
    pthread_mutex_unlock(&bus_lock);
}

static void unguard_mapped_reads(void) {
    pthread_mutex_lock(&bus_lock);
    if (--bus_guards == 0) sigaction(SIGBUS, &bus_before, NULL);
    pthread_mutex_unlock(&bus_lock);
}

/* Hashes a mapped file beside the scan (its content id: xxh3-128, as xxhash.xxh3_128), in
 * chunks, handing each chunk's pages back once hashed: the scan faults them in again from the
 * page cache when it gets there, and they never all count as resident at once. */
#define HASH_CHUNK (4 << 20)

typedef struct {
    const char *data;
    Py_ssize_t len;
    XXH128_canonical_t digest;
    int ok;
} Hasher;

static void *hash_mapped(void *arg) {
    Hasher *h = (Hasher *)arg;
    static __thread XXH3_state_t state; /* 64-byte aligned, too large for a small stack */
    sigjmp_buf landing;
    if (sigsetjmp(landing, 1)) {
        bus_landing = NULL;
        h->ok = 0;
        return NULL;
    }
    bus_landing = &landing;
    XXH3_128bits_reset(&state);
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (Py_ssize_t at = 0; at < h->len; at += HASH_CHUNK) {
        Py_ssize_t n = h->len - at < HASH_CHUNK ? h->len - at : HASH_CHUNK;
        XXH3_128bits_update(&state, h->data + at, (size_t)n);
        uintptr_t from = ((uintptr_t)(h->data + at) + page - 1) & ~(page - 1);
        uintptr_t to = (uintptr_t)(h->data + at + n) & ~(page - 1);
        if (to > from) madvise((void *)from, to - from, MADV_DONTNEED);
    }
    XXH128_canonicalFromHash(&h->digest, XXH3_128bits_digest(&state));
    h->ok = 1;
    bus_landing = NULL;
    return NULL;
}

#define RELEASE_STEP (16 << 20)

static void release_behind(Scanner *sc) {
    if (sc->p - sc->released < RELEASE_STEP) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t from = ((uintptr_t)sc->released + page - 1) & ~(page - 1);
    uintptr_t to = (uintptr_t)sc->p & ~(page - 1);
    if (to > from) madvise((void *)from, to - from, MADV_DONTNEED);
    sc->released = sc->p;
}

/* progress[0]: bytes published; progress[1]: PRODUCING, DONE (all bytes there and checked)
 * or FAILED. Stored with release, loaded with acquire: bytes below a published count are
 * complete when the scanner sees the count. */
enum { PRODUCING = 0, DONE = 1, FAILED = -1 };
/* Bytes to wait for before scanning on, by default (scan()'s last argument overrides it, so
 * tests can cut the input at every few bytes). */
#define FOLLOW_STEP (256 << 10)

static int following(const Scanner *sc) { return sc->progress && sc->end < sc->real_end; }

/* Wait until more bytes are published (sc->follow_step, or the rest), then move `end`.
 * `redo`: where the scan starts again after the wait; the wait is at least as long as what
 * will be scanned again, so a long element (or header) cut many times costs at most twice
 * its length, not its length times the cuts. 0 ok, -1 when the producer failed. */
static int wait_for_bytes_from(Scanner *sc, const char *redo) {
    struct timespec nap = {0, 100 * 1000};
    Py_ssize_t step = sc->follow_step;
    if (redo && sc->end - redo > step) step = sc->end - redo;
    for (;;) {
        int64_t state = __atomic_load_n(&sc->progress[1], __ATOMIC_ACQUIRE);
        int64_t have = __atomic_load_n(&sc->progress[0], __ATOMIC_ACQUIRE);
        if (state == FAILED) { sc->err = "the input could not be read to its end"; return -1; }
        const char *frontier = sc->start + have;
        if (frontier > sc->real_end) frontier = sc->real_end;
        if (state == DONE) frontier = sc->real_end; /* DONE is only set with every byte in */
        if (state == DONE || frontier - sc->end >= step) {
            sc->end = frontier;
            sc->waits++;
            return 0;
        }
        nanosleep(&nap, NULL);
    }
}

static int wait_for_bytes(Scanner *sc) { return wait_for_bytes_from(sc, NULL); }

/* All bytes there: the scanner reads the rest like a plain buffer. */
static int wait_for_all(Scanner *sc) {
    while (following(sc))
        if (wait_for_bytes(sc) < 0) return -1;
    return 0;
}

/* Following a producer: wait for its last word (it checks for bytes past the recorded size
 * after the last one is in). 0 when every byte is there and checked, -1 otherwise. */
static int wait_for_verdict(Scanner *sc) {
    struct timespec nap = {0, 100 * 1000};
    if (!sc->progress) return 0;
    for (;;) {
        int64_t state = __atomic_load_n(&sc->progress[1], __ATOMIC_ACQUIRE);
        if (state == DONE) return 0;
        if (state == FAILED) { sc->err = "the input could not be read to its end"; return -1; }
        nanosleep(&nap, NULL);
    }
}

static inline void skip_ws(Scanner *sc) {
    if (sc->p < sc->end && (unsigned char)*sc->p > ' ') return; /* the usual case: no space */
    const char *p = sc->p, *end = sc->end; /* a local cursor: no store per byte */
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    sc->p = p;
}

/* Eight bytes at a time: a bit set in the lowest byte equal to '"' or '\\' (SWAR: bytes above
 * the first match may be flagged falsely, so only the lowest flagged byte is used). */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline uint64_t quote_or_backslash(uint64_t w) {
    uint64_t q = w ^ (ONES * '"'), b = w ^ (ONES * '\\');
    return ((q - ONES) & ~q & HIGHS) | ((b - ONES) & ~b & HIGHS);
}

/* At an opening quote: find the closing quote, in one pass. Sets *escaped when a backslash
 * occurs (the caller then unescapes). */
HOT int scan_string(Scanner *sc, const char **s, Py_ssize_t *n, int *escaped) {
    const char *start = sc->p + 1, *p = start, *end = sc->end;
    int esc = 0;
    for (;;) {
        while (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t hit = quote_or_backslash(w);
            if (hit) { p += __builtin_ctzll(hit) >> 3; break; }
            p += 8;
        }
        while (p < end && *p != '"' && *p != '\\') p++;
        if (p >= end) { sc->err = "unterminated string"; return -1; }
        if (*p == '"') break;
        esc = 1;
        p += 2; /* the backslash and the character it escapes */
    }
    *escaped = esc;
    *s = start;
    *n = p - start;
    sc->p = p + 1;
    return 0;
}

/* Bytes that matter inside a container being skipped. */
static unsigned char SKIP_STOP[256];

HOT int skip_container(Scanner *sc) {
    int depth = 0;
    while (sc->p < sc->end) {
        const char *p = sc->p, *end = sc->end;
        while (p < end && !SKIP_STOP[(unsigned char)*p]) p++;
        sc->p = p;
        if (p >= end) break;
        char c = *p;
        if (c == '"') {
            const char *s; Py_ssize_t n; int e;
            if (scan_string(sc, &s, &n, &e) < 0) return -1;
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
            if (sc->level + depth > sc->deepest) sc->deepest = sc->level + depth;
        } else if (c == '}' || c == ']') {
            depth--;
            if (depth == 0) { sc->p++; return 0; }
        } else if (c == 'N' || c == 'I') { sc->err = "non-standard token"; return -1; }
        sc->p++;
    }
    sc->err = "unterminated object or array";
    return -1;
}

/* Bytes that end a scalar. */
static unsigned char SCALAR_END[256];

HOT int skip_scalar(Scanner *sc) {
    const char *p = sc->p;
    while (p < sc->end && !SCALAR_END[(unsigned char)*p]) p++;
    if (p == sc->p) { sc->err = "expected a value"; return -1; }
    char c0 = *sc->p;
    if (!((c0 >= '0' && c0 <= '9') || c0 == '-' || c0 == 't' || c0 == 'f' || c0 == 'n')) {
        sc->err = "unexpected token";
        return -1;
    }
    if (c0 == 'n' && !(p - sc->p == 4 && memcmp(sc->p, "null", 4) == 0)) {
        sc->err = "unexpected token"; return -1;
    }
    if (c0 == 't' && !(p - sc->p == 4 && memcmp(sc->p, "true", 4) == 0)) {
        sc->err = "unexpected token"; return -1;
    }
    if (c0 == 'f' && !(p - sc->p == 5 && memcmp(sc->p, "false", 5) == 0)) {
        sc->err = "unexpected token"; return -1;
    }
    if (c0 == '-' && p - sc->p > 1 && (sc->p[1] == 'I' || sc->p[1] == 'N')) {
        sc->err = "non-standard token"; return -1;
    }
    sc->p = p;
    return 0;
}

HOT int skip_value(Scanner *sc) {
    skip_ws(sc);
    if (sc->p >= sc->end) { sc->err = "unexpected end"; return -1; }
    char c = *sc->p;
    if (c == '"') {
        const char *s; Py_ssize_t n; int e;
        return scan_string(sc, &s, &n, &e);
    }
    if (c == '{' || c == '[') return skip_container(sc);
    return skip_scalar(sc);
}

/* ------------------------------------------------------------------ numbers */

/* Parse an integer-valued JSON number (or integral float) into int64. 1 ok, 0 not an int64. */
HOT int parse_int_text(const char *s, Py_ssize_t n, int64_t *out) {
    Py_ssize_t i = 0;
    int neg = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
    while (n > i && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (i < n && (s[i] == '-' || s[i] == '+')) { neg = s[i] == '-'; i++; }
    if (i >= n) return 0;
    if (n - i > 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        uint64_t v = 0;
        for (i += 2; i < n; i++) {
            int d;
            char c = s[i];
            if (c >= '0' && c <= '9') d = c - '0';
            else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
            else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
            else return 0;
            if (v > (UINT64_MAX >> 4)) return 0;
            v = v * 16 + (uint64_t)d;
        }
        if (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX) return 0;
        *out = neg ? (int64_t)(0 - v) : (int64_t)v;
        return 1;
    }
    uint64_t v = 0;
    int digits = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        if (v > (UINT64_MAX - 9) / 10) return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
        digits++;
    }
    if (!digits) return 0;
    if (i < n) {
        /* integral float like 4.0 or 4.000 */
        if (s[i] != '.') return 0;
        for (i++; i < n; i++) if (s[i] != '0') return 0;
    }
    if (neg ? v > (uint64_t)INT64_MAX + 1 : v > (uint64_t)INT64_MAX) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

/* Decimal microseconds -> int64 ns, exact; rounding half to even past the 3rd decimal.
 * Returns 1 ok, 0 not representable / not a plain decimal (caller falls back or nulls). */
HOT int parse_us_to_ns(const char *s, Py_ssize_t n, int64_t *out) {
    Py_ssize_t i = 0;
    int neg = 0;
    if (i < n && s[i] == '-') { neg = 1; i++; }
    /* 64-bit digits while they fit (every real timestamp), 128-bit only beyond */
    uint64_t small = 0;
    int digits = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9' && digits < 18; i++, digits++)
        small = small * 10 + (uint64_t)(s[i] - '0');
    __int128 whole = small;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++, digits++) {
        whole = whole * 10 + (s[i] - '0');
        if (whole > ((__int128)1 << 100)) return 0;
    }
    int frac[3] = {0, 0, 0};
    int round_digit = -1, sticky = 0;
    if (i < n && s[i] == '.') {
        i++;
        int k = 0;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++, k++) {
            if (k < 3) frac[k] = s[i] - '0';
            else if (k == 3) round_digit = s[i] - '0';
            else if (s[i] != '0') sticky = 1;
        }
        digits += k;
    }
    if (!digits) return 0;
    if (i < n) {
        /* exponent or junk: let the caller use the general path */
        return -1;
    }
    __int128 ns = whole * 1000 + frac[0] * 100 + frac[1] * 10 + frac[2];
    if (round_digit > 5 || (round_digit == 5 && (sticky || (ns & 1)))) ns += 1;
    if (neg) ns = -ns;
    if (ns > INT64_MAX || ns < INT64_MIN) return 0;
    *out = (int64_t)ns;
    return 1;
}

/* ------------------------------------------------------------------ strings */

static int utf8_put(Buf *b, uint32_t cp) {
    char tmp[4];
    int n;
    if (cp < 0x80) { tmp[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { tmp[0] = (char)(0xC0 | (cp >> 6)); tmp[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        tmp[0] = (char)(0xE0 | (cp >> 12)); tmp[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        tmp[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        tmp[0] = (char)(0xF0 | (cp >> 18)); tmp[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        tmp[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); tmp[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    return buf_put(b, tmp, n);
}

static int hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Append the unescaped content of a JSON string. -1 on a bad escape. */
static int put_unescaped(Buf *b, const char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        const char *bs = memchr(s + i, '\\', (size_t)(n - i));
        Py_ssize_t run = bs ? bs - (s + i) : n - i;
        if (run && buf_put(b, s + i, run) < 0) return -1;
        i += run;
        if (!bs) break;
        if (i + 1 >= n) return -1;
        char c = s[i + 1];
        char out;
        switch (c) {
            case '"': out = '"'; break;
            case '\\': out = '\\'; break;
            case '/': out = '/'; break;
            case 'b': out = '\b'; break;
            case 'f': out = '\f'; break;
            case 'n': out = '\n'; break;
            case 'r': out = '\r'; break;
            case 't': out = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (i + 6 > n || hex4(s + i + 2, &cp) < 0) return -1;
                i += 6;
                if (cp >= 0xD800 && cp < 0xDC00) {
                    uint32_t lo;
                    if (i + 6 <= n && s[i] == '\\' && s[i + 1] == 'u' && hex4(s + i + 2, &lo) == 0
                        && lo >= 0xDC00 && lo < 0xE000) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        i += 6;
                    } else {
                        cp = 0xFFFD; /* lone surrogate: replacement, as Python's 'replace' */
                    }
                } else if (cp >= 0xDC00 && cp < 0xE000) {
                    cp = 0xFFFD;
                }
                if (utf8_put(b, cp) < 0) return -1;
                continue;
            }
            default: return -1;
        }
        if (buf_put(b, &out, 1) < 0) return -1;
        i += 2;
    }
    return 0;
}

/* ------------------------------------------------------------------ columns */

static void col_clear_stage(Col *c) { c->has = 0; }

/* Stage a value of the current event for column c: the scanner is at the value. */
HOT int stage_value(Scanner *sc, Col *c) {
    skip_ws(sc);
    if (sc->p >= sc->end) { sc->err = "unexpected end"; return -1; }
    const char *v0 = sc->p;
    if (*sc->p == '"') {
        const char *s; Py_ssize_t n; int e;
        if (scan_string(sc, &s, &n, &e) < 0) return -1;
        c->has = 1; c->s = s; c->slen = n; c->s_escaped = e; c->s_raw = 0;
        return 0;
    }
    if (skip_value(sc) < 0) return -1;
    if (sc->p - v0 == 4 && memcmp(v0, "null", 4) == 0) { c->has = 0; return 0; }
    c->has = 1; c->s = v0; c->slen = sc->p - v0; c->s_escaped = 0; c->s_raw = 1;
    return 0;
}

/* Rows are written only when they hold a value: null rows cost nothing while scanning and are
 * filled in (zero values, cleared validity, repeated string offsets) on the next write or at
 * the end. Most args columns are null on most rows, so this is where the time goes. */
static const char VALID = 1; /* a validity byte */

HOT int grow_zeroed(Buf *b, Py_ssize_t len) {
    if (b->len >= len) return 0;
    if (buf_reserve(b, len - b->len) < 0) return -1;
    memset(b->data + b->len, 0, (size_t)(len - b->len));
    b->len = len;
    return 0;
}

HOT int fill_offsets(Col *c, Py_ssize_t rows) {
    /* offsets hold rows+1 entries; null rows repeat the current end */
    if (c->offsets.len == 0) {
        int64_t zero = 0;
        if (buf_put(&c->offsets, &zero, 8) < 0) return -1;
    }
    Py_ssize_t have = c->offsets.len / 8 - 1;
    if (have >= rows) return 0;
    if (buf_reserve(&c->offsets, (rows - have) * 8) < 0) return -1;
    int64_t end = (int64_t)c->values.len;
    int64_t *o = (int64_t *)(c->offsets.data + c->offsets.len);
    for (Py_ssize_t i = have; i < rows; i++) *o++ = end;
    c->offsets.len = (rows + 1) * 8;
    return 0;
}

/* ---- dictionaries */

HOT uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return h ^ (h >> 32);
}

static int dict_grow(Dict *d) {
    Py_ssize_t cap = d->cap ? d->cap * 2 : 1024;
    uint32_t *slots = calloc((size_t)cap, sizeof(uint32_t));
    uint64_t *hashes = malloc((size_t)cap * sizeof(uint64_t));
    if (!slots || !hashes) { free(slots); free(hashes); return -1; }
    for (Py_ssize_t i = 0; i < d->cap; i++) {
        if (!d->slots[i]) continue;
        size_t j = (size_t)(d->slot_hash[i] & (uint64_t)(cap - 1));
        while (slots[j]) j = (j + 1) & (size_t)(cap - 1);
        slots[j] = d->slots[i];
        hashes[j] = d->slot_hash[i];
    }
    free(d->slots); free(d->slot_hash);
    d->slots = slots; d->slot_hash = hashes; d->cap = cap;
    return 0;
}

/* The index of string s in d, added if new; -1 when out of memory. */
HOT int64_t dict_intern(Dict *d, const char *s, Py_ssize_t n) {
    if ((d->n + 1) * 2 > d->cap && dict_grow(d) < 0) return -1;
    if (d->n >= INT32_MAX) return -1;
    uint64_t h = hash_bytes(s, n);
    size_t mask = (size_t)(d->cap - 1), i = (size_t)(h & mask);
    const int64_t *o = (const int64_t *)d->offsets.data;
    for (;;) {
        uint32_t e = d->slots[i];
        if (!e) break;
        if (d->slot_hash[i] == h && o[e] - o[e - 1] == n
            && memcmp(d->data.data + o[e - 1], s, (size_t)n) == 0) return e - 1;
        i = (i + 1) & mask;
    }
    if (d->offsets.len == 0) {
        int64_t zero = 0;
        if (buf_put(&d->offsets, &zero, 8) < 0) return -1;
    }
    if (buf_put(&d->data, s, n) < 0) return -1;
    int64_t end = (int64_t)d->data.len;
    if (buf_put(&d->offsets, &end, 8) < 0) return -1;
    d->slots[i] = (uint32_t)++d->n;
    d->slot_hash[i] = h;
    return d->n - 1;
}

static void dict_free(Dict *d) {
    buf_free(&d->data); buf_free(&d->offsets); free(d->slots); free(d->slot_hash);
    memset(d, 0, sizeof(Dict));
}

/* ---- integers: (row, value) pairs, or dense once a column proves dense */

#define DENSE_CHECK_FROM 8192

static int to_dense(Col *c, Py_ssize_t rows) {
    Buf values = {0}, valid = {0};
    if (grow_zeroed(&values, rows * 8) < 0 || grow_zeroed(&valid, rows) < 0) {
        buf_free(&values); buf_free(&valid); return -1;
    }
    Py_ssize_t n = c->values.len / 8;
    const int64_t *v = (const int64_t *)c->values.data;
    const uint32_t *r = (const uint32_t *)c->offsets.data;
    for (Py_ssize_t i = 0; i < n; i++) {
        ((int64_t *)values.data)[r[i]] = v[i];
        valid.data[r[i]] = 1;
    }
    buf_free(&c->values); buf_free(&c->offsets);
    c->values = values; c->valid = valid; c->dense = 1;
    return 0;
}

HOT int set_int(Col *c, Py_ssize_t row, int64_t v) {
    c->any = 1;
    if (c->dense) { /* null rows before this one are zero-filled, this one appended */
        if (grow_zeroed(&c->values, row * 8) < 0 || grow_zeroed(&c->valid, row) < 0
            || buf_put(&c->values, &v, 8) < 0 || buf_put(&c->valid, &VALID, 1) < 0) return -1;
        return 0;
    }
    uint32_t r = (uint32_t)row;
    if (row > (Py_ssize_t)UINT32_MAX) return -2; /* > 4 G events: the general path */
    if (buf_put(&c->values, &v, 8) < 0 || buf_put(&c->offsets, &r, 4) < 0) return -1;
    Py_ssize_t n = c->values.len / 8;
    if (n >= DENSE_CHECK_FROM && (n & (n - 1)) == 0 && n * 8 >= row) return to_dense(c, row + 1);
    return 0;
}

/* ---- text */

HOT int set_str(Col *c, Py_ssize_t row) {
    if (c->is_dict) {
        const char *s = c->s;
        Py_ssize_t n = c->slen;
        if (c->s_escaped) {
            c->scratch.len = 0;
            if (put_unescaped(&c->scratch, s, n) < 0) return -2;
            s = c->scratch.data ? c->scratch.data : "";
            n = c->scratch.len;
        }
        int32_t code = (int32_t)dict_intern(&c->dict, s, n);
        if (code < 0 || grow_zeroed(&c->values, row * 4) < 0 || grow_zeroed(&c->valid, row) < 0
            || buf_put(&c->values, &code, 4) < 0 || buf_put(&c->valid, &VALID, 1) < 0) return -1;
        c->any = 1;
        return 0;
    }
    if (fill_offsets(c, row) < 0 || grow_zeroed(&c->valid, row) < 0
        || buf_put(&c->valid, &VALID, 1) < 0) return -1;
    if (c->s_escaped) {
        if (put_unescaped(&c->values, c->s, c->slen) < 0) return -2;
    } else if (buf_put(&c->values, c->s, c->slen) < 0) {
        return -1;
    }
    int64_t end = (int64_t)c->values.len;
    if (buf_put(&c->offsets, &end, 8) < 0) return -1;
    c->any = 1;
    return 0;
}

/* Fill the null rows at the end of a row-indexed column (not for sparse integers). */
static int finish_col(Col *c, Py_ssize_t rows) {
    if (!c->any || (!c->is_str && !c->dense)) return 0;
    if (grow_zeroed(&c->valid, rows) < 0) return -1;
    if (c->is_dict) return grow_zeroed(&c->values, rows * 4);
    if (c->is_str) return fill_offsets(c, rows);
    return grow_zeroed(&c->values, rows * 8);
}

/* Commit the staged value of column c for this row (strings, or integers). */
HOT int commit(Col *c, Py_ssize_t row) {
    if (!c->has) return 0;
    if (c->is_str) return set_str(c, row);
    int64_t v = 0;
    int valid = 0;
    if (!c->s_escaped) valid = parse_int_text(c->s, c->slen, &v);
    if (c->s_raw && c->slen == 4 && memcmp(c->s, "true", 4) == 0) { v = 1; valid = 1; }
    if (c->s_raw && c->slen == 5 && memcmp(c->s, "false", 5) == 0) { v = 0; valid = 1; }
    return valid ? set_int(c, row, v) : 0;
}

HOT int commit_time(Col *c, Py_ssize_t row) {
    if (!c->has) return 0;
    if (c->s_escaped) return -2;
    int64_t v = 0;
    int r = parse_us_to_ns(c->s, c->slen, &v);
    if (r < 0) return -2; /* exponent notation: general path */
    return r ? set_int(c, row, v) : 0;
}

/* pid/tid: an integer goes to the int column, anything else to the label column. */
HOT int commit_id(Col *ints, Col *labels, Py_ssize_t row) {
    if (!ints->has) return 0;
    int64_t v = 0;
    int is_int = ints->s_raw && parse_int_text(ints->s, ints->slen, &v);
    /* integral floats like 7.0 are labels in the Python path (type(v) is int fails) */
    if (is_int && memchr(ints->s, '.', (size_t)ints->slen)) is_int = 0;
    if (is_int) return set_int(ints, row, v);
    labels->has = 1;
    labels->s = ints->s; labels->slen = ints->slen;
    labels->s_escaped = ints->s_escaped; labels->s_raw = ints->s_raw;
    return set_str(labels, row);
}

/* At a member of an object: read its key and the ':' after it. */
HOT int read_key(Scanner *sc, const char **k, Py_ssize_t *kn, int *ke) {
    skip_ws(sc);
    if (sc->p >= sc->end || *sc->p != '"') { sc->err = "expected a key"; return -1; }
    if (scan_string(sc, k, kn, ke) < 0) return -1;
    skip_ws(sc);
    if (sc->p >= sc->end || *sc->p != ':') { sc->err = "expected ':'"; return -1; }
    sc->p++;
    return 0;
}

/* After a member's value: 1 when another member follows, 0 at the closing '}', -1 on error. */
HOT int next_member(Scanner *sc) {
    skip_ws(sc);
    if (sc->p >= sc->end) { sc->err = "unexpected end (truncated?)"; return -1; }
    if (*sc->p == ',') { sc->p++; return 1; }
    if (*sc->p == '}') { sc->p++; return 0; }
    sc->err = "expected ',' or '}'";
    return -1;
}

/* Scan the args object: keep its raw text, stage the known keys. */
/* `staged` lists the args columns given a value in this event, so that only those are
 * committed and cleared (most events carry a few of the 19 args columns). */
static int scan_args(Scanner *sc, Col *cols, int *prio, int *staged, int *n_staged) {
    skip_ws(sc);
    const char *a0 = sc->p;
    if (sc->p >= sc->end) { sc->err = "unexpected end"; return -1; }
    if (*sc->p != '{') {
        /* args that is not an object: keep the raw text only */
        if (skip_value(sc) < 0) return -1;
        if (!(sc->p - a0 == 4 && memcmp(a0, "null", 4) == 0)) {
            Col *c = &cols[C_ARGS];
            c->has = 1; c->s = a0; c->slen = sc->p - a0; c->s_escaped = 0; c->s_raw = 1;
        }
        return 0;
    }
    sc->p++;
    sc->level = 2; /* the args object's members: their containers start at level 3 */
    if (sc->deepest < 2) sc->deepest = 2;
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == '}') {
        sc->p++;
    } else {
        for (;;) {
            const char *k; Py_ssize_t kn; int ke;
            if (read_key(sc, &k, &kn, &ke) < 0) return -1;
            int matched = -1;
            if (!ke && kn < ARG_MAX_LEN && (unsigned char)k[0] < 128) {
                int j = ARG_BY_SHAPE[kn][(unsigned char)k[0]] - 1; /* the one candidate */
                if (j >= 0 && memcmp(k, ARG_KEYS[j].key, (size_t)kn) == 0) matched = j;
            }
            if (matched >= 0) {
                const ArgKey *ak = &ARG_KEYS[matched];
                Col *c = &cols[ak->col];
                if (!c->has || ak->priority <= prio[ak->col]) {
                    int had = c->has, saved_escaped = c->s_escaped, saved_raw = c->s_raw;
                    const char *saved_s = c->s;
                    Py_ssize_t saved_len = c->slen;
                    if (stage_value(sc, c) < 0) return -1;
                    if (c->has) {
                        prio[ak->col] = ak->priority;
                        if (!had) staged[(*n_staged)++] = ak->col;
                    } else if (had) { /* a null never hides the other spelling */
                        c->has = 1; c->s = saved_s; c->slen = saved_len;
                        c->s_escaped = saved_escaped; c->s_raw = saved_raw;
                    }
                } else if (skip_value(sc) < 0) {
                    return -1;
                }
            } else if (skip_value(sc) < 0) {
                return -1;
            }
            int more = next_member(sc);
            if (more < 0) return -1;
            if (!more) break;
        }
    }
    sc->level = 1;
    Col *c = &cols[C_ARGS];
    c->has = 1; c->s = a0; c->slen = sc->p - a0; c->s_escaped = 0; c->s_raw = 1;
    return 0;
}

/* Hand a block to Python without copying: (address, length, owner). The owner is a capsule
 * that frees the block when the last Arrow buffer viewing it goes away: free() for a malloc'd
 * block, munmap() of its `mapped` bytes for a mapping (see buf_reserve). */
static void free_block(PyObject *capsule) {
    free(PyCapsule_GetPointer(capsule, "traceview.block"));
}

static void unmap_block(PyObject *capsule) {
    munmap(PyCapsule_GetPointer(capsule, "traceview.map"),
           (size_t)(uintptr_t)PyCapsule_GetContext(capsule));
}

static PyObject *give_block(char *data, Py_ssize_t len, Py_ssize_t mapped) {
    if (!data) {
        data = malloc(1); /* an empty column still needs an address */
        if (!data) return PyErr_NoMemory();
    }
    PyObject *owner = mapped ? PyCapsule_New(data, "traceview.map", unmap_block)
                             : PyCapsule_New(data, "traceview.block", free_block);
    if (!owner) {
        if (mapped) munmap(data, (size_t)mapped);
        else free(data);
        return NULL;
    }
    if (mapped) PyCapsule_SetContext(owner, (void *)(uintptr_t)mapped); /* a valid capsule */
    return Py_BuildValue("(NnN)", PyLong_FromVoidPtr(data), len, owner);
}

static PyObject *give_buf(Buf *b) {
    PyObject *out = give_block(b->data, b->len, b->mapped ? b->cap : 0);
    memset(b, 0, sizeof(Buf));
    return out;
}

/* Pack one byte per row into an Arrow validity bitmap (LSB first). */
static char *pack_bitmap(const char *valid, Py_ssize_t rows) {
    Py_ssize_t nbytes = (rows + 7) / 8;
    unsigned char *bm = calloc((size_t)(nbytes ? nbytes : 1), 1);
    if (!bm) return NULL;
    Py_ssize_t i = 0;
    for (; i + 8 <= rows; i += 8) { /* eight 0/1 bytes at once: byte k lands in bit k */
        uint64_t w;
        memcpy(&w, valid + i, 8);
        bm[i >> 3] = (unsigned char)(((w & ONES) * 0x0102040810204080ULL) >> 56);
    }
    for (; i < rows; i++)
        if (valid[i]) bm[i >> 3] |= (unsigned char)(1u << (i & 7));
    return (char *)bm;
}

/* A column for Python: None (no values), ("int", values, bitmap), ("sparse", rows, values),
 * ("str", data, offsets, bitmap) or ("dict", indices, bitmap, data, offsets); each buffer an
 * (address, length, owner) triple. A column with a tail: ("chunks", head rows, head, tail),
 * head and tail each None, "int" or "str". */
static PyObject *chunk_to_py(Col *c, Py_ssize_t rows);

static PyObject *col_to_py(Col *c, Py_ssize_t rows) {
    if (!c->tail) return chunk_to_py(c, rows);
    Py_ssize_t head_rows = rows - c->tail_rows;
    PyObject *head = chunk_to_py(c, head_rows);
    if (!head) return NULL;
    PyObject *tail = chunk_to_py(c->tail, c->tail_rows);
    if (!tail) { Py_DECREF(head); return NULL; }
    return Py_BuildValue("(snNN)", "chunks", head_rows, head, tail);
}

static PyObject *chunk_to_py(Col *c, Py_ssize_t rows) {
    if (!c->any) Py_RETURN_NONE;
    if (!c->is_str && !c->dense) {
        if ((c->values.len / 8) * 8 < rows)
            return Py_BuildValue("(sNN)", "sparse", give_buf(&c->offsets), give_buf(&c->values));
        if (to_dense(c, rows) < 0) return PyErr_NoMemory();
    }
    if (finish_col(c, rows) < 0) return PyErr_NoMemory();
    char *bm = pack_bitmap(c->valid.data, rows);
    if (!bm) return PyErr_NoMemory();
    buf_free(&c->valid);
    PyObject *bitmap = give_block(bm, (rows + 7) / 8, 0);
    if (!c->is_str) return Py_BuildValue("(sNN)", "int", give_buf(&c->values), bitmap);
    if (c->is_dict) {
        if (c->dict.offsets.len == 0) {
            int64_t zero = 0;
            if (buf_put(&c->dict.offsets, &zero, 8) < 0) return PyErr_NoMemory();
        }
        return Py_BuildValue("(sNNNN)", "dict", give_buf(&c->values), bitmap,
                             give_buf(&c->dict.data), give_buf(&c->dict.offsets));
    }
    return Py_BuildValue("(sNNN)", "str", give_buf(&c->values), give_buf(&c->offsets), bitmap);
}

static void free_col(Col *c) {
    buf_free(&c->values);
    buf_free(&c->offsets);
    buf_free(&c->valid);
    buf_free(&c->scratch);
    dict_free(&c->dict);
    if (c->tail) {
        free_col(c->tail);
        free(c->tail);
        c->tail = NULL;
    }
}

static void free_cols(Col *cols) {
    for (int i = 0; i < N_COLS; i++) free_col(&cols[i]);
}

static int scan_elements_from(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end,
                              const char *stop, int after_element);

/* Scan a JSON array of event objects into the columns. 0 ok, -1 error (sc->err set). */
/* Scan array elements from the current position (an element, not '['). With `stop`, return 1
 * once the next element would start at or after it: the caller checks that this is exactly
 * `stop`, which proves `stop` is an element boundary. Without it, scan through the ']'. */
static int scan_elements(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end,
                         const char *stop) {
    sc->resume = sc->p;
    sc->resume_after = 0;
    return scan_elements_from(sc, cols, rows, begin_end, stop, 0);
}

/* scan_elements from an element (after_element 0) or from just after one (1: a ',' or the
 * ']' comes next). Keeps sc->resume at the last point where nothing is half read. */
static int scan_elements_from(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end,
                              const char *stop, int after_element) {
    for (;;) {
        if (after_element) goto after;
        skip_ws(sc);
        if (sc->p >= sc->end || *sc->p != '{') { sc->err = "element is not an object"; return -1; }
        const char *event_start = sc->p;
        sc->p++;
        sc->level = sc->deepest = 1;
        /* args columns were cleared when the previous event was committed; prio is read
         * only for a column staged in this event */
        for (int i = 0; i < A_EXTERNAL_ID; i++) col_clear_stage(&cols[i]);
        int prio[N_COLS];
        int staged[N_COLS], n_staged = 0;
        skip_ws(sc);
        if (sc->p < sc->end && *sc->p == '}') {
            sc->p++;
        } else {
            for (;;) {
                const char *k; Py_ssize_t kn; int ke;
                if (read_key(sc, &k, &kn, &ke) < 0) return -1;
                int target = -1;
                if (!ke) {
                    switch (kn) {
                        case 2:
                            if (KEY_IS(k, kn, "ph")) target = C_PH;
                            else if (KEY_IS(k, kn, "ts")) target = C_TS;
                            else if (KEY_IS(k, kn, "id")) target = C_ID;
                            break;
                        case 3:
                            if (KEY_IS(k, kn, "cat")) target = C_CAT;
                            else if (KEY_IS(k, kn, "pid")) target = C_PID;
                            else if (KEY_IS(k, kn, "tid")) target = C_TID;
                            else if (KEY_IS(k, kn, "dur")) target = C_DUR;
                            break;
                        case 4:
                            if (KEY_IS(k, kn, "name")) target = C_NAME;
                            else if (KEY_IS(k, kn, "args")) target = C_ARGS;
                            break;
                    }
                }
                int r;
                if (target == C_ARGS) {
                    for (int a = 0; a < n_staged; a++) cols[staged[a]].has = 0; /* a 2nd args */
                    n_staged = 0;
                    r = scan_args(sc, cols, prio, staged, &n_staged);
                } else if (target >= 0) {
                    r = stage_value(sc, &cols[target]);
                } else {
                    r = skip_value(sc);
                }
                if (r < 0) { return -1; }
                int more = next_member(sc);
                if (more < 0) return -1;
                if (!more) break;
            }
        }
        if (sc->p - event_start > sc->max_event_bytes || sc->deepest > sc->max_depth) {
            /* over a bound: counted (size first, as the pure path does), not stored */
            if (sc->p - event_start > sc->max_event_bytes) sc->too_large++;
            else sc->too_deep++;
            for (int a = 0; a < n_staged; a++) cols[staged[a]].has = 0;
            sc->resume = sc->p;
            sc->resume_after = 1;
            if (sc->release) release_behind(sc);
            goto after;
        }
        /* commit the event's row */
        Col *ph = &cols[C_PH];
        if (ph->has && ph->slen == 1 && (ph->s[0] == 'B' || ph->s[0] == 'E')) (*begin_end)++;
        int r = 0;
        r |= commit(&cols[C_PH], *rows) == 0 ? 0 : 1;
        r |= commit(&cols[C_CAT], *rows) == 0 ? 0 : 1;
        r |= commit(&cols[C_NAME], *rows) == 0 ? 0 : 1;
        r |= commit_id(&cols[C_PID], &cols[C_PID_LABEL], *rows) == 0 ? 0 : 1;
        r |= commit_id(&cols[C_TID], &cols[C_TID_LABEL], *rows) == 0 ? 0 : 1;
        r |= commit_time(&cols[C_TS], *rows) == 0 ? 0 : 1;
        r |= commit_time(&cols[C_DUR], *rows) == 0 ? 0 : 1;
        /* a quoted flow id is kept only when it parses as an integer, like the Python path */
        r |= commit(&cols[C_ID], *rows) == 0 ? 0 : 1;
        r |= commit(&cols[C_ARGS], *rows) == 0 ? 0 : 1;
        for (int a = 0; a < n_staged; a++) {
            r |= commit(&cols[staged[a]], *rows) == 0 ? 0 : 1;
            cols[staged[a]].has = 0;
        }
        if (r) { sc->err = "value needs the general path"; sc->broken = 1; return -1; }
        (*rows)++;
        sc->resume = sc->p;
        sc->resume_after = 1;
        if (sc->release) release_behind(sc);
    after:
        after_element = 0;
        skip_ws(sc);
        if (sc->p >= sc->end) { sc->err = "unexpected end (truncated?)"; return -1; }
        if (*sc->p == ',') {
            sc->p++;
            sc->resume = sc->p;
            sc->resume_after = 0;
            if (stop) {
                skip_ws(sc);
                if (sc->p >= stop) return 1;
            }
            continue;
        }
        if (*sc->p == ']') { sc->p++; return 0; }
        sc->err = "expected ',' or ']'"; return -1;
    }
}

/* Scan elements behind a producer until every byte is there: an element cut by the known end
 * is scanned again from its start once more bytes are published (nothing of it was committed;
 * its staged values are cleared). Returns like scan_elements without a stop, or 2 when the
 * bytes are all there before the array ends: the caller scans the rest (on two threads). */
static int follow_elements(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end) {
    int rc = scan_elements(sc, cols, rows, begin_end, NULL);
    while (rc < 0 && following(sc)) {
        const char *resume = sc->resume;
        int after = sc->resume_after;
        if (wait_for_bytes_from(sc, resume) < 0) return -1;
        for (int i = 0; i < N_COLS; i++) col_clear_stage(&cols[i]);
        sc->p = resume;
        sc->err = NULL;
        if (!following(sc)) {
            /* all there: finish with the plain path, from an element */
            if (after) {
                skip_ws(sc);
                if (sc->p < sc->end && *sc->p == ']') { sc->p++; return 0; }
                if (sc->p >= sc->end || *sc->p != ',') { sc->err = "expected ',' or ']'"; return -1; }
                sc->p++;
            }
            return 2;
        }
        sc->resume = resume;
        sc->resume_after = after;
        rc = scan_elements_from(sc, cols, rows, begin_end, NULL, after);
    }
    return rc;
}

/* Plain text and dense integers are not appended: src's rows become dst's tail, a chunk of
 * their own for Python. Copying them was ~0.09 s with one core idle after a 300 MB scan, and
 * ~140 MB of freshly faulted memory (docs/performance.md, log 22). Dictionary indices (their
 * codes must be mapped into dst's dictionary anyway) and (row, value) pairs are small: they
 * are appended. */
static int keeps_tail(const Col *dst, const Col *src) {
    return src->any && !dst->is_dict && (dst->is_str || dst->dense || src->dense);
}

/* Make src (src_rows rows) dst's tail; a half still in pairs turns dense first, so that both
 * chunks have one layout. */
static int set_tail(Col *dst, Py_ssize_t dst_rows, Col *src, Py_ssize_t src_rows) {
    if (!dst->is_str && !dst->dense && dst->any && to_dense(dst, dst_rows) < 0) return -1;
    if (!src->is_str && !src->dense && to_dense(src, src_rows) < 0) return -1;
    Col *tail = malloc(sizeof(Col));
    if (!tail) return -1;
    *tail = *src;
    memset(src, 0, sizeof(Col));
    dst->tail = tail;
    dst->tail_rows = src_rows;
    return 0;
}

/* Append src's rows after dst's (both columns of the same kind). */
static int append_col(Col *dst, Py_ssize_t dst_rows, Col *src, Py_ssize_t src_rows) {
    if (!src->any) return 0; /* the end-of-scan fill makes src's rows null in dst */
    if (!dst->is_str && !dst->dense && !src->dense) { /* pairs after pairs */
        Py_ssize_t n = src->values.len / 8;
        if (dst_rows + src_rows > (Py_ssize_t)UINT32_MAX) return -1;
        if (buf_put(&dst->values, src->values.data, src->values.len) < 0) return -1;
        if (buf_reserve(&dst->offsets, n * 4) < 0) return -1;
        const uint32_t *sr = (const uint32_t *)src->offsets.data;
        uint32_t *o = (uint32_t *)(dst->offsets.data + dst->offsets.len);
        for (Py_ssize_t i = 0; i < n; i++) *o++ = sr[i] + (uint32_t)dst_rows;
        dst->offsets.len += n * 4;
        dst->any = 1;
        return 0;
    }
    if (!dst->is_str && !dst->dense && to_dense(dst, dst_rows) < 0) return -1;
    if (!src->is_str && !src->dense && to_dense(src, src_rows) < 0) return -1;
    if (finish_col(src, src_rows) < 0) return -1;
    if (!dst->any) {
        dst->any = 1;
        if (grow_zeroed(&dst->valid, dst_rows) < 0) return -1;
        if (dst->is_dict ? grow_zeroed(&dst->values, dst_rows * 4) < 0
            : dst->is_str ? fill_offsets(dst, dst_rows) < 0
            : grow_zeroed(&dst->values, dst_rows * 8) < 0) return -1;
    } else if (finish_col(dst, dst_rows) < 0) {
        return -1;
    }
    if (buf_put(&dst->valid, src->valid.data, src_rows) < 0) return -1;
    if (!dst->is_str) return buf_put(&dst->values, src->values.data, src->values.len);
    if (dst->is_dict) {
        /* src's entries into dst's dictionary, then its indices through that map */
        Py_ssize_t n = src->dict.n;
        int32_t *map = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        if (!map) return -1;
        const int64_t *o = (const int64_t *)src->dict.offsets.data;
        for (Py_ssize_t j = 0; j < n; j++) {
            int64_t code = dict_intern(&dst->dict, src->dict.data.data + o[j], o[j + 1] - o[j]);
            if (code < 0) { free(map); return -1; }
            map[j] = (int32_t)code;
        }
        if (buf_reserve(&dst->values, src_rows * 4) < 0) { free(map); return -1; }
        const int32_t *si = (const int32_t *)src->values.data;
        int32_t *di = (int32_t *)(dst->values.data + dst->values.len);
        for (Py_ssize_t i = 0; i < src_rows; i++) di[i] = src->valid.data[i] ? map[si[i]] : 0;
        dst->values.len += src_rows * 4;
        free(map);
        return 0;
    }
    int64_t base = (int64_t)dst->values.len;
    if (buf_put(&dst->values, src->values.data, src->values.len) < 0) return -1;
    if (buf_reserve(&dst->offsets, src_rows * 8) < 0) return -1;
    const int64_t *so = (const int64_t *)src->offsets.data;
    int64_t *o = (int64_t *)(dst->offsets.data + dst->offsets.len);
    for (Py_ssize_t i = 1; i <= src_rows; i++) *o++ = so[i] + base;
    dst->offsets.len += src_rows * 8;
    return 0;
}

typedef struct {
    Scanner sc;
    Col cols[N_COLS];
    Py_ssize_t rows, begin_end;
    int rc;
} Half;

static void init_cols(Col *cols) {
    memset(cols, 0, sizeof(Col) * N_COLS);
    for (int i = 0; i < N_COLS; i++) {
        cols[i].name = COL_NAMES[i];
        cols[i].is_str = COL_IS_STR[i];
        cols[i].is_dict = COL_IS_DICT[i];
    }
}

/* rc = (call), with a landing in this thread for SIGBUS raised while it runs: then rc = -1
 * and sc->err says the file was cut short. Landings nest (the outer one is restored). */
#define LANDED(sc, rc, call)                          \
    do {                                              \
        sigjmp_buf landing_;                          \
        sigjmp_buf *outer_ = bus_landing;             \
        if (sigsetjmp(landing_, 1)) {                 \
            (sc)->err = CUT_SHORT;                    \
            (sc)->broken = 1;                         \
            (rc) = -1;                                \
        } else {                                      \
            bus_landing = &landing_;                  \
            (rc) = (call);                            \
        }                                             \
        bus_landing = outer_;                         \
    } while (0)

/* scan_elements, landed when the input is a mapped file: -1 (sc->err set) when the file was
 * cut short under the scan. The columns may then be half written; the caller frees them. */
static int guarded_elements(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end,
                            const char *stop) {
    if (!sc->mapped_file) return scan_elements(sc, cols, rows, begin_end, stop);
    int rc;
    LANDED(sc, rc, scan_elements(sc, cols, rows, begin_end, stop));
    return rc;
}

static void *scan_second_half(void *arg) {
    Half *h = (Half *)arg;
    h->rc = guarded_elements(&h->sc, h->cols, &h->rows, &h->begin_end, NULL);
    return NULL;
}

static void free_cols(Col *cols);

/* Below this many bytes a second thread costs more than it saves (scan()'s second argument
 * overrides it, so tests can force the two-thread path on small inputs). */
static Py_ssize_t parallel_min_bytes = 8 << 20;
static int used_threads = 1; /* reported back, so tests can see which path ran */

static inline int json_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* An event object's first key, right after the '{' at q: one of the keys Kineto writes
 * (it writes "ph" or "name" first; other writers keep whatever order they read). */
static int opens_event(const char *q, const char *end) {
    q++;
    while (q < end && json_space(*q)) q++;
    if (q >= end || *q != '"') return 0;
    const char *k = ++q;
    while (q < end && q - k <= 4 && *q != '"') q++;
    if (q >= end || *q != '"') return 0;
    Py_ssize_t kn = q - k;
    for (q++; q < end && json_space(*q); q++) {}
    if (q >= end || *q != ':') return 0;
    return KEY_IS(k, kn, "ph") || KEY_IS(k, kn, "name") || KEY_IS(k, kn, "cat") ||
           KEY_IS(k, kn, "pid") || KEY_IS(k, kn, "tid") || KEY_IS(k, kn, "ts") ||
           KEY_IS(k, kn, "dur") || KEY_IS(k, kn, "id") || KEY_IS(k, kn, "args") ||
           KEY_IS(k, kn, "s") || KEY_IS(k, kn, "bp");
}

/* How far past the middle a split point is looked for before the scan stays on one thread. */
#define SPLIT_SEARCH_BYTES (16 << 20)

/* A likely element start in the middle of the array: a '{' after '}' and ',' (spaces between).
 * With a newline among those spaces it is outside every string (JSON strings cannot hold a
 * raw newline), as in the profiler's own files; compact JSON (one line, as json.dumps or
 * orjson write it) needs the '{' to open with an event key. Only a hint either way: it is
 * proven by the first half landing on it exactly. */
static const char *split_hint(const char *from, const char *end) {
    if (end - from > SPLIT_SEARCH_BYTES) end = from + SPLIT_SEARCH_BYTES;
    for (const char *q = from; q < end; q++) {
        q = memchr(q, '{', (size_t)(end - q));
        if (!q) return NULL;
        const char *b = q;
        int newline = 0;
        while (b > from && json_space(b[-1])) newline |= *--b == '\n';
        if (b <= from || b[-1] != ',') continue;
        b--;
        while (b > from && json_space(b[-1])) newline |= *--b == '\n';
        if (b <= from || b[-1] != '}') continue;
        if (newline || opens_event(q, end)) return q;
    }
    return NULL;
}

static int scan_rest(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end);

/* Scan the event array at sc->p ('['), with two threads when it is large; behind a producer
 * (gzip inflating), one thread follows it and the rest is split once every byte is there. */
static int scan_array(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end) {
    if (sc->p >= sc->end || *sc->p != '[') { sc->err = "expected '['"; return -1; }
    sc->p++;
    sc->in_array = 1;
    skip_ws(sc);
    while (sc->p >= sc->end && following(sc)) {
        if (wait_for_bytes(sc) < 0) return -1;
        skip_ws(sc);
    }
    if (sc->p < sc->end && *sc->p == ']') { sc->p++; return 0; }
    sc->released = sc->p; /* only the array's pages are released: header values before it are
                           * read after the scan, from memory that may not fault back in */
    if (following(sc)) {
        int rc = follow_elements(sc, cols, rows, begin_end);
        if (rc != 2) return rc;
    }
    return scan_rest(sc, cols, rows, begin_end);
}

/* Scan the elements from sc->p (at an element) to the array's end, with two threads when the
 * rest is large. */
static int scan_rest(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end) {
    const char *hint = NULL;
    if (sc->end - sc->p > parallel_min_bytes)
        hint = split_hint(sc->p + (sc->end - sc->p) / 2, sc->end);
    if (!hint) return guarded_elements(sc, cols, rows, begin_end, NULL);
    Half *second = calloc(1, sizeof(Half));
    if (!second) return guarded_elements(sc, cols, rows, begin_end, NULL);
    init_cols(second->cols);
    second->sc = *sc;
    second->sc.p = hint;
    second->sc.released = hint;
    second->sc.err = NULL;
    second->sc.too_large = second->sc.too_deep = 0;
    pthread_t thread;
    int started = pthread_create(&thread, NULL, scan_second_half, second) == 0;
    if (!started) scan_second_half(second);
    int rc = guarded_elements(sc, cols, rows, begin_end, hint); /* the second thread is
                                                                 * joined whatever happens */
    if (started) pthread_join(thread, NULL);
    /* The halves join when both scanned cleanly, or when the second met damage with whole
     * rows only and the rows before damage are kept (keep_damaged): its error is the scan's. */
    int joins = rc == 1 && sc->p == hint
                && (second->rc == 0 || (sc->keep_damaged && !second->sc.broken));
    if (joins) {
        Py_ssize_t second_rows = second->rows, second_begin_end = second->begin_end;
        sc->too_large += second->sc.too_large;
        sc->too_deep += second->sc.too_deep;
        const char *second_end = second->sc.p;
        /* where the second half met damage, if it did (its state is freed below) */
        int second_rc = second->rc, second_resume_after = second->sc.resume_after;
        const char *second_err = second->sc.err, *second_resume = second->sc.resume;
        /* each half column freed once appended: they were all alive until the end, ~1/5
         * of the scan's peak memory */
        int merged = 1;
        for (int i = 0; i < N_COLS && merged; i++) {
            merged = (keeps_tail(&cols[i], &second->cols[i])
                      ? set_tail(&cols[i], *rows, &second->cols[i], second->rows)
                      : append_col(&cols[i], *rows, &second->cols[i], second->rows)) == 0;
            free_col(&second->cols[i]);
        }
        free_cols(second->cols);
        free(second);
        if (!merged) { /* columns half merged */
            sc->err = "out of memory";
            sc->broken = 1;
            return -1;
        }
        used_threads = 2;
        *rows += second_rows;
        *begin_end += second_begin_end;
        sc->p = second_end;
        if (second_rc < 0) {
            sc->err = second_err;
            sc->resume = second_resume;
            sc->resume_after = second_resume_after;
            return -1;
        }
        return 0;
    }
    free_cols(second->cols);
    free(second);
    if (rc < 0) return -1;
    if (rc == 1 && sc->p == hint) {
        /* the second half failed on its own: finish sequentially (it reports the error) */
        return guarded_elements(sc, cols, rows, begin_end, NULL);
    }
    /* the hint was not an element boundary: continue sequentially from where we are */
    return rc == 1 ? guarded_elements(sc, cols, rows, begin_end, NULL) : rc;
}

/* Top-level keys whose raw values are handed back for the caller to decode. */
static const char *HEADER_KEYS[] = {"distributedInfo", "deviceProperties", "baseTimeNanoseconds",
                                    "host_name", "nodes"};
#define N_HEADER_KEYS 5

/* Scan a Kineto document object: the event array in place, header values as raw spans. */
static int scan_document(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end,
                         const char **spans, Py_ssize_t *span_len, int *found) {
    sc->p++; /* '{' */
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == '}') { sc->p++; goto tail; }
    for (;;) {
        const char *k; Py_ssize_t kn; int ke;
        if (read_key(sc, &k, &kn, &ke) < 0) return -1;
        skip_ws(sc);
        if (!ke && KEY_IS(k, kn, "traceEvents") && sc->p < sc->end && *sc->p == '[') {
            if (*found) { sc->err = "two traceEvents arrays"; return -1; }
            if (scan_array(sc, cols, rows, begin_end) < 0 || wait_for_all(sc) < 0) return -1;
            *found = 1;
        } else {
            int h = -1;
            for (int j = 0; j < N_HEADER_KEYS && !ke; j++)
                if ((size_t)kn == strlen(HEADER_KEYS[j]) && memcmp(k, HEADER_KEYS[j], (size_t)kn) == 0) h = j;
            const char *v0 = sc->p;
            if (skip_value(sc) < 0) return -1;
            if (h >= 0) { spans[h] = v0; span_len[h] = sc->p - v0; }
        }
        int more = next_member(sc);
        if (more < 0) return -1;
        if (!more) break;
    }
tail:
    skip_ws(sc);
    if (sc->p != sc->end) { sc->err = "data after the document"; return -1; }
    return 0;
}

/* The whole document (object or bare array) from sc->start. */
static int scan_top(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end,
                    const char **spans, Py_ssize_t *span_len, int *found) {
    sc->p = sc->start;
    sc->err = NULL;
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == '[') {
        *found = 1;
        if (scan_array(sc, cols, rows, begin_end) < 0 || wait_for_all(sc) < 0) return -1;
        skip_ws(sc);
        if (sc->p != sc->end) { sc->err = "data after the document"; return -1; }
        return 0;
    }
    if (sc->p < sc->end && *sc->p == '{')
        return scan_document(sc, cols, rows, begin_end, spans, span_len, found);
    sc->err = "not a JSON object or array";
    return -1;
}

/* scan_top with a landing for SIGBUS (see guarded_elements), for the reads outside the
 * element scans: the header, and the document around the event array. */
static int guarded_top(Scanner *sc, Col *cols, Py_ssize_t *rows, Py_ssize_t *begin_end,
                       const char **spans, Py_ssize_t *span_len, int *found) {
    if (!sc->mapped_file) return scan_top(sc, cols, rows, begin_end, spans, span_len, found);
    int rc;
    LANDED(sc, rc, scan_top(sc, cols, rows, begin_end, spans, span_len, found));
    return rc;
}

/* scan(buffer, min_parallel, release, progress, follow_step, max_event_bytes, max_depth,
 *      mapped_file, keep_damaged)
 *   -> (rows, {column: see col_to_py,
 *              "begin_end_events": count of ph B/E, which the caller pairs,
 *              "too_large", "too_deep": events skipped for the bounds on one event,
 *              "header": {top-level key: raw JSON bytes}, "has_events": bool,
 *              "content_id": xxh3-128 hex of the buffer, or None,
 *              "damage": None, or with keep_damaged (message, byte, resume): the event array
 *                        broke at `byte`; the rows are every event before `resume`, where
 *                        the first element not read begins})
 * `buffer` is a whole Kineto document (object or bare array). `mapped_file`: the buffer is a
 * memory-mapped file, hashed beside the scan (its content id) and read with SIGBUS guarded.
 * Never set it for other memory: the hasher hands pages back as it goes, which a file mapping
 * faults in again from the file and anonymous memory (a bytes object) reads back as zeros.
 * `keep_damaged`: damage inside the event array (a file cut short, a bad element) keeps the
 * rows before it (see "damage"; not behind a producer). Raises ValueError("problem at byte
 * N") on anything else the tolerant path should handle. */
static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view, progress = {0};
    Py_ssize_t min_parallel = 8 << 20;
    int release = 0;
    PyObject *progress_obj = Py_None;
    Py_ssize_t step = FOLLOW_STEP;
    Py_ssize_t max_event_bytes = PY_SSIZE_T_MAX;
    int max_depth = INT_MAX;
    int mapped_file = 0;
    int keep_damaged = 0;
    if (!PyArg_ParseTuple(args, "y*|npOnnipp", &view, &min_parallel, &release, &progress_obj,
                          &step, &max_event_bytes, &max_depth, &mapped_file, &keep_damaged))
        return NULL;

    if (progress_obj != Py_None) {
        if (PyObject_GetBuffer(progress_obj, &progress, PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (progress.len < 16 || ((uintptr_t)progress.buf & 7)) {
            PyBuffer_Release(&progress);
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "progress must be 16 aligned, writable bytes");
            return NULL;
        }
    }
    parallel_min_bytes = min_parallel;
    used_threads = 1;
    Col cols[N_COLS];
    init_cols(cols);
    Scanner sc = {(const char *)view.buf, (const char *)view.buf + view.len,
                  (const char *)view.buf, NULL, release, (const char *)view.buf};
    sc.real_end = sc.end;
    sc.follow_step = step > 0 ? step : 1;
    sc.max_event_bytes = max_event_bytes;
    sc.max_depth = max_depth;
    sc.mapped_file = mapped_file && !progress.buf;
    sc.keep_damaged = keep_damaged && !progress.buf; /* behind a producer, the end is its */
    Hasher hasher = {(const char *)view.buf, view.len};
    pthread_t hashing;
    int hashed = 0;
    if (sc.mapped_file) {
        guard_mapped_reads();
        hashed = pthread_create(&hashing, NULL, hash_mapped, &hasher) == 0;
    }
    Py_ssize_t rows = 0, begin_end = 0;
    int rc = 0;
    const char *spans[N_HEADER_KEYS] = {NULL};
    Py_ssize_t span_len[N_HEADER_KEYS] = {0};
    int found = 0;
    Py_BEGIN_ALLOW_THREADS
    if (progress.buf) { /* follow the producer from its first bytes */
        sc.progress = (int64_t *)progress.buf;
        sc.end = sc.start;
        rc = wait_for_bytes(&sc);
    }
    while (rc == 0) {
        rc = guarded_top(&sc, cols, &rows, &begin_end, spans, span_len, &found);
        /* cut before the event array by the known end: nothing committed, start again */
        if (rc == 0 || sc.in_array || !following(&sc)) break;
        found = 0;
        memset(spans, 0, sizeof(spans));
        rc = wait_for_bytes_from(&sc, sc.start);
    }
    if (rc == 0) rc = wait_for_verdict(&sc);
    if (hashed) pthread_join(hashing, NULL);
    if (sc.mapped_file) unguard_mapped_reads();
    Py_END_ALLOW_THREADS
    if (progress.buf) PyBuffer_Release(&progress);
    /* damage inside the event array, with whole rows behind it: they are kept */
    PyObject *damage = NULL;
    if (rc < 0 && sc.keep_damaged && sc.in_array && !sc.broken && sc.resume) {
        damage = Py_BuildValue("(snn)", sc.err ? sc.err : "error", sc.p - sc.start,
                               sc.resume - sc.start);
        if (!damage) { free_cols(cols); PyBuffer_Release(&view); return NULL; }
        for (int i = 0; i < N_COLS; i++) col_clear_stage(&cols[i]);
        found = 1;
        rc = 0;
    }
    if (rc < 0) {
        Py_ssize_t pos = sc.p - sc.start;
        free_cols(cols);
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "%s at byte %zd", sc.err ? sc.err : "error", pos);
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (!out || PyDict_SetItemString(out, "damage", damage ? damage : Py_None) < 0) {
        Py_XDECREF(out); Py_XDECREF(damage); free_cols(cols); PyBuffer_Release(&view);
        return NULL;
    }
    Py_XDECREF(damage);
    for (int i = 0; i < N_COLS; i++) {
        PyObject *v = col_to_py(&cols[i], rows);
        if (!v || PyDict_SetItemString(out, COL_NAMES[i], v) < 0) {
            Py_XDECREF(v); Py_DECREF(out); free_cols(cols); PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(v);
    }
    free_cols(cols);
    PyBuffer_Release(&view);
    PyObject *header = PyDict_New();
    if (!header || PyDict_SetItemString(out, "header", header) < 0) {
        Py_XDECREF(header); Py_DECREF(out); return NULL;
    }
    Py_DECREF(header);
    for (int j = 0; j < N_HEADER_KEYS; j++) {
        if (!spans[j]) continue;
        PyObject *raw = PyBytes_FromStringAndSize(spans[j], span_len[j]);
        if (!raw || PyDict_SetItemString(header, HEADER_KEYS[j], raw) < 0) {
            Py_XDECREF(raw); Py_DECREF(out); return NULL;
        }
        Py_DECREF(raw);
    }
    PyObject *content_id = Py_None;
    Py_INCREF(Py_None);
    if (hasher.ok) {
        static const char HEX[] = "0123456789abcdef";
        char hex[2 * sizeof(hasher.digest.digest)];
        for (size_t i = 0; i < sizeof(hasher.digest.digest); i++) {
            hex[2 * i] = HEX[hasher.digest.digest[i] >> 4];
            hex[2 * i + 1] = HEX[hasher.digest.digest[i] & 15];
        }
        Py_DECREF(Py_None);
        content_id = PyUnicode_FromStringAndSize(hex, (Py_ssize_t)sizeof(hex));
    }
    if (!content_id || PyDict_SetItemString(out, "content_id", content_id) < 0) {
        Py_XDECREF(content_id); Py_DECREF(out); return NULL;
    }
    Py_DECREF(content_id);
    PyObject *has_events = PyBool_FromLong(found);
    PyDict_SetItemString(out, "has_events", has_events);
    Py_DECREF(has_events);
    PyObject *waits = PyLong_FromSsize_t(sc.waits);
    if (!waits || PyDict_SetItemString(out, "follow_waits", waits) < 0) {
        Py_XDECREF(waits); Py_DECREF(out); return NULL;
    }
    Py_DECREF(waits);
    PyObject *threads = PyLong_FromLong(used_threads);
    if (!threads || PyDict_SetItemString(out, "threads", threads) < 0) {
        Py_XDECREF(threads); Py_DECREF(out); return NULL;
    }
    Py_DECREF(threads);
    PyObject *too_large = PyLong_FromSsize_t(sc.too_large);
    if (!too_large || PyDict_SetItemString(out, "too_large", too_large) < 0) {
        Py_XDECREF(too_large); Py_DECREF(out); return NULL;
    }
    Py_DECREF(too_large);
    PyObject *too_deep = PyLong_FromSsize_t(sc.too_deep);
    if (!too_deep || PyDict_SetItemString(out, "too_deep", too_deep) < 0) {
        Py_XDECREF(too_deep); Py_DECREF(out); return NULL;
    }
    Py_DECREF(too_deep);
    PyObject *be = PyLong_FromSsize_t(begin_end);
    if (!be || PyDict_SetItemString(out, "begin_end_events", be) < 0) {
        Py_XDECREF(be); Py_DECREF(out); return NULL;
    }
    Py_DECREF(be);
    return Py_BuildValue("(nN)", rows, out);
}

/* publish(progress, count, state): the producer's side of scan()'s progress (see Scanner). */
static PyObject *publish(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer progress;
    long long count, state;
    if (!PyArg_ParseTuple(args, "w*LL", &progress, &count, &state)) return NULL;
    if (progress.len < 16 || ((uintptr_t)progress.buf & 7)) {
        PyBuffer_Release(&progress);
        PyErr_SetString(PyExc_ValueError, "progress must be 16 aligned, writable bytes");
        return NULL;
    }
    int64_t *p = (int64_t *)progress.buf;
    __atomic_store_n(&p[0], (int64_t)count, __ATOMIC_RELEASE);
    __atomic_store_n(&p[1], (int64_t)state, __ATOMIC_RELEASE);
    PyBuffer_Release(&progress);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buffer, min_parallel_bytes=8 MiB, release=False, progress=None, follow_step=256 KiB, "
     "max_event_bytes=unbounded, max_depth=unbounded, mapped_file=False, keep_damaged=False) "
     "-> (rows, columns); "
     "an event over either bound is skipped and counted (columns' too_large, too_deep); "
     "release only for a memory map: scanned pages are dropped from memory as the scan goes; "
     "progress: 16 writable bytes through which a producer filling `buffer` in another thread "
     "says how far it got (see publish)"},
    {"publish", publish, METH_VARARGS,
     "publish(progress, count, state): count bytes of the buffer are in; state 0 producing, "
     "1 done (every byte in and checked), -1 failed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) {
    for (int j = 0; j < N_ARG_KEYS; j++) {
        ARG_KEY_LEN[j] = (Py_ssize_t)strlen(ARG_KEYS[j].key);
        if (ARG_KEY_LEN[j] >= ARG_MAX_LEN
            || ARG_BY_SHAPE[ARG_KEY_LEN[j]][(unsigned char)ARG_KEYS[j].key[0]]) {
            PyErr_SetString(PyExc_RuntimeError, "args keys share a (length, first byte)");
            return NULL;
        }
        ARG_BY_SHAPE[ARG_KEY_LEN[j]][(unsigned char)ARG_KEYS[j].key[0]] = (signed char)(j + 1);
    }
    for (const char *c = "\"{}[]NI"; *c; c++) SKIP_STOP[(unsigned char)*c] = 1;
    for (const char *c = ",}] \n\r\t"; *c; c++) SCALAR_END[(unsigned char)*c] = 1;
    PyObject *m = PyModule_Create(&module);
    /* the producer's states (see publish), for Python producers to name */
    if (m && (PyModule_AddIntConstant(m, "PRODUCING", PRODUCING) < 0
              || PyModule_AddIntConstant(m, "DONE", DONE) < 0
              || PyModule_AddIntConstant(m, "FAILED", FAILED) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
