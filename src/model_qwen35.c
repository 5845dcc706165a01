/* model_qwen35.c - binding of Qwen3.5 hybrid layers (Gated DeltaNet + gated attention).
 * Not implemented yet: loading a qwen35 model fails with a clear message. */
#include "model.h"

int model_bind_qwen35_layer(struct pxq_layer *L, const struct pxq_hparams *hp, int il,
                            const struct pxq_tensor *(*lookup)(void *ctx, int il, const char *suffix, int required,
                                                               int64_t ne0, int64_t ne1, int64_t ne2),
                            void *ctx) {
    (void)L; (void)hp; (void)il; (void)lookup; (void)ctx;
    return -1;
}
