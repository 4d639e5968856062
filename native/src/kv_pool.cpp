// kv_pool.cpp — the page pool of kv_pool.h.
#include "kv_pool.h"

#include "errors.h"

namespace luce {

KvPagePool::KvPagePool(Backend &be, size_t page_bytes, int max_pages)
    : be_(be), page_bytes_(page_bytes), max_pages_(max_pages) {
    if (page_bytes == 0 || max_pages < 1) fail(LUCE_ERR_INTERNAL, "KV page pool of %d pages of %zu bytes", max_pages, page_bytes);
}

KvPagePool::~KvPagePool() {
    for (void *p : pages_) be_.release(p);
}

int KvPagePool::take() {
    if (!free_.empty()) {
        const int page = free_.back();
        free_.pop_back();
        return page;
    }
    if (int(pages_.size()) >= max_pages_)
        fail(LUCE_ERR_OUT_OF_MEMORY, "the KV page pool is full (%d pages of %zu bytes)", max_pages_, page_bytes_);
    pages_.push_back(be_.alloc(page_bytes_));
    return int(pages_.size()) - 1;
}

void KvPagePool::give_back(int page) {
    if (page < 0 || page >= int(pages_.size())) fail(LUCE_ERR_INTERNAL, "KV page %d is not the pool's", page);
    free_.push_back(page);
}

void *KvPagePool::data(int page) const {
    if (page < 0 || page >= int(pages_.size())) fail(LUCE_ERR_INTERNAL, "KV page %d is not the pool's", page);
    return pages_[size_t(page)];
}

}  // namespace luce
