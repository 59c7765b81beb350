#pragma once
// A small fixed thread pool for the CPU engine. parallel_for splits [0, n) into one
// contiguous range per thread and blocks until all are done. The callable is passed by
// reference (no std::function), so dispatching work never allocates: the decode loop can
// call it every step.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace spillway {

class ThreadPool {
public:
    // n_threads == 0: hardware concurrency. The calling thread is worker 0.
    explicit ThreadPool(unsigned n_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    unsigned size() const { return n_threads_; }

    // fn(begin, end, thread_index) for disjoint ranges covering [0, n).
    template <typename Fn>
    void parallel_for(size_t n, Fn&& fn) {
        if (n == 0) return;
        if (n_threads_ == 1 || n == 1) {
            fn(size_t{0}, n, 0u);
            return;
        }
        Task task{&invoke<std::remove_reference_t<Fn>>, &fn, n};
        run(task);
    }

private:
    struct Task {
        void (*call)(void* fn, size_t begin, size_t end, unsigned thread);
        void* fn;
        size_t n;
    };
    template <typename F>
    static void invoke(void* fn, size_t begin, size_t end, unsigned thread) {
        (*static_cast<F*>(fn))(begin, end, thread);
    }
    void run(const Task& task);
    void worker(unsigned index);
    void do_share(const Task& task, unsigned index);

    unsigned n_threads_ = 1;
    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::condition_variable start_cv_, done_cv_;
    Task task_{};
    uint64_t generation_ = 0;
    unsigned pending_ = 0;
    bool stop_ = false;
};

}  // namespace spillway
