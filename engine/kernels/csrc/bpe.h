/* bpe.c: a byte-pair-encoding tokenizer held in compact tables, for the tokenizer folders
 * engine/execution/text/compact_bpe.py checks against the Rust tokenizer. The Rust tokenizer
 * keeps every token as a string in two maps and every merge in a third (about 100 MB for a
 * 262k vocabulary); these tables hold the same in about a fifth of that.
 *
 * Tokens are byte strings: blob[offsets[i] .. offsets[i + 1]] is token i as the vocabulary
 * spells it (its id's text), pieces[piece_offsets[i] ..] what decoding writes for it. */
#ifndef FERRY_BPE_H
#define FERRY_BPE_H

#include <stdint.h>

/* mode 0: byte-level (the text split into words, each word's bytes the first symbols; split
 * 0 GPT-2's pre-tokenizer, 1 Llama 3's with `digits` 3 or Qwen2's with 1; ignore_merges: a
 * word that is a token is that token); mode 1: SentencePiece-style (spaces as U+2581, the
 * whole text one word, each character a first symbol, a character outside the vocabulary as
 * its bytes' tokens).
 * merges: (left, right, merged) id triples in rank order. byte_ids: each byte's token (mode
 * 0) or its <0xXX> token (mode 1), -1 where none. added: ids matched in the text before
 * anything else, longest first. ranges: (first, last, class) code point triples, sorted,
 * class 1 a letter, 2 a number. flags per token: 1 special (skipped on request), 2 one raw
 * byte of a character (mode 1's byte fallback). Returns NULL when out of memory. */
void *ferry_bpe_new(int32_t mode, int32_t split, int32_t digits, int32_t ignore_merges,
                    int32_t n_tokens, const uint8_t *blob,
                    const uint32_t *offsets, const uint8_t *pieces,
                    const uint32_t *piece_offsets, const uint8_t *flags, int32_t n_merges,
                    const int32_t *merges, const int32_t *byte_ids, int32_t unk_id,
                    int32_t fuse_unk, int32_t n_added, const int32_t *added,
                    int32_t n_ranges, const uint32_t *ranges);
void ferry_bpe_free(void *model);
/* the ids of text (len bytes of UTF-8) into out (room for len ids); their count, or -1 when
 * out of memory */
int64_t ferry_bpe_encode(const void *model, const uint8_t *text, int64_t len, int32_t *out);
/* the id whose token is these bytes, or -1 */
int32_t ferry_bpe_token_id(const void *model, const uint8_t *text, int64_t len);
/* token id's text into out (up to cap bytes); its length, -1 for no such id */
int64_t ferry_bpe_token(const void *model, int32_t id, uint8_t *out, int64_t cap);
/* the decoded UTF-8 of ids into out (up to cap bytes): its length, or the length needed
 * where that is over cap (nothing written past cap) */
int64_t ferry_bpe_decode(const void *model, const int32_t *ids, int64_t n, int32_t skip_special,
                         uint8_t *out, int64_t cap);

#endif
