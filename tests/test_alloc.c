/* The CPU allocator's cache of freed large blocks (src/core/alloc.c): bounded,
 * and when full it drops the blocks freed longest ago, not the new one; its
 * per-thread lists of small blocks serve any size of a block's class and
 * keep a bounded number.
 * Links the core module statically to see the cache. With the cache off
 * (KILN_CPU_CACHE_BYTES=0, as under valgrind, or AddressSanitizer) there is
 * nothing to check. */
#include "test_common.h"

#include "core/core.h"

START_TEST(test_full_cache_keeps_the_newest_blocks)
{
    int64_t limit = core_alloc_cache_limit();
    if (limit < (64 << 20))
        return;
    /* Mapped, never touched: these cost address space, not memory. */
    size_t old_size = (size_t)limit / 4, new_size = (size_t)limit * 3 / 10;
    void *old = core_alloc(old_size), *blocks[4];
    ck_assert_ptr_nonnull(old);
    core_free(old, old_size);
    for (int i = 0; i < 4; i++)
        ck_assert_ptr_nonnull(blocks[i] = core_alloc(new_size));
    for (int i = 0; i < 4; i++)
        core_free(blocks[i], new_size);
    int64_t cached = core_alloc_cached_bytes();
    ck_assert_msg(cached <= limit && cached >= 3 * (int64_t)new_size, "%lld bytes cached of %lld",
                  (long long)cached, (long long)limit);
    void *again = core_alloc(new_size);
    ck_assert_msg(again == blocks[3], "the last block freed was not kept");
    core_free(again, new_size);
}
END_TEST

START_TEST(test_blocks_larger_than_the_cache_are_not_kept)
{
    int64_t limit = core_alloc_cache_limit();
    if (limit < (64 << 20))
        return;
    int64_t before = core_alloc_cached_bytes();
    size_t size = (size_t)limit + (4 << 20);
    void *p = core_alloc(size);
    ck_assert_ptr_nonnull(p);
    core_free(p, size);
    ck_assert_int_eq(core_alloc_cached_bytes(), before);
}
END_TEST

START_TEST(test_a_small_block_serves_its_whole_class)
{
    if (core_alloc_cache_limit() == 0)
        return;
    unsigned char *p = core_alloc(65);
    ck_assert_ptr_nonnull(p);
    core_free(p, 65);
    unsigned char *q = core_alloc(128); /* the same 64-byte class: the block kept is reused */
    ck_assert_ptr_eq(q, p);
    memset(q, 0xa5, 128); /* and holds the class's largest size */
    core_free(q, 128);
    void *other = core_alloc(129);
    ck_assert_ptr_ne(other, p);
    core_free(other, 129);
}
END_TEST

START_TEST(test_a_thread_keeps_few_small_blocks)
{
    if (core_alloc_cache_limit() == 0)
        return;
    enum { N = 1000 };
    static void *blocks[N];
    for (int i = 0; i < N; i++)
        ck_assert_ptr_nonnull(blocks[i] = core_alloc(300));
    for (int i = 0; i < N; i++)
        core_free(blocks[i], 300);
    int kept = core_alloc_small_kept(300);
    ck_assert_msg(kept > 0 && kept <= 64, "%d blocks of 300 bytes kept after freeing %d", kept, N);
}
END_TEST

static Suite *alloc_suite(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("cache");
    tcase_add_test(tc, test_full_cache_keeps_the_newest_blocks);
    tcase_add_test(tc, test_blocks_larger_than_the_cache_are_not_kept);
    tcase_add_test(tc, test_a_small_block_serves_its_whole_class);
    tcase_add_test(tc, test_a_thread_keeps_few_small_blocks);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(alloc_suite)
