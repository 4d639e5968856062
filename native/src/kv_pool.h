// kv_pool.h — attention KV memory shared by the sequences of a batch (batch.cpp): fixed-size pages
// from one pool, a page table per sequence, pages of a finished sequence reused by the next.
//
// In this form a page is one attention layer's K (or V) for a whole sequence context (the largest
// layer's Hkv x n_ctx x D values), so a sequence's page table has two pages per attention layer
// and the attention kernels read each layer as one contiguous block (KvLayer). Pages of fewer
// tokens, with the attention read walking the page table, keep this interface: take / give_back
// per page, a table per sequence.
#pragma once

#include <cstddef>
#include <vector>

#include "backend.h"

namespace luce {

class KvPagePool {
public:
    // Pages of page_bytes each, at most max_pages allocated; backend memory is allocated at a
    // page's first take and kept until the pool goes.
    KvPagePool(Backend &be, size_t page_bytes, int max_pages);
    ~KvPagePool();
    KvPagePool(const KvPagePool &) = delete;
    KvPagePool &operator=(const KvPagePool &) = delete;

    // A free page (the most recently given back first); LUCE_ERR_OUT_OF_MEMORY when all
    // max_pages are taken.
    int take();
    void give_back(int page);
    void *data(int page) const;
    size_t page_bytes() const { return page_bytes_; }
    int pages_allocated() const { return int(pages_.size()); }
    int pages_free() const { return int(free_.size()); }

private:
    Backend &be_;
    size_t page_bytes_;
    int max_pages_;
    std::vector<void *> pages_;  // by page id
    std::vector<int> free_;      // ids given back, reused last in first out
};

}  // namespace luce
