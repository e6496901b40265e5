/* Writing new tokens' K/V into the paged pool. */
#include "kernels.h"

/* One layer of the pool is [pages, 2, kv_heads, page_size, dim]: token t's kv rows
 * [2, kv_heads, dim] (row_stride elements apart, in dt) go to slot slots[t], converted to
 * pool_dt (rounded to nearest even, as torch's .to()) when the two differ. */
void ferry_store_kv(const void *kv, int64_t row_stride, const int64_t *slots, int64_t tokens,
                    void *pool, int kv_heads, int page_size, int dim, int dt, int pool_dt) {
    size_t es = ferry_elem(dt), pes = ferry_elem(pool_dt);
    for (int64_t t = 0; t < tokens; t++) {
        int64_t page = slots[t] / page_size, off = slots[t] % page_size;
        const char *src = (const char *)kv + (size_t)t * row_stride * es;
        for (int c = 0; c < 2; c++)
            for (int hd = 0; hd < kv_heads; hd++) {
                size_t block = ((size_t)page * 2 + c) * kv_heads + hd;
                char *dst = (char *)pool + (block * page_size + off) * dim * pes;
                const char *row = src + ((size_t)c * kv_heads + hd) * dim * es;
                if (dt == pool_dt) {
                    memcpy(dst, row, (size_t)dim * es);
                } else if (dt == FERRY_F32) {
                    ferry_store_row(dst, pool_dt, (const float *)row, dim);
                } else { /* 16-bit to another width: through float32 (exact widening) */
                    for (int i = 0; i < dim; i++) {
                        float f;
                        ferry_load_row(row + (size_t)i * es, dt, &f, 1);
                        ferry_store_row(dst + (size_t)i * pes, pool_dt, &f, 1);
                    }
                }
            }
    }
}
