/* A BPE tokenizer in compact tables (bpe.h): the same merges in the same order as the Rust
 * tokenizer's BPE model (lowest rank first, then leftmost; a queued merge applies only while
 * its pair still makes the same token), so the ids are the same. */
#include "bpe.h"

#include <stdlib.h>
#include <string.h>

enum { BYTE_LEVEL = 0, SENTENCEPIECE = 1 };
enum { OTHER = 0, LETTER = 1, NUMBER = 2, SPACE = 3 };
enum { SPECIAL = 1, RAW_BYTE = 2 };

typedef struct { int32_t left, right, rank, merged; } merge_slot; /* left -1: empty */
typedef struct { int32_t rank, pos, merged; } queued;
typedef struct { int32_t id, prev, next, gone; } symbol;

typedef struct {
    int32_t mode, split, digits, ignore_merges, n_tokens, unk_id, fuse_unk, n_ranges, trie_size;
    uint8_t *blob, *pieces, *flags;
    uint32_t *offsets, *piece_offsets, *ranges;
    int32_t byte_ids[256];
    merge_slot *merges;
    uint64_t merge_cap;
    int32_t *vocab; /* ids by their bytes' hash, -1 empty */
    uint64_t vocab_cap;
    /* added tokens' trie: node 0 the root; children as first-child / next-sibling lists */
    int32_t *child, *sibling, *token;
    uint8_t *edge;
    uint8_t starts[256]; /* bytes an added token starts with */
    uint8_t byte_text[256][3]; /* GPT-2's printable character of each byte, as UTF-8 */
} bpe_model;

static uint64_t hash_bytes(const uint8_t *s, int64_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (int64_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

static uint64_t hash_pair(int32_t a, int32_t b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    h ^= h >> 33; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

static uint64_t slot_of(uint64_t h, uint64_t cap) { /* h into [0, cap) */
    return (uint64_t)(((unsigned __int128)h * cap) >> 64);
}

static const merge_slot *find_merge(const bpe_model *m, int32_t a, int32_t b) {
    uint64_t i = slot_of(hash_pair(a, b), m->merge_cap);
    for (;;) {
        const merge_slot *s = &m->merges[i];
        if (s->left < 0) return NULL;
        if (s->left == a && s->right == b) return s;
        if (++i == m->merge_cap) i = 0;
    }
}

int32_t ferry_bpe_token_id(const void *model, const uint8_t *text, int64_t len) {
    const bpe_model *m = model;
    uint64_t i = slot_of(hash_bytes(text, len), m->vocab_cap);
    for (;;) {
        int32_t id = m->vocab[i];
        if (id < 0) return -1;
        if ((int64_t)(m->offsets[id + 1] - m->offsets[id]) == len &&
            memcmp(m->blob + m->offsets[id], text, (size_t)len) == 0)
            return id;
        if (++i == m->vocab_cap) i = 0;
    }
}

static void *copy_of(const void *src, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p && bytes) memcpy(p, src, bytes);
    return p;
}

static int build_trie(bpe_model *m, int32_t n_added, const int32_t *added) {
    int64_t nodes = 1;
    for (int32_t k = 0; k < n_added; k++) nodes += m->offsets[added[k] + 1] - m->offsets[added[k]];
    m->child = malloc(sizeof(int32_t) * nodes);
    m->sibling = malloc(sizeof(int32_t) * nodes);
    m->token = malloc(sizeof(int32_t) * nodes);
    m->edge = malloc(nodes);
    if (!m->child || !m->sibling || !m->token || !m->edge) return 0;
    m->child[0] = m->sibling[0] = m->token[0] = -1;
    m->edge[0] = 0;
    m->trie_size = 1;
    memset(m->starts, 0, sizeof m->starts);
    for (int32_t k = 0; k < n_added; k++) {
        int32_t id = added[k], node = 0;
        const uint8_t *s = m->blob + m->offsets[id];
        int64_t n = m->offsets[id + 1] - m->offsets[id];
        if (n == 0) continue;
        m->starts[s[0]] = 1;
        for (int64_t i = 0; i < n; i++) {
            int32_t c = m->child[node];
            while (c >= 0 && m->edge[c] != s[i]) c = m->sibling[c];
            if (c < 0) {
                c = m->trie_size++;
                m->edge[c] = s[i];
                m->child[c] = -1;
                m->token[c] = -1;
                m->sibling[c] = m->child[node];
                m->child[node] = c;
            }
            node = c;
        }
        if (m->token[node] < 0) m->token[node] = id; /* the first of equal contents */
    }
    return 1;
}

void *ferry_bpe_new(int32_t mode, int32_t split, int32_t digits, int32_t ignore_merges,
                    int32_t n_tokens, const uint8_t *blob,
                    const uint32_t *offsets, const uint8_t *pieces,
                    const uint32_t *piece_offsets, const uint8_t *flags, int32_t n_merges,
                    const int32_t *merges, const int32_t *byte_ids, int32_t unk_id,
                    int32_t fuse_unk, int32_t n_added, const int32_t *added,
                    int32_t n_ranges, const uint32_t *ranges) {
    bpe_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->mode = mode; m->split = split; m->digits = digits; m->ignore_merges = ignore_merges;
    m->n_tokens = n_tokens; m->unk_id = unk_id; m->fuse_unk = fuse_unk;
    for (int b = 0, extra = 0; b < 256; b++) { /* GPT-2's bytes_to_unicode */
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        uint32_t c = printable ? (uint32_t)b : 256u + (uint32_t)extra++;
        if (c < 0x80) { m->byte_text[b][0] = 1; m->byte_text[b][1] = (uint8_t)c; }
        else { m->byte_text[b][0] = 2; m->byte_text[b][1] = (uint8_t)(0xC0 | (c >> 6));
               m->byte_text[b][2] = (uint8_t)(0x80 | (c & 0x3F)); }
    }
    m->n_ranges = n_ranges;
    memcpy(m->byte_ids, byte_ids, sizeof m->byte_ids);
    m->offsets = copy_of(offsets, sizeof(uint32_t) * ((size_t)n_tokens + 1));
    m->piece_offsets = copy_of(piece_offsets, sizeof(uint32_t) * ((size_t)n_tokens + 1));
    m->flags = copy_of(flags, (size_t)n_tokens);
    m->ranges = copy_of(ranges, sizeof(uint32_t) * 3 * (size_t)n_ranges);
    if (!m->offsets || !m->piece_offsets || !m->flags || !m->ranges) goto fail;
    m->blob = copy_of(blob, offsets[n_tokens]);
    m->pieces = copy_of(pieces, piece_offsets[n_tokens]);
    /* tables at most ~70% full: a lookup probes a slot or two */
    m->merge_cap = (uint64_t)n_merges * 10 / 7 + 1;
    m->merges = malloc(sizeof(merge_slot) * m->merge_cap);
    m->vocab_cap = (uint64_t)n_tokens * 10 / 7 + 1;
    m->vocab = malloc(sizeof(int32_t) * m->vocab_cap);
    if (!m->blob || !m->pieces || !m->merges || !m->vocab) goto fail;
    memset(m->merges, 0xff, sizeof(merge_slot) * m->merge_cap);
    memset(m->vocab, 0xff, sizeof(int32_t) * m->vocab_cap);
    for (int32_t r = 0; r < n_merges; r++) {
        int32_t a = merges[3 * r], b = merges[3 * r + 1];
        uint64_t i = slot_of(hash_pair(a, b), m->merge_cap);
        while (m->merges[i].left >= 0 && !(m->merges[i].left == a && m->merges[i].right == b))
            if (++i == m->merge_cap) i = 0;
        if (m->merges[i].left >= 0) continue; /* a repeated pair keeps its first rank */
        m->merges[i] = (merge_slot){a, b, r, merges[3 * r + 2]};
    }
    for (int32_t id = 0; id < n_tokens; id++) {
        const uint8_t *s = m->blob + m->offsets[id];
        int64_t n = m->offsets[id + 1] - m->offsets[id];
        uint64_t i = slot_of(hash_bytes(s, n), m->vocab_cap);
        int dup = 0;
        while (m->vocab[i] >= 0) {
            int32_t o = m->vocab[i];
            if ((int64_t)(m->offsets[o + 1] - m->offsets[o]) == n &&
                memcmp(m->blob + m->offsets[o], s, (size_t)n) == 0) { dup = 1; break; }
            if (++i == m->vocab_cap) i = 0;
        }
        if (!dup) m->vocab[i] = id;
    }
    if (!build_trie(m, n_added, added)) goto fail;
    return m;
fail:
    ferry_bpe_free(m);
    return NULL;
}

void ferry_bpe_free(void *model) {
    bpe_model *m = model;
    if (!m) return;
    free(m->blob); free(m->pieces); free(m->flags); free(m->offsets); free(m->piece_offsets);
    free(m->ranges); free(m->merges); free(m->vocab);
    free(m->child); free(m->sibling); free(m->token); free(m->edge);
    free(m);
}

/* the code point at s (n > 0 bytes of valid UTF-8) and its length */
static int next_char(const uint8_t *s, int64_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80 || n < 2) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (c < 0xF0 || n < 4) {
        if (n < 3) { *cp = c; return 1; }
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

static int is_white_space(uint32_t c) { /* Unicode's White_Space property */
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static int class_of(const bpe_model *m, uint32_t c) {
    if (is_white_space(c)) return SPACE;
    int32_t lo = 0, hi = m->n_ranges - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        const uint32_t *r = m->ranges + 3 * mid;
        if (c < r[0]) hi = mid - 1;
        else if (c > r[1]) lo = mid + 1;
        else return (int)r[2];
    }
    return OTHER;
}

static int64_t char_class_at(const bpe_model *m, const uint8_t *s, int64_t n, int64_t i,
                             int *cls) {
    uint32_t cp;
    int l = next_char(s + i, n - i, &cp);
    *cls = class_of(m, cp);
    return l;
}

/* the end of GPT-2's pre-tokenizer match at i: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 * ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int64_t gpt2_word_end(const bpe_model *m, const uint8_t *s, int64_t n, int64_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        uint8_t a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n && ((a == 'r' && s[i + 2] == 'e') || (a == 'v' && s[i + 2] == 'e') ||
                          (a == 'l' && s[i + 2] == 'l')))
            return i + 3;
    }
    int cls;
    int64_t k = (s[i] == ' ' && i + 1 < n) ? i + 1 : i;
    int64_t l = char_class_at(m, s, n, k, &cls);
    if (cls == SPACE && k != i) { k = i; l = char_class_at(m, s, n, k, &cls); }
    if (cls != SPACE) {
        int run = cls, c;
        int64_t j = k + l;
        while (j < n) {
            int64_t cl = char_class_at(m, s, n, j, &c);
            if (c != run) break;
            j += cl;
        }
        return j;
    }
    int64_t j = i, last = i;
    while (j < n) {
        int c;
        int64_t cl = char_class_at(m, s, n, j, &c);
        if (c != SPACE) break;
        last = j;
        j += cl;
    }
    if (j == n || last == i) return j;
    return last; /* the last space goes with the word after it */
}

static int64_t run_end(const bpe_model *m, const uint8_t *s, int64_t n, int64_t j, int run) {
    while (j < n) {
        int c;
        int64_t l = char_class_at(m, s, n, j, &c);
        if (c != run) break;
        j += l;
    }
    return j;
}

static uint32_t fold_case(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    return c == 0x17F ? 's' : c; /* LATIN SMALL LETTER LONG S folds to s */
}

static int is_line_end(uint8_t c) { return c == '\r' || c == '\n'; }

/* the end of Llama 3's (digits 3) or Qwen2's (digits 1) pre-tokenizer match at i:
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
 * ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static int64_t llama3_word_end(const bpe_model *m, const uint8_t *s, int64_t n, int64_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        uint32_t a, b;
        int la = next_char(s + i + 1, n - i - 1, &a);
        a = fold_case(a);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 1 + la;
        if (i + 1 + la < n) {
            int lb = next_char(s + i + 1 + la, n - i - 1 - la, &b);
            b = fold_case(b);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
                return i + 1 + la + lb;
        }
    }
    int c0, c1;
    int64_t l0 = char_class_at(m, s, n, i, &c0);
    if (c0 == LETTER) return run_end(m, s, n, i, LETTER);
    if (c0 != NUMBER && !is_line_end(s[i]) && i + l0 < n) {
        char_class_at(m, s, n, i + l0, &c1);
        if (c1 == LETTER) return run_end(m, s, n, i + l0, LETTER);
    }
    if (c0 == NUMBER) {
        int64_t j = i;
        for (int k = 0; k < m->digits && j < n; k++) {
            int c;
            int64_t l = char_class_at(m, s, n, j, &c);
            if (c != NUMBER) break;
            j += l;
        }
        return j;
    }
    int64_t k = i;
    if (s[i] == ' ' && i + 1 < n) {
        char_class_at(m, s, n, i + 1, &c1);
        if (c1 == OTHER) k = i + 1;
    }
    int ck;
    char_class_at(m, s, n, k, &ck);
    if (ck == OTHER) {
        int64_t j = run_end(m, s, n, k, OTHER);
        while (j < n && is_line_end(s[j])) j++;
        return j;
    }
    int64_t j = i, last = i, line_end = -1; /* s[i] is a space here */
    while (j < n) {
        int c;
        int64_t l = char_class_at(m, s, n, j, &c);
        if (c != SPACE) break;
        if (is_line_end(s[j])) line_end = j;
        last = j;
        j += l;
    }
    if (line_end >= 0) return line_end + 1; /* \s*[\r\n]+ */
    if (j == n || last == i) return j;
    return last;
}

typedef struct {
    symbol *syms;
    queued *heap;
    int64_t heap_n;
    uint8_t *text; /* a word as the vocabulary spells it (ignore_merges) */
} work;

static int before(queued a, queued b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void push(work *w, queued q) {
    int64_t i = w->heap_n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!before(q, w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = q;
}

static queued pop(work *w) {
    queued top = w->heap[0], last = w->heap[--w->heap_n];
    int64_t i = 0, n = w->heap_n;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && before(w->heap[c + 1], w->heap[c])) c++;
        if (!before(w->heap[c], last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

static void queue_pair(const bpe_model *m, work *w, int32_t pos) {
    const symbol *a = &w->syms[pos];
    if (a->next < 0) return;
    const merge_slot *s = find_merge(m, a->id, w->syms[a->next].id);
    if (s) push(w, (queued){s->rank, pos, s->merged});
}

/* merges n symbols (w->syms, linked in order) and appends the ids left to out */
static int64_t merge_word(const bpe_model *m, work *w, int64_t n, int32_t *out) {
    w->heap_n = 0;
    for (int64_t i = 0; i + 1 < n; i++) queue_pair(m, w, (int32_t)i);
    while (w->heap_n > 0) {
        queued top = pop(w);
        symbol *a = &w->syms[top.pos];
        if (a->gone || a->next < 0) continue;
        symbol *b = &w->syms[a->next];
        const merge_slot *s = find_merge(m, a->id, b->id);
        if (!s || s->merged != top.merged) continue;
        a->id = top.merged;
        b->gone = 1;
        a->next = b->next;
        if (b->next >= 0) w->syms[b->next].prev = top.pos;
        if (a->prev >= 0) queue_pair(m, w, a->prev);
        queue_pair(m, w, top.pos);
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (!w->syms[i].gone) out[k++] = w->syms[i].id;
    return k;
}

static void add_symbol(work *w, int64_t *n, int32_t id) {
    w->syms[*n] = (symbol){id, (int32_t)*n - 1, -1, 0};
    if (*n > 0) w->syms[*n - 1].next = (int32_t)*n;
    (*n)++;
}

/* a first symbol: a token, or (id -1) the unknown token where there is one (consecutive
 * ones fused into one where the model says so), else nothing, as the Rust BPE drops it */
static void add_first(const bpe_model *m, work *w, int64_t *n, int32_t id, int *last_unk) {
    if (id >= 0) {
        add_symbol(w, n, id);
        *last_unk = 0;
    } else if (m->unk_id >= 0 && !(m->fuse_unk && *last_unk)) {
        add_symbol(w, n, m->unk_id);
        *last_unk = 1;
    }
}

static int64_t encode_segment(const bpe_model *m, work *w, const uint8_t *s, int64_t len,
                              int32_t *out) {
    int64_t k = 0;
    if (m->mode == BYTE_LEVEL) {
        for (int64_t i = 0; i < len;) {
            int64_t end = m->split ? llama3_word_end(m, s, len, i) : gpt2_word_end(m, s, len, i);
            int64_t n = 0;
            if (m->ignore_merges) { /* a word that is a token is that token, unmerged */
                int64_t t = 0;
                for (int64_t j = i; j < end; j++)
                    for (int b = 1; b <= m->byte_text[s[j]][0]; b++)
                        w->text[t++] = m->byte_text[s[j]][b];
                int32_t whole = ferry_bpe_token_id(m, w->text, t);
                if (whole >= 0) {
                    out[k++] = whole;
                    i = end;
                    continue;
                }
            }
            int last_unk = 0;
            for (int64_t j = i; j < end; j++) add_first(m, w, &n, m->byte_ids[s[j]], &last_unk);
            k += merge_word(m, w, n, out + k);
            i = end;
        }
        return k;
    }
    static const uint8_t space_mark[3] = {0xE2, 0x96, 0x81}; /* U+2581 */
    int64_t n = 0;
    int last_unk = 0;
    for (int64_t i = 0; i < len;) {
        uint32_t cp;
        int l = next_char(s + i, len - i, &cp);
        const uint8_t *c = s[i] == ' ' ? space_mark : s + i; /* the normalized character */
        int cl = s[i] == ' ' ? 3 : l;
        int32_t id = ferry_bpe_token_id(m, c, cl);
        int all = 1;
        for (int j = 0; j < cl; j++) all &= m->byte_ids[c[j]] >= 0;
        if (id < 0 && all)
            for (int j = 0; j < cl; j++) add_first(m, w, &n, m->byte_ids[c[j]], &last_unk);
        else
            add_first(m, w, &n, id, &last_unk);
        i += l;
    }
    return merge_word(m, w, n, out);
}

int64_t ferry_bpe_encode(const void *model, const uint8_t *text, int64_t len, int32_t *out) {
    const bpe_model *m = model;
    work w;
    w.syms = malloc(sizeof(symbol) * (size_t)(len + 1));
    w.heap = malloc(sizeof(queued) * (size_t)(3 * len + 4));
    w.text = m->ignore_merges ? malloc((size_t)(2 * len + 1)) : NULL;
    if (!w.syms || !w.heap || (m->ignore_merges && !w.text)) {
        free(w.syms); free(w.heap); free(w.text);
        return -1;
    }
    int64_t k = 0, start = 0;
    for (int64_t i = 0; i < len;) {
        int32_t found = -1;
        int64_t found_len = 0;
        if (m->starts[text[i]]) { /* the longest added token at i */
            int32_t node = 0;
            for (int64_t j = i; j < len; j++) {
                int32_t c = m->child[node];
                while (c >= 0 && m->edge[c] != text[j]) c = m->sibling[c];
                if (c < 0) break;
                node = c;
                if (m->token[node] >= 0) { found = m->token[node]; found_len = j - i + 1; }
            }
        }
        if (found < 0) { i++; continue; }
        k += encode_segment(m, &w, text + start, i - start, out + k);
        out[k++] = found;
        i += found_len;
        start = i;
    }
    k += encode_segment(m, &w, text + start, len - start, out + k);
    free(w.syms);
    free(w.heap);
    free(w.text);
    return k;
}

int64_t ferry_bpe_token(const void *model, int32_t id, uint8_t *out, int64_t cap) {
    const bpe_model *m = model;
    if (id < 0 || id >= m->n_tokens) return -1;
    int64_t n = m->offsets[id + 1] - m->offsets[id];
    memcpy(out, m->blob + m->offsets[id], (size_t)(n < cap ? n : cap));
    return n;
}

/* whether s holds valid UTF-8 (Rust's String::from_utf8) */
static int valid_utf8(const uint8_t *s, int64_t n) {
    for (int64_t i = 0; i < n;) {
        uint8_t c = s[i];
        int l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (int j = 1; j < l; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        if (l == 3) {
            if (c == 0xE0 && s[i + 1] < 0xA0) return 0; /* overlong */
            if (c == 0xED && s[i + 1] >= 0xA0) return 0; /* a surrogate */
        }
        if (l == 4) {
            if (c == 0xF0 && s[i + 1] < 0x90) return 0;
            if (c == 0xF4 && s[i + 1] >= 0x90) return 0;
        }
        i += l;
    }
    return 1;
}

static void put(uint8_t *out, int64_t cap, int64_t *k, const uint8_t *s, int64_t n) {
    if (*k < cap) memcpy(out + *k, s, (size_t)(*k + n <= cap ? n : cap - *k));
    *k += n;
}

/* the end of a run of byte-fallback tokens written raw at out[start ..]: kept where they are
 * UTF-8, else U+FFFD for each byte (the Rust tokenizer's ByteFallback); past cap, the room
 * the worst case needs */
static void end_run(uint8_t *out, int64_t cap, int64_t *k, int64_t start, int64_t n) {
    static const uint8_t replacement[3] = {0xEF, 0xBF, 0xBD};
    if (start + n > cap) { *k = start + 3 * n; return; }
    if (valid_utf8(out + start, n)) { *k = start + n; return; }
    *k = start;
    for (int64_t i = 0; i < n; i++) put(out, cap, k, replacement, 3);
}

int64_t ferry_bpe_decode(const void *model, const int32_t *ids, int64_t n, int32_t skip_special,
                         uint8_t *out, int64_t cap) {
    const bpe_model *m = model;
    int64_t k = 0, run_n = 0, run_start = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= m->n_tokens) continue; /* as the Rust tokenizer: no text */
        if (skip_special && (m->flags[id] & SPECIAL)) continue;
        const uint8_t *p = m->pieces + m->piece_offsets[id];
        int64_t pn = m->piece_offsets[id + 1] - m->piece_offsets[id];
        if (m->flags[id] & RAW_BYTE) {
            if (run_n == 0) run_start = k;
            put(out, cap, &k, p, pn);
            run_n += pn;
            continue;
        }
        if (run_n) end_run(out, cap, &k, run_start, run_n);
        run_n = 0;
        put(out, cap, &k, p, pn);
    }
    if (run_n) end_run(out, cap, &k, run_start, run_n);
    return k;
}
