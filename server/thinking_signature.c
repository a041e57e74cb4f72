/*
 * thinking_signature.c - see the header for the format and why.
 */
#include "server/thinking_signature.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "ds4t1."
#define DIGEST_HEX 16

static void digest_hex(const char *s, size_t n, char out[DIGEST_HEX + 1])
{
    static const char tag[] = "ds4 thinking\n";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int ml = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1 ||
        EVP_DigestUpdate(c, tag, sizeof tag - 1) != 1 || EVP_DigestUpdate(c, s, n) != 1 ||
        EVP_DigestFinal_ex(c, md, &ml) != 1 || ml < DIGEST_HEX / 2)
        memset(md, 0, sizeof md); /* a digest nothing matches: "not ours" */
    EVP_MD_CTX_free(c);
    for (int i = 0; i < DIGEST_HEX / 2; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

char *thinking_signature_make(const char *reasoning, size_t n)
{
    if (n > (size_t)1 << 30) return NULL;
    size_t b64 = 4 * ((n + 2) / 3);
    size_t len = strlen(PREFIX) + b64 + 1 + DIGEST_HEX;
    char *out = malloc(len + 1);
    if (!out) return NULL;
    memcpy(out, PREFIX, strlen(PREFIX));
    EVP_EncodeBlock((unsigned char *)out + strlen(PREFIX), (const unsigned char *)reasoning, (int)n);
    out[strlen(PREFIX) + b64] = '.';
    digest_hex(reasoning, n, out + strlen(PREFIX) + b64 + 1);
    out[len] = 0;
    return out;
}

char *thinking_signature_open(const char *sig, size_t *n)
{
    size_t pl = strlen(PREFIX);
    if (!sig || strncmp(sig, PREFIX, pl)) return NULL;
    const char *b = sig + pl;
    const char *dot = strrchr(b, '.');
    if (!dot || strlen(dot + 1) != DIGEST_HEX) return NULL;
    size_t bl = (size_t)(dot - b);
    if (bl % 4) return NULL;
    char *txt = malloc(bl / 4 * 3 + 1);
    if (!txt) return NULL;
    int dl = bl ? EVP_DecodeBlock((unsigned char *)txt, (const unsigned char *)b, (int)bl) : 0;
    if (dl < 0) { free(txt); return NULL; }
    /* EVP_DecodeBlock counts the bytes '=' padding stands for */
    size_t len = (size_t)dl;
    if (bl >= 1 && b[bl - 1] == '=') len--;
    if (bl >= 2 && b[bl - 2] == '=') len--;
    txt[len] = 0;
    char want[DIGEST_HEX + 1];
    digest_hex(txt, len, want);
    if (memcmp(want, dot + 1, DIGEST_HEX) || strlen(txt) != len) { free(txt); return NULL; }
    *n = len;
    return txt;
}
