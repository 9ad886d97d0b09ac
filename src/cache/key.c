/* Cache keys: SHA-256 (OpenSSL's libcrypto) over named components. */
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "cache/cache.h"
#include "core/core.h"

void cache_hash(const void *data, size_t n, cache_key *out)
{
    unsigned int size = CACHE_KEY_BYTES;
    if (!EVP_Digest(data, n, out->bytes, &size, EVP_sha256(), NULL))
        KILN_ASSERT(!"SHA-256 is available");
}

void cache_key_of(const cache_component *c, int n, cache_key *key, cache_key *hashes)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    KILN_ASSERT(ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL));
    for (int i = 0; i < n; i++) {
        cache_key own;
        cache_hash(c[i].text, strlen(c[i].text), &own);
        if (hashes)
            hashes[i] = own;
        char line[128 + CACHE_HEX_CHARS], hex[CACHE_HEX_CHARS + 1];
        cache_key_hex(&own, hex);
        int len = snprintf(line, sizeof line, "%s=%s\n", c[i].name, hex);
        EVP_DigestUpdate(ctx, line, (size_t)len);
    }
    unsigned int size = CACHE_KEY_BYTES;
    EVP_DigestFinal_ex(ctx, key->bytes, &size);
    EVP_MD_CTX_free(ctx);
}

void cache_key_hex(const cache_key *k, char *hex)
{
    for (int i = 0; i < CACHE_KEY_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", k->bytes[i]);
}

bool cache_key_parse(const char *s, cache_key *k)
{
    for (int i = 0; i < CACHE_KEY_BYTES; i++) {
        unsigned byte;
        char digits[3] = {s[2 * i], s[2 * i] ? s[2 * i + 1] : '\0', '\0'};
        if (!strchr("0123456789abcdef", digits[0]) || !digits[0] || !digits[1] ||
            !strchr("0123456789abcdef", digits[1]) || sscanf(digits, "%2x", &byte) != 1)
            return false;
        k->bytes[i] = (uint8_t)byte;
    }
    return s[CACHE_HEX_CHARS] == '\0';
}
