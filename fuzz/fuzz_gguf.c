/* fuzz_gguf.c - libFuzzer target for the GGUF reader (gguf_open_buffer) and its accessors.
 * Any accepted file must have every tensor inside the buffer; every accessor and a first-row
 * dequantize/dot of each supported tensor must run clean under ASan/UBSan. A rejected file must
 * come with a message. Build: make fuzz; run: build-fuzz/fuzz/fuzz_gguf fuzz/corpus-work/gguf
 * -dict=fuzz/gguf.dict -max_total_time=180 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256] = "";
    struct gguf_file *g = gguf_open_buffer(data, size, "fuzz.gguf", err, sizeof err);
    if (!g) {
        if (!err[0]) abort(); /* every failure names its reason */
        return 0;
    }
    char buf[512];
    for (int i = 0; i < gguf_n_kv(g); i++) {
        const char *key = gguf_kv_key(g, i);
        if (gguf_find_key(g, key) != i) abort();
        gguf_kv_to_string(g, i, buf, sizeof buf);
        gguf_kv_to_string(g, i, buf, 7);
        gguf_kv_to_string(g, i, buf, 1);
        uint32_t u;
        int64_t v;
        float f;
        int b;
        gguf_get_u32(g, key, &u);
        gguf_get_i64(g, key, &v);
        gguf_get_f32(g, key, &f);
        gguf_get_bool(g, key, &b);
        const char *s = gguf_get_str(g, key);
        if (s) sink += (float)strlen(s);
        int64_t n = gguf_arr_len(g, key);
        if (n > 0) {
            gguf_arr_type(g, key);
            int64_t idx[3] = {0, n / 2, n - 1};
            for (int k = 0; k < 3; k++) {
                size_t len;
                const char *e = gguf_arr_str(g, key, idx[k], &len);
                if (e && (len > size || (const uint8_t *)e < data || (const uint8_t *)e + len > data + size)) abort();
                gguf_arr_i64(g, key, idx[k], &v);
                gguf_arr_f32(g, key, idx[k], &f);
            }
        }
    }
    gguf_arch(g);
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct pxq_tensor *t = gguf_tensor(g, i);
        if (gguf_find_tensor(g, t->name) != t) abort();
        const uint8_t *p = t->data;
        if (p < data || t->nbytes > size || p + t->nbytes > data + size) abort();
        if (t->nbytes) sink += p[0] + p[t->nbytes - 1];
        int64_t ne0 = t->ne[0];
        if (type_supported(t->type) && ne0 <= 4096 && type_row_bytes(t->type, ne0) <= t->nbytes) {
            float *row = malloc((size_t)ne0 * sizeof *row), *x = malloc((size_t)ne0 * sizeof *x);
            for (int64_t k = 0; k < ne0; k++) x[k] = 1.0f;
            dequantize_row(t->type, t->data, row, ne0);
            sink += row[0] + dot_row_f32(t->type, t->data, x, ne0);
            free(row);
            free(x);
        }
    }
    gguf_close(g);
    return 0;
}
