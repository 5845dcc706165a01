/* fuzz_safetensors.c - libFuzzer target for the safetensors reader (st_open_buffer).
 * Any accepted file must have every tensor inside the buffer with nbytes = elements * size, and a
 * first-row dequantize must run clean under ASan/UBSan. A rejected file must come with a message.
 * Build: make fuzz; run: build-fuzz/fuzz/fuzz_safetensors fuzz/corpus-work/safetensors
 * -dict=fuzz/safetensors.dict -max_total_time=180 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "safetensors.h"

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256] = "";
    struct st_model *m = st_open_buffer(data, size, "fuzz.safetensors", err, sizeof err);
    if (!m) {
        if (!err[0]) abort();
        return 0;
    }
    for (int i = 0; i < st_n_tensors(m); i++) {
        const struct pxq_tensor *t = st_tensor(m, i);
        if (st_find_tensor(m, t->name) != t) abort();
        const uint8_t *p = t->data;
        if (p < data || t->nbytes > size || p + t->nbytes > data + size) abort();
        if ((size_t)tensor_nelements(t) * type_block_bytes(t->type) != t->nbytes) abort();
        if (!t->nbytes) continue;
        sink += p[0] + p[t->nbytes - 1];
        int64_t ne0 = t->ne[0];
        if (ne0 <= 4096) {
            float *row = malloc((size_t)ne0 * sizeof *row);
            dequantize_row(t->type, t->data, row, ne0);
            sink += row[0] + dot_row_f32(t->type, t->data, row, ne0);
            free(row);
        }
    }
    st_close(m);
    return 0;
}
