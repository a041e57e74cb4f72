/*
 * convert_tokenizer.h - the tokenizer.ggml.* metadata of a DeepSeek V4 GGUF.
 *
 * From a Hugging Face tokenizer.json (byte-level BPE): tokens by id (base
 * vocab, then added tokens over them), token types (1 normal; added tokens
 * 3 control when HF-special or looking special, "<｜...｜>" / "<|...|>",
 * else 4 user-defined; ids nobody names become "[PAD<id>]" type 5 unused),
 * merges as "left right", bos/eos/padding ids and add_bos/add_eos from a
 * tokenizer_config.json next to it (else the config's bos/eos, padding =
 * eos, no automatic BOS/EOS), model "gpt2", pre "joyai-llm" (the name
 * llama.cpp gives the DeepSeek V3/V4 pre-tokenizer, as the published files
 * carry). This reproduces the keys of tests/data/tokenizer/dsv4-vocab.gguf.
 *
 * From a GGUF (e.g. that vocab-only file): every tokenizer.* key is copied.
 */
#ifndef DS4_TOOLS_CONVERT_TOKENIZER_H
#define DS4_TOOLS_CONVERT_TOKENIZER_H

#include "gguf/gguf.h"
#include "tools/convert_config.h"

/* path ends in .gguf -> copy; otherwise tokenizer.json. The vocabulary
 * must not be larger than cfg->n_vocab. */
ds4_status convert_tokenizer_add(ds4_gguf_writer *w, const char *path, const convert_config *cfg);

#endif
