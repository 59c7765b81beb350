#include "engine/cpu/thread_pool.h"

#include <algorithm>

namespace spillway {

ThreadPool::ThreadPool(unsigned n_threads) {
    if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
    n_threads_ = n_threads;
    for (unsigned i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    start_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
}

void ThreadPool::do_share(const Task& task, unsigned index) {
    // Even contiguous shares: neighbouring rows stay on one thread (cache lines, blocks).
    const size_t begin = task.n * index / n_threads_;
    const size_t end = task.n * (index + 1) / n_threads_;
    if (begin < end) task.call(task.fn, begin, end, index);
}

void ThreadPool::run(const Task& task) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        task_ = task;
        pending_ = n_threads_ - 1;
        ++generation_;
    }
    start_cv_.notify_all();
    do_share(task, 0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
}

void ThreadPool::worker(unsigned index) {
    uint64_t seen = 0;
    for (;;) {
        Task task;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            task = task_;
        }
        do_share(task, index);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (--pending_ == 0) done_cv_.notify_one();
        }
    }
}

}  // namespace spillway
