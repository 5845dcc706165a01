/* cmd_tokenize.c - `pxq tokenize -m PATH TEXT`: print the ids as a JSON array. PATH may be a model
 * (GGUF or HF dir) or a directory holding only a tokenizer (tokenizer.json). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "tokenizer.h"
#include "util.h"

int cmd_tokenize(int argc, char **argv) {
    struct args a = {argc, argv, 0, "tokenize", cmd_tokenize};
    const char *path = NULL, *text = NULL, *file = NULL;
    int no_special = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) path = arg_str(&a);
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) file = arg_str(&a);
        else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) text = arg_str(&a);
        else if (!strcmp(f, "--no-parse-special")) no_special = 1;
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("usage: pxq tokenize [-m PATH] [--no-parse-special] (TEXT | -p TEXT | -f FILE)\n"
                   "  prints the token ids of the text as a JSON array\n"
                   "  -m, --model PATH        GGUF file, HF model directory, or a directory with only a\n"
                   "                          tokenizer.json (default: the bundled tiny model)\n"
                   "  -p, --prompt TEXT       the text (or give it as the argument)\n"
                   "  -f, --file FILE         read the text from FILE\n"
                   "  --no-parse-special      special-token strings such as <|im_start|> are tokenized as\n"
                   "                          plain text\n");
            return 0;
        } else if (f[0] == '-' && f[1]) fail_unknown(&a);
        else if (!text) text = f;
        else fail(&a, 2, "more than one text argument");
    }
    char err[512] = "";
    char *buf = NULL;
    size_t len = 0;
    if (file) {
        if (is_dir(file)) fail(&a, 1, "%s: is a directory, not a text file", file);
        buf = read_file(file, 256u << 20, &len, err, sizeof err);
        if (!buf) fail(&a, 1, "%s", err);
        text = buf;
    } else if (text) {
        len = strlen(text);
    } else {
        fail(&a, 2, "no text given");
    }
    const int given = path != NULL;
    if (!path) path = default_model_path();
    struct pxq_tokenizer *tok = NULL;
    struct pxq_model *m = NULL;
    char cfg[4096];
    if (is_dir(path) && (path_join(cfg, sizeof cfg, path, "config.json") != 0 || !file_exists(cfg))) {
        tok = tokenizer_load_hf(path, err, sizeof err); /* tokenizer-only directory */
        if (!tok) fail(&a, 1, "%s", err);
    } else {
        m = open_model_or_fail(&a, given ? path : NULL); /* NULL: the default model, with its hint */
        tok = model_tokenizer(m);
        if (!tok) fail(&a, 1, "%s has no tokenizer", path);
    }
    int32_t *ids = NULL;
    int n = 0;
    if (tokenizer_encode(tok, text, len, !no_special, &ids, &n) != 0) fail(&a, 1, "%s", TOKENIZER_ENCODE_FAILED);
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    printf("]\n");
    free(ids);
    free(buf);
    if (m) model_free(m);
    else tokenizer_free(tok);
    return 0;
}
