/* Cache keys: SHA-256 over named components, from Nettle (GnuTLS's crypto
 * library). OpenSSL's libcrypto was measured first: its first digest in a
 * process loads configuration and providers for 1.5 ms, a third of the
 * budget of a disk hit; Nettle's costs microseconds. */
#include <stdio.h>
#include <string.h>

#include <nettle/sha2.h>

#include "cache/cache.h"

void cache_hash(const void *data, size_t n, cache_key *out)
{
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, n, data);
    sha256_digest(&ctx, CACHE_KEY_BYTES, out->bytes);
}

void cache_key_of(const cache_component *c, int n, cache_key *key, cache_key *hashes)
{
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    for (int i = 0; i < n; i++) {
        cache_key own;
        cache_hash(c[i].text, strlen(c[i].text), &own);
        if (hashes)
            hashes[i] = own;
        char line[128 + CACHE_HEX_CHARS], hex[CACHE_HEX_CHARS + 1];
        cache_key_hex(&own, hex);
        int len = snprintf(line, sizeof line, "%s=%s\n", c[i].name, hex);
        sha256_update(&ctx, (size_t)len, (const uint8_t *)line);
    }
    sha256_digest(&ctx, CACHE_KEY_BYTES, key->bytes);
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
