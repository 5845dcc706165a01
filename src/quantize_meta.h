/* quantize_meta.h - GGUF metadata for pxq quantize's output (quantize_meta.c). */
#ifndef PXQ_QUANTIZE_META_H
#define PXQ_QUANTIZE_META_H

#include <stddef.h>
#include <stdint.h>

struct gguf_writer;
struct pxq_hparams;

/* general.* (architecture, type, name from the directory's base name, quantization_version 2,
 * file_type = llama.cpp's LLAMA_FTYPE), the architecture's hyperparameters under "{arch}." and,
 * when model_dir has a tokenizer.json, tokenizer.ggml.* and tokenizer.chat_template, with the key
 * names and values llama.cpp's convert_hf_to_gguf.py writes. 0, or -1 with a message (a tokenizer
 * that is not BPE, a malformed merge). */
int quantize_put_meta(struct gguf_writer *w, const struct pxq_hparams *hp, const char *model_dir, uint32_t file_type,
                      char *err, size_t errlen);

#endif
