/*
 * thinking_signature.h - the opaque `signature` of Anthropic thinking blocks.
 *
 * Anthropic clients send a turn's thinking blocks back with the signature
 * the server gave them, and some drop or rewrite the thinking text when the
 * signature is empty (Claude Code asks for `display: "omitted"` and then
 * sends the block back with no text), which changes the rendered prompt and
 * so loses prefix reuse. Our signature carries the reasoning itself, so it
 * needs no server memory and survives restarts:
 *
 *     "ds4t1." + base64(reasoning) + "." + 16 hex digits of
 *     SHA-256("ds4 thinking\n" + reasoning)
 *
 * The digest lets the server tell its own signatures from other servers'
 * (and from damaged ones); it is a check, not a secret: a client can send
 * any reasoning text anyway.
 */
#ifndef DS4_SERVER_THINKING_SIGNATURE_H
#define DS4_SERVER_THINKING_SIGNATURE_H

#include <stddef.h>

/* The signature of `reasoning` (n bytes). malloc'd, NULL on no memory. */
char *thinking_signature_make(const char *reasoning, size_t n);

/* The reasoning a signature carries, when it is one of ours and intact:
 * malloc'd NUL-terminated text (length in *n). NULL otherwise. */
char *thinking_signature_open(const char *sig, size_t *n);

#endif
